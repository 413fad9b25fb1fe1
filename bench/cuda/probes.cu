// A GPU-side delay for benchmarks: spins for a number of SM clock cycles so that the work
// enqueued behind it (and the start event) is all queued before the GPU reaches it. With it,
// a timed stage measures GPU execution only, not the host's launch latency (the method of
// nvbench's blocking kernel; torch's peer uses torch.cuda._sleep the same way).
// Also the bucketize's floors for `bench`: what a kernel of the same grid costs when it does
// nothing, and when it only streams the stage's bytes.
#include "cuda/probes.hpp"
#include "cuda_check.hpp"

namespace dynemb::cuda {
namespace {

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void empty_kernel() {}

// Each thread loads its kFloorBatch ids (strided by the grid) before storing any, as the
// bucketize keeps a bag's ids in flight.
constexpr int kFloorBatch = 8;
__global__ void stream_floor_kernel(const int64_t* ids, int64_t n, int64_t* values, int64_t* perm) {
  const int64_t T = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i0 < n;
       i0 += kFloorBatch * T) {
    int64_t v[kFloorBatch];
#pragma unroll
    for (int k = 0; k < kFloorBatch; ++k) v[k] = i0 + k * T < n ? ids[i0 + k * T] : 0;
#pragma unroll
    for (int k = 0; k < kFloorBatch; ++k) {
      const int64_t i = i0 + k * T;
      if (i < n) {
        values[i] = v[k];
        perm[i] = i;
      }
    }
  }
}

}  // namespace

void launch_empty(int64_t blocks, int threads, cudaStream_t s) {
  if (blocks <= 0) return;
  empty_kernel<<<static_cast<unsigned>(blocks), threads, 0, s>>>();
  CUDA_CHECK_LAUNCH();
}

void launch_stream_floor(const int64_t* ids, int64_t n, int64_t* values, int64_t* perm,
                         int64_t blocks, cudaStream_t s) {
  if (blocks <= 0 || n <= 0) return;
  stream_floor_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(ids, n, values, perm);
  CUDA_CHECK_LAUNCH();
}

void launch_spin(int64_t cycles, cudaStream_t s) {
  if (cycles <= 0) return;
  spin_kernel<<<1, 1, 0, s>>>(static_cast<long long>(cycles));
  CUDA_CHECK_LAUNCH();
}

}  // namespace dynemb::cuda
