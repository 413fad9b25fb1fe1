// Launch wrappers of the output-dist kernels (gather.cu, pooled.cu); the bucketize has its own
// header (bucketize.hpp), the bench probes theirs (probes.hpp). Plain C++ so host code
// (backends/, bench/, tests) can call them; every pointer is a device pointer, every size
// int64. All W ranks of a batch live on one GPU: "rank buffers" are row ranges of one
// concatenated buffer, described by prefix-offset arrays [W+1].
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dynemb::cuda {

// Precision of a kernel's rounding or codec: the values of lib/common's DType (f32 = no
// rounding, no codec).
enum class Precision : int32_t { f32 = 0, f16 = 1, bf16 = 2 };

// ------------------------------------------ sequence output dist (docs/semantics.md §6)
// Per owner rank r: local_embs rows [local_row_off[r], local_row_off[r+1]) in (f, s, b)
// order, and the forward recat as K_r segments: send-buffer segment k starts at send row
// seg_out_off[seg_base[r]+k] and copies local rows from seg_src[seg_base[r]+k] on (rank-
// local). Per destination rank s: output rows [out_row_off[s], out_row_off[s+1]).
struct SeqDistArgs {
  int64_t world_size = 1;
  int64_t dim = 0;                         // D
  Precision codec = Precision::f32;        // encode+decode around the exchange (f32: none)
  int64_t total_local_rows = 0;            // sum_r N_local_r (= rows of every send buffer together)
  int64_t total_out_rows = 0;              // sum_s N_s (= rows of every recv / output buffer)
  const float* local = nullptr;            // [sum_r N_local_r, D]
  const int64_t* local_row_off = nullptr;  // [W+1]
  const int64_t* out_row_off = nullptr;    // [W+1]
  const int64_t* perm = nullptr;           // [sum_s N_s] unbucketize_permute, rank-local
  const int64_t* recv_off = nullptr;       // [W*(W+1)] dest s: prefix of input_splits_s
  const int64_t* send_off = nullptr;       // [W*(W+1)] owner r: prefix of output_splits_r
  const int64_t* seg_base = nullptr;       // [W+1]
  const int64_t* seg_out_off = nullptr;    // [sum K_r]
  const int64_t* seg_src = nullptr;        // [sum K_r]
};
// One pass: out[o] = codec(local[src(o)]) with src from perm + splits + recat.
void launch_seq_fused(const SeqDistArgs& a, float* out, cudaStream_t s);
// The three unfused steps (what TorchRec runs, each a full pass over the rows):
// send (rows laid out like local) <- recat permute of local
void launch_seq_recat(const SeqDistArgs& a, float* send, cudaStream_t s);
// recv (rows laid out like out) <- all-to-all of send (codec applied here)
void launch_seq_exchange(const SeqDistArgs& a, const float* send, float* recv, cudaStream_t s);
// out[o] = src[rowidx[o]] (the unbucketize index_select; rowidx global row numbers).
void launch_gather_rows(const float* src, const int64_t* rowidx, int64_t nrows, int64_t dim,
                        float* out, cudaStream_t s);

// Where the rows of a feature's table come from on the device (EmbeddingSource::TableRows,
// resolved by the backend): column c of row g is dense[g * stride + col0 + c] when `dense` is set
// (the table's weights, uploaded; the host has checked g against their rows), else column
// col0 + c of the hash64 oracle row of `seed` (oracle_table_seed of the source's table). col0 > 0
// for a column slice of the table.
struct DeviceRows {
  const float* dense = nullptr;
  uint64_t seed = 0;
  int64_t stride = 0;
  int64_t col0 = 0;
};

// Sequence lookup rows: out[k, c] = column c of row g[k] of rows[feat[k]], [n, D]; 0 where
// feat[k] < 0 (no row: an empty shard under warn_zero_row / ignore).
void launch_lookup_rows(const uint64_t* g, const int32_t* feat, const DeviceRows* rows, int64_t n,
                        int64_t dim, float* out, cudaStream_t s);

// ------------------------------------------------ pooled (docs/semantics.md §5, §7)
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
