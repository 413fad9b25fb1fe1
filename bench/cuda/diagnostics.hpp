// Diagnostics of the CUDA bucketize (`bench --diagnostics`, bench/README.md): its floors and
// the step trace of the cooperative kernels (the one-pass kernel, the partition's one launch),
// as text lines.
#pragma once

#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/timer.hpp"

namespace dynemb::bench {

// An empty kernel of the stage's grid and that grid streaming the stage's main bytes.
std::string bucketize_floors(cuda::BatchedBucketize& bb, bool one_pass, CudaTimer& timer,
                             double copy_gbps, cudaStream_t s);
// One traced launch of the path `c` names, when it is one of the cooperative kernels: per step,
// the median and slowest block's stamp and duration; and the slowest block per quarter of the
// grid. Nothing for the other paths.
std::vector<std::string> step_trace(cuda::BatchedBucketize& bb, const cuda::BucketizeChoice& c,
                                    cudaStream_t s);

}  // namespace dynemb::bench
