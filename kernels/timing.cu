// A GPU-side delay for benchmarks: spins for a number of SM clock cycles so that the work
// enqueued behind it (and the start event) is all queued before the GPU reaches it. With it,
// a timed stage measures GPU execution only, not the host's launch latency (the method of
// nvbench's blocking kernel; torch's peer uses torch.cuda._sleep the same way).
#include "cuda_check.hpp"
#include "dist_kernels.hpp"

namespace dynemb::cuda {
namespace {

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

void launch_spin(int64_t cycles, cudaStream_t s) {
  if (cycles <= 0) return;
  spin_kernel<<<1, 1, 0, s>>>(static_cast<long long>(cycles));
  CUDA_CHECK_LAUNCH();
}

}  // namespace dynemb::cuda
