// Row gathers of the sequence output dist (docs/semantics.md §6): the forward recat permute,
// the exchange between rank buffers, the unbucketize index_select and the fused one-pass
// dist. All are "out row o = codec(src row idx(o))"; only the index functor differs. Rows
// are copied with 16-byte vectors when D and every base are 16-byte aligned (D % 4 == 0),
// 8-byte when D is even, else 4-byte scalars (odd dims such as 129 and 15). A group of
// TPR threads (a power of two <= 32) copies one row; each group handles kRows rows per
// step so several independent row loads are in flight before the first store.
#include <algorithm>

#include "cuda_check.hpp"
#include "device_math.cuh"
#include "gather.hpp"

namespace dynemb::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRows = 4;  // rows in flight per group (8 for 16- and 32-byte rows)

template <int VB>
struct Vec;
template <>
struct Vec<16> {
  using T = float4;
};
template <>
struct Vec<8> {
  using T = float2;
};
template <>
struct Vec<4> {
  using T = float;
};

__device__ __forceinline__ float4 codec4(int c, float4 v) {
  return make_float4(d_codec_encode(c, v.x), d_codec_encode(c, v.y), d_codec_encode(c, v.z),
                     d_codec_encode(c, v.w));
}
__device__ __forceinline__ float2 codec4(int c, float2 v) {
  return make_float2(d_codec_encode(c, v.x), d_codec_encode(c, v.y));
}
__device__ __forceinline__ float codec4(int c, float v) {
  return d_codec_encode(c, v);
}

// out[o, :] = codec(src[idx(o), :]) for o in [0, nrows). idx(o) returns a global row of src.
// A warp takes 32*R consecutive output rows per step. First every lane computes the source
// row of R of them (32*R independent index computations in flight: the fused dist's chain
// perm -> splits -> recat segments is several dependent loads long), then each group of
// TPR lanes copies its rows, R rows in flight, fetching their source row from the owning
// lane with a shuffle. Row (k, group gi, lane l) = step base + k*32 + gi*TPR + l, so with
// TPR = 1 (16-byte rows) every load and store instruction of the warp is contiguous.
template <int VB, int TPR, int R, class Idx>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(const float* __restrict__ src, float* __restrict__ out, int64_t nrows,
                  int64_t dim, int codec, Idx idx) {
  using V = typename Vec<VB>::T;
  constexpr int kElems = VB / 4;
  constexpr int kWarpRows = 32 * R;
  const int64_t nvec = dim / kElems;
  const int lane = threadIdx.x % TPR;
  const int gi = (threadIdx.x % 32) / TPR;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * kThreads / 32;
  for (int64_t ow = warp * kWarpRows; ow < nrows; ow += nwarps * kWarpRows) {
    const int64_t base = ow + gi * TPR;
    int64_t mine[R];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int64_t o = base + k * 32 + lane;
      mine[k] = o < nrows ? idx(o) : -1;
    }
#pragma unroll 1
    for (int r0 = 0; r0 < R * TPR; r0 += R) {
      int64_t s[R];
      int64_t o[R];
#pragma unroll
      for (int u = 0; u < R; ++u) {
        const int rr = r0 + u, k = rr / TPR;
        int64_t m = mine[0];  // mine[k] without a run-time register index (no local memory)
#pragma unroll
        for (int kk = 1; kk < R; ++kk) m = k == kk ? mine[kk] : m;
        s[u] = __shfl_sync(0xffffffffu, m, rr % TPR, TPR);
        o[u] = base + k * 32 + rr % TPR;
      }
      for (int64_t v = lane; v < nvec; v += TPR) {
        V x[R];
#pragma unroll
        for (int u = 0; u < R; ++u)
          if (s[u] >= 0) x[u] = __ldg(reinterpret_cast<const V*>(src + s[u] * dim) + v);
#pragma unroll
        for (int u = 0; u < R; ++u)
          if (s[u] >= 0) {
            if (codec) x[u] = codec4(codec, x[u]);
            reinterpret_cast<V*>(out + o[u] * dim)[v] = x[u];
          }
      }
    }
  }
}

struct PermIdx {  // unbucketize index_select with global row numbers
  const int64_t* rowidx;
  __device__ int64_t operator()(int64_t o) const { return rowidx[o]; }
};

// Row q of owner r's send buffer -> global local_embs row (forward recat, by segments).
__device__ __forceinline__ int64_t recat_src(const SeqDistArgs& a, int64_t r, int64_t q) {
  const int64_t b0 = a.seg_base[r];
  const int64_t k = d_upper_bound_m1(a.seg_out_off + b0, a.seg_base[r + 1] - b0, q);
  return a.local_row_off[r] + a.seg_src[b0 + k] + (q - a.seg_out_off[b0 + k]);
}

// Row p of dest s's receive buffer -> (owner r, row q of r's send buffer).
__device__ __forceinline__ void exchange_src(const SeqDistArgs& a, int64_t s, int64_t p, int64_t* r,
                                             int64_t* q) {
  const int64_t W = a.world_size;
  const int64_t* ro = a.recv_off + s * (W + 1);
  *r = d_upper_bound_m1(ro, W, p);
  *q = p - ro[*r] + a.send_off[*r * (W + 1) + s];
}

