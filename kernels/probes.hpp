// Probes for `dynemb-dist bench` (bench/): kernels that measure the machine rather than do the
// stage's work, and the one-pass bucketize's step trace. Not used by the backends.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "bucketize.hpp"

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

// launch_bucketize, recording in trace [kBucketizeTracePoints x blocks] the %globaltimer (ns)
// of each block at the end of each step. The one-pass kernel (a block per bag): 0 start, 1 bag
// offsets, 2 counts published, 3 rank's counts seen, 4 bases, 5 placed. The partition's one
// launch (a block per tile, R x tiles_per_rank): 0 start, 1 bag offsets, 2 counts published,
// 3 first chunk ranked (W <= 16, tiles of one chunk: also the cells and new_lengths), 4 rank's
// counts seen, 5 placed. Untouched when the launch takes another path.
constexpr int kBucketizeTracePoints = 6;
void launch_bucketize_traced(const BucketizeArgs& a, const int64_t* lengths, BucketizeOnePass& ws,
                             unsigned long long* trace, cudaStream_t s);

}  // namespace dynemb::cuda
