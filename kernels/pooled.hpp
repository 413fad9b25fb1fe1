// Launch wrappers of the pooled path (pooled.cu): the segment sums of table rows, the reduce of
// W partial buffers and the codec. Plain C++ so host code (backends/, bench/, tests) can call
// them; every pointer is a device pointer, every size int64.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device_rows.hpp"

namespace dynemb::cuda {

// Pooled lookup (docs/semantics.md §5, §7).
// Segment sums of table rows: bag j (ids [bag_offsets[j], bag_offsets[j+1])) of feature
// bag_feat[j] writes D_f sums at out[bag_out[j] ...]; fp32 in id order, acc += w*v without
// FMA, then rounded to out_dtype (the TBE output cast).
struct PooledLookupArgs {
  int64_t num_bags = 0;
  const int64_t* bag_offsets = nullptr;  // [num_bags+1]
  const int64_t* bag_out = nullptr;      // [num_bags] element offset of the bag's output run
  const int32_t* bag_feat = nullptr;     // [num_bags]
  const uint64_t* g = nullptr;           // [N] unsharded row per id
  const uint8_t* valid = nullptr;        // [N] 0: skip the id (out of bounds, empty shard)
  const float* weights = nullptr;        // [N] or null
  const int64_t* feat_dim = nullptr;     // [F]
  const DeviceRows* rows = nullptr;      // [F] the rows of the feature's table
  Precision out_dtype = Precision::f32;
  float* out = nullptr;
};
void launch_pooled_lookup(const PooledLookupArgs& a, cudaStream_t s);

// out[e] = sum_{d<W} parts[d*stride + e], in d order; with `round_dtype` != 0 the sum is
// rounded to fp16/bf16 after every add (a low-precision reduce-scatter). n elements.
void launch_reduce(const float* parts, int64_t num_parts, int64_t stride, int64_t n,
                   Precision round_dtype, float* out, cudaStream_t s);
// Elementwise codec encode (clamp + round) in place: the encode-decode around a collective.
void launch_codec(float* x, int64_t n, Precision dtype, cudaStream_t s);

}  // namespace dynemb::cuda