struct RecatIdx {
  SeqDistArgs a;
  __device__ int64_t operator()(int64_t o) const {
    const int64_t r = d_upper_bound_m1(a.local_row_off, a.world_size, o);
    return recat_src(a, r, o - a.local_row_off[r]);
  }
};

struct ExchangeIdx {  // source = the send buffers, laid out like local
  SeqDistArgs a;
  __device__ int64_t operator()(int64_t o) const {
    const int64_t s = d_upper_bound_m1(a.out_row_off, a.world_size, o);
    int64_t r, q;
    exchange_src(a, s, o - a.out_row_off[s], &r, &q);
    return a.local_row_off[r] + q;
  }
};

struct FusedIdx {  // perm, then exchange, then recat: straight to the owner's local_embs
  SeqDistArgs a;
  __device__ int64_t operator()(int64_t o) const {
    const int64_t s = d_upper_bound_m1(a.out_row_off, a.world_size, o);
    int64_t r, q;
    exchange_src(a, s, a.perm[o], &r, &q);
    return recat_src(a, r, q);
  }
};

template <int VB, class Idx>
void launch_vb(const float* src, float* out, int64_t nrows, int64_t dim, int codec, Idx idx,
               cudaStream_t s) {
  const int64_t nvec = dim / (VB / 4);
  int tpr = 1;
  while (tpr < 32 && tpr < nvec) tpr *= 2;
  int dev = 0, sms = 132;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t warps_needed = (nrows + 32 * kRows - 1) / (32 * kRows);
  const int64_t blocks_needed = (warps_needed * 32 + kThreads - 1) / kThreads;
  // Persistent-ish grid: 8 blocks of 256 per SM, the 2048 resident threads of an sm_90 SM.
  const unsigned blocks = static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(blocks_needed, static_cast<int64_t>(sms) * 8)));
  switch (tpr) {
#define DYNEMB_TPR(T)                                                   \
  case T:                                                               \
    gather_kernel<VB, T, (T <= 2 ? 8 : 4), Idx>                         \
        <<<blocks, kThreads, 0, s>>>(src, out, nrows, dim, codec, idx); \
    break;
    DYNEMB_TPR(1) DYNEMB_TPR(2) DYNEMB_TPR(4) DYNEMB_TPR(8) DYNEMB_TPR(16) DYNEMB_TPR(32)
#undef DYNEMB_TPR
  }
  CUDA_CHECK_LAUNCH();
}

bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <class Idx>
void launch_any(const float* src, float* out, int64_t nrows, int64_t dim, int codec, Idx idx,
                cudaStream_t s) {
  if (nrows <= 0 || dim <= 0) return;
  if (dim % 4 == 0 && aligned(src, 16) && aligned(out, 16))
    launch_vb<16>(src, out, nrows, dim, codec, idx, s);
  else if (dim % 2 == 0 && aligned(src, 8) && aligned(out, 8))
    launch_vb<8>(src, out, nrows, dim, codec, idx, s);
  else
    launch_vb<4>(src, out, nrows, dim, codec, idx, s);
}

__global__ void lookup_rows_kernel(const uint64_t* g, const int32_t* feat, const DeviceRows* rows,
                                   int64_t n, int64_t dim, float* out) {
  const int64_t total = n * dim;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = e / dim;
    const int32_t f = feat[k];  // < 0: no row (empty shard under warn_zero_row / ignore)
    out[e] = f < 0 ? 0.0f : d_row_value(rows[f], g[k], e - k * dim);
  }
}

}  // namespace

void launch_gather_rows(const float* src, const int64_t* rowidx, int64_t nrows, int64_t dim,
                        float* out, cudaStream_t s) {
  launch_any(src, out, nrows, dim, 0, PermIdx{rowidx}, s);
}

void launch_seq_fused(const SeqDistArgs& a, float* out, cudaStream_t s) {
  launch_any(a.local, out, a.total_out_rows, a.dim, static_cast<int>(a.codec), FusedIdx{a}, s);
}

void launch_seq_recat(const SeqDistArgs& a, float* send, cudaStream_t s) {
  launch_any(a.local, send, a.total_local_rows, a.dim, 0, RecatIdx{a}, s);
}

void launch_seq_exchange(const SeqDistArgs& a, const float* send, float* recv, cudaStream_t s) {
  launch_any(send, recv, a.total_out_rows, a.dim, static_cast<int>(a.codec), ExchangeIdx{a}, s);
}

void launch_lookup_rows(const uint64_t* g, const int32_t* feat, const DeviceRows* rows, int64_t n,
                        int64_t dim, float* out, cudaStream_t s) {
  if (n <= 0 || dim <= 0) return;
  const int64_t total = n * dim;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 132 * 16));
  lookup_rows_kernel<<<blocks, kThreads, 0, s>>>(g, feat, rows, n, dim, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dynemb::cuda
