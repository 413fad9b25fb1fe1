// Diagnostics of the CUDA bucketize (`bench --diagnostics`, bench/README.md): its floors and
// the one-pass kernel's step trace, as text lines.
#pragma once

#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/timer.hpp"

namespace dynemb::bench {

// An empty kernel of the stage's grid and that grid streaming the stage's main bytes.
std::string bucketize_floors(cuda::BatchedBucketize& bb, bool one_pass, CudaTimer& timer,
                             double copy_gbps, cudaStream_t s);
// One traced launch of the one-pass kernel: per step, median and slowest block; and the
// slowest block per quarter of the grid.
std::vector<std::string> one_pass_trace(cuda::BatchedBucketize& bb, cudaStream_t s);

}  // namespace dynemb::bench
