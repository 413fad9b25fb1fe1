// The tile comparison of compare.hpp: a grid-stride pass over both tensors as 32-bit words
// (16-byte vectors where both are aligned), memory bound. A differing tile is flagged by every
// thread that sees a difference in it: the writes all store 1, so their order does not matter.
#include <algorithm>

#include "compare.hpp"
#include "cuda_check.hpp"

namespace dynemb::cuda {
namespace {

constexpr int kThreads = 256;

// Words [first, n): one word per step.
__global__ void differing_words_kernel(const uint32_t* a, const uint32_t* b, int64_t first,
                                       int64_t n, int64_t tile, uint8_t* differs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = first + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    if (a[i] != b[i]) differs[i / tile] = 1;
}

// Words [0, 4 * n4): four words per step; a vector may straddle two tiles when tile % 4 != 0.
__global__ void differing_vectors_kernel(const uint4* a, const uint4* b, int64_t n4, int64_t tile,
                                         uint8_t* differs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < n4;
       v += stride) {
    const uint4 x = a[v], y = b[v];
    if (x.x == y.x && x.y == y.y && x.z == y.z && x.w == y.w) continue;
    const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
    for (int k = 0; k < 4; ++k)
      if (xs[k] != ys[k]) differs[(4 * v + k) / tile] = 1;
  }
}

}  // namespace

void launch_differing_tiles(const float* a, const float* b, int64_t n, int64_t tile,
                            uint8_t* differs, cudaStream_t s) {
  if (n <= 0) return;
  tile = std::max<int64_t>(1, tile);
  const auto* wa = reinterpret_cast<const uint32_t*>(a);
  const auto* wb = reinterpret_cast<const uint32_t*>(b);
  const bool aligned =
      reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
  int64_t head = 0;  // words done as vectors
  if (aligned && n >= 4) {
    const int64_t n4 = n / 4;
    differing_vectors_kernel<<<grid_for(n4, kThreads), kThreads, 0, s>>>(
        reinterpret_cast<const uint4*>(a), reinterpret_cast<const uint4*>(b), n4, tile, differs);
    CUDA_CHECK_LAUNCH();
    head = 4 * n4;
  }
  if (head < n) {  // the last n % 4 words, or every word of unaligned tensors
    differing_words_kernel<<<grid_for(n - head, kThreads), kThreads, 0, s>>>(wa, wb, head, n, tile,
                                                                             differs);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace dynemb::cuda
