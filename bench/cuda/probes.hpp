// Probes of `dynemb-dist bench`: kernels that measure the machine rather than do a stage's
// work (a queue-ahead delay, and the bucketize's floors). Not used by the backends.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dynemb::cuda {

// One thread spinning `cycles` SM clock cycles on stream s: work enqueued behind it is all
// queued before the GPU reaches it, so a timed stage excludes the host's launch latency (the
// method of nvbench's blocking kernel).
void launch_spin(int64_t cycles, cudaStream_t s);
// Floors of the bucketize stage: an empty kernel of blocks x threads, and blocks x 256 threads
// that only move the stage's main bytes: values[i] = ids[i], perm[i] = i for i < n (8N read,
// 16N written, no routing, no ordering).
void launch_empty(int64_t blocks, int threads, cudaStream_t s);
void launch_stream_floor(const int64_t* ids, int64_t n, int64_t* values, int64_t* perm,
                         int64_t blocks, cudaStream_t s);

}  // namespace dynemb::cuda
