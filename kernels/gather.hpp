// Launch wrappers of the row gathers (gather.cu): the sequence output dist (recat, exchange,
// unbucketize, and the three fused) and the sequence lookup. Plain C++ so host code
// (backends/, bench/, tests) can call them; every pointer is a device pointer, every size
// int64. All W ranks of a batch live on one GPU: "rank buffers" are row ranges of one
// concatenated buffer, described by prefix-offset arrays [W+1].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device_rows.hpp"

namespace dynemb::cuda {

// Sequence output dist (docs/semantics.md §6).
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

// Sequence lookup rows: out[k, c] = column c of row g[k] of rows[feat[k]], [n, D]; 0 where
// feat[k] < 0 (no row: an empty shard under warn_zero_row / ignore).
void launch_lookup_rows(const uint64_t* g, const int32_t* feat, const DeviceRows* rows, int64_t n,
                        int64_t dim, float* out, cudaStream_t s);

}  // namespace dynemb::cuda
