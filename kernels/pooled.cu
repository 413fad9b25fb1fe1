// Pooled path (docs/semantics.md §5, §7, §8): segment sums of table rows (the TBE lookup of one
// rank), the reduce of W partial buffers and the codec (MEAN tables are summed: the dist carries
// sums, the module divides later). Equal, unequal and VBE reduce-scatters are one kernel: in all
// three, destination r's output is chunk r of every source's buffer and the chunks are in rank
// order, so the W outputs together are the elementwise sum of the W whole partial buffers (each
// [sum_s B_s, sum_D] or 1-D VBE).
#include <algorithm>

#include "cuda_check.hpp"
#include "device_math.cuh"
#include "pooled.hpp"

namespace dynemb::cuda {
namespace {

constexpr int kThreads = 256;

// Blocks of `threads` for a grid-stride loop over `work` items: enough to cover it, at most
// `per_sm` per SM of the current device (8 x 256 threads: an sm_90 SM's 2048 resident threads).
unsigned grid_for(int64_t work, int threads, int per_sm = 8) {
  int dev = 0, sms = 132;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t need = (work + threads - 1) / threads;
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(need, int64_t{sms} * per_sm)));
}

// One warp per bag; lane d sums column d over the bag's ids in order (CPU order, no FMA).
__global__ void pooled_lookup_kernel(PooledLookupArgs a) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t j = warp; j < a.num_bags; j += nwarps) {
    const int32_t f = a.bag_feat[j];
    const int64_t D = a.feat_dim[f];
    const DeviceRows rows = a.rows[f];
    const int64_t p0 = a.bag_offsets[j], p1 = a.bag_offsets[j + 1];
    for (int64_t d = lane; d < D; d += 32) {
      float acc = 0.0f;
      for (int64_t p = p0; p < p1; ++p) {
        if (a.valid && !a.valid[p]) continue;
        const float v = d_row_value(rows, a.g[p], d);
        acc = __fadd_rn(acc, a.weights ? __fmul_rn(a.weights[p], v) : v);
      }
      a.out[a.bag_out[j] + d] = d_round_to(static_cast<int>(a.out_dtype), acc);
    }
  }
}

// Sum of W partial buffers, 16-byte vectors; 8 sources loaded before the adds (in d order).
template <bool kRound>
__global__ void __launch_bounds__(kThreads)
    reduce4_kernel(const float4* __restrict__ parts, int64_t W, int64_t stride4, int64_t n4, int rd,
                   float4* __restrict__ out) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n4;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    float4 acc = __ldcs(parts + e);
    for (int64_t d0 = 1; d0 < W; d0 += 8) {
      float4 v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (d0 + k < W) v[k] = __ldcs(parts + (d0 + k) * stride4 + e);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (d0 + k < W) {
          acc.x = __fadd_rn(acc.x, v[k].x);
          acc.y = __fadd_rn(acc.y, v[k].y);
          acc.z = __fadd_rn(acc.z, v[k].z);
          acc.w = __fadd_rn(acc.w, v[k].w);
          if (kRound) {
            acc.x = d_round_to(rd, acc.x);
            acc.y = d_round_to(rd, acc.y);
            acc.z = d_round_to(rd, acc.z);
            acc.w = d_round_to(rd, acc.w);
          }
        }
    }
    __stcs(out + e, acc);
  }
}

__global__ void reduce1_kernel(const float* __restrict__ parts, int64_t W, int64_t stride,
                               int64_t n, int rd, float* __restrict__ out) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    float acc = parts[e];
    for (int64_t d = 1; d < W; ++d) acc = d_round_to(rd, __fadd_rn(acc, parts[d * stride + e]));
    out[e] = acc;
  }
}

__global__ void codec_kernel(float* x, int64_t n, int t) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * kThreads)
    x[e] = d_codec_encode(t, x[e]);
}

}  // namespace

void launch_pooled_lookup(const PooledLookupArgs& a, cudaStream_t s) {
  if (a.num_bags <= 0) return;
  pooled_lookup_kernel<<<grid_for(a.num_bags * 32, kThreads, 16), kThreads, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

void launch_reduce(const float* parts, int64_t num_parts, int64_t stride, int64_t n,
                   Precision round_precision, float* out, cudaStream_t s) {
  const int round_dtype = static_cast<int>(round_precision);
  if (n <= 0) return;
  if (num_parts <= 0) {
    CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * n, s));
    return;
  }
  const bool vec = n % 4 == 0 && stride % 4 == 0 && reinterpret_cast<uintptr_t>(parts) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec) {
    const int64_t n4 = n / 4;
    if (round_dtype)
      reduce4_kernel<true><<<grid_for(n4, kThreads), kThreads, 0, s>>>(
          reinterpret_cast<const float4*>(parts), num_parts, stride / 4, n4, round_dtype,
          reinterpret_cast<float4*>(out));
    else
      reduce4_kernel<false><<<grid_for(n4, kThreads), kThreads, 0, s>>>(
          reinterpret_cast<const float4*>(parts), num_parts, stride / 4, n4, 0,
          reinterpret_cast<float4*>(out));
  } else {
    reduce1_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(parts, num_parts, stride, n,
                                                              round_dtype, out);
  }
  CUDA_CHECK_LAUNCH();
}

void launch_codec(float* x, int64_t n, Precision dtype, cudaStream_t s) {
  if (n <= 0 || dtype == Precision::f32) return;
  codec_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(x, n, static_cast<int>(dtype));
  CUDA_CHECK_LAUNCH();
}

}  // namespace dynemb::cuda
