// The tile statistics of compare.hpp: one block per tile (grid-stride over tiles), each thread a
// strided share of the tile's pairs (16-byte vectors where the tile is aligned), reduced over the
// block with warp shuffles. Memory bound: a pair with equal bits costs its loads and a compare;
// only a pair that differs runs the double-precision arithmetic.
#include <algorithm>

#include "compare.hpp"
#include "cuda_check.hpp"

namespace dynemb::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// engine/tolerance.cpp's ordered(): float bits on a line where adjacent floats are adjacent.
__device__ __forceinline__ long long ordered(float f) {
  const uint32_t u = __float_as_uint(f);
  const long long mag = static_cast<long long>(u & 0x7fffffffu);
  return (u & 0x80000000u) ? -mag : mag;
}

struct Acc {
  long long mismatches = 0;
  double max_abs = 0, max_rel = 0;
  long long max_ulp = 0;
};

// engine/tile_diff.hpp's add_pair and Tolerance::accepts, operation for operation. The explicit
// _rn intrinsics keep nvcc from contracting a multiply and an add into an FMA, which would round
// differently from the host.
__device__ __forceinline__ void add_pair(Acc& a, float g, float w, const ToleranceArgs& tol) {
  if (__float_as_uint(g) == __float_as_uint(w)) return;  // equal bits add nothing
  const bool gn = isnan(g), wn = isnan(w);
  double diff = 0;
  if (!gn && !wn) {
    diff = fabs(__dsub_rn(static_cast<double>(g), static_cast<double>(w)));
    if (isfinite(diff)) {
      a.max_abs = diff > a.max_abs ? diff : a.max_abs;
      if (w != 0) {
        const double rel = __ddiv_rn(diff, fabs(static_cast<double>(w)));
        a.max_rel = rel > a.max_rel ? rel : a.max_rel;
      }
      const long long d = ordered(g) - ordered(w);
      const long long u = d < 0 ? -d : d;
      a.max_ulp = u > a.max_ulp ? u : a.max_ulp;
    }
  }
  bool accept = false;
  if (gn || wn) {
    accept = gn && wn;
  } else if (g == w) {
    accept = true;  // +0 and -0
  } else if (isinf(g) || isinf(w)) {
    accept = false;
  } else if (tol.kind == ToleranceArgs::ulp) {
    const long long d = ordered(g) - ordered(w);
    accept = (d < 0 ? -d : d) <= tol.ulps;
  } else if (tol.kind == ToleranceArgs::rel) {
    accept = diff <= __dadd_rn(tol.atol, __dmul_rn(tol.rtol, fabs(static_cast<double>(w))));
  }
  if (!accept) ++a.mismatches;
}

__device__ __forceinline__ void merge(Acc& a, const Acc& b) {
  a.mismatches += b.mismatches;
  a.max_abs = b.max_abs > a.max_abs ? b.max_abs : a.max_abs;
  a.max_rel = b.max_rel > a.max_rel ? b.max_rel : a.max_rel;
  a.max_ulp = b.max_ulp > a.max_ulp ? b.max_ulp : a.max_ulp;
}

__device__ __forceinline__ Acc shfl_down(const Acc& a, int by) {
  Acc b;
  b.mismatches = __shfl_down_sync(0xffffffffu, a.mismatches, by);
  b.max_abs = __shfl_down_sync(0xffffffffu, a.max_abs, by);
  b.max_rel = __shfl_down_sync(0xffffffffu, a.max_rel, by);
  b.max_ulp = __shfl_down_sync(0xffffffffu, a.max_ulp, by);
  return b;
}

// Tiles t = blockIdx.x, + gridDim.x, ...; `vec`: got and want are 16-byte aligned and tile is a
// multiple of 4, so every tile starts on a vector.
__global__ void tile_stats_kernel(const float* got, const float* want, int64_t n, int64_t tile,
                                  ToleranceArgs tol, bool vec, TileStatsOut* out) {
  __shared__ Acc warp_acc[kWarps];
  const int64_t tiles = (n + tile - 1) / tile;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t e0 = t * tile, e1 = min(n, e0 + tile);
    Acc a;
    int64_t scalar0 = e0;
    if (vec) {
      const int64_t v0 = e0 / 4, v1 = e1 / 4;  // whole vectors of the tile
      const auto* g4 = reinterpret_cast<const float4*>(got);
      const auto* w4 = reinterpret_cast<const float4*>(want);
      for (int64_t v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
        const float4 x = g4[v], y = w4[v];
        add_pair(a, x.x, y.x, tol);
        add_pair(a, x.y, y.y, tol);
        add_pair(a, x.z, y.z, tol);
        add_pair(a, x.w, y.w, tol);
      }
      scalar0 = 4 * v1;
    }
    for (int64_t i = scalar0 + threadIdx.x; i < e1; i += blockDim.x)
      add_pair(a, got[i], want[i], tol);
    for (int by = 16; by > 0; by /= 2) merge(a, shfl_down(a, by));
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) warp_acc[warp] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 1; k < kWarps; ++k) merge(a, warp_acc[k]);
      out[t] = {a.mismatches, a.max_abs, a.max_rel, a.max_ulp};
    }
    __syncthreads();  // warp_acc is rewritten for the next tile
  }
}

}  // namespace

void launch_tile_stats(const float* got, const float* want, int64_t n, int64_t tile,
                       const ToleranceArgs& tol, TileStatsOut* out, cudaStream_t s) {
  if (n <= 0) return;
  tile = std::max<int64_t>(1, tile);
  const int64_t tiles = (n + tile - 1) / tile;
  const bool vec = tile % 4 == 0 && reinterpret_cast<uintptr_t>(got) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(want) % 16 == 0;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tiles, int64_t(1) << 20));
  tile_stats_kernel<<<blocks, kThreads, 0, s>>>(got, want, n, tile, tol, vec, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dynemb::cuda
