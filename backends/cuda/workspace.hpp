// The CUDA backend's workspace: every device buffer its calls use, one named slot per role,
// and the pinned staging of its copies. Lifetime: the backend's. A call sizes the slots it
// uses with DeviceBuffer::resize, which reallocates only when growing, so once a call of a
// given size has run, the same call allocates nothing (no cudaMalloc, no cudaFree and its
// device-wide synchronisation). Stream-ordered reuse is safe: the backend has one stream and
// every call that hands back host data ends by downloading it, i.e. with that stream drained; what
// a call keeps (Kept: lookup(..., Place::kept), keep(), a dist with Place::kept) is left queued
// into its own slot for what reads it next on the stream. Calls on one backend must therefore not
// overlap (one thread at a time, as the engine and replay call it).
//
// The two large float slots are shared by the stages that never run at the same time, so the
// workspace holds about what the largest call needs, not the sum over stages:
//   rows_in   the output dists' input: [sum_s rows_s, D] (sequence) or [W, n] (pooled), and
//             the host side of a comparison (DeviceComparator)
//   rows_out  lookup output [N, D] / [B, sum_D] / VBE 1-D, the unsharded reference of a check,
//             and the output dists' output (unless kept: held_out below)
// The kept tensors have slots of their own, one per role (Kept::Role), so that any two of them
// can be compared where they are and none is overwritten by a step of another role.
// Shapes below: N ids, F features, `bags` lookup bags of the rank's LookupKjt.
#pragma once

#include <cstdint>
#include <vector>

#include "compare.hpp"
#include "cuda_backend.hpp"
#include "device_buffer.hpp"
#include "resolve.hpp"
#include "staging.hpp"

namespace dynemb::cuda {

struct BackendWorkspace {
  PinnedStaging staging;  // every upload and download of the backend's calls

  // bucketize(): a batch's KJTs (R ranks), without dest_rank; keeps the one-pass scratch.
  BatchedBucketize bucketize;

  // lookup() from the oracle, per id and per bag of the LookupKjt. A rank's lookup resolves its
  // ids on the device (resolve.hpp): its values go up, g and tab or valid are made there.
  DeviceBuffer<int64_t> lookup_values;    // [N] the LookupKjt's local ids
  DeviceBuffer<int64_t> lookup_feat_ids;  // [F+1] id offsets of the features
  DeviceBuffer<RowRule> lookup_rules;     // [F] the rank's row rule of each feature
  DeviceBuffer<int32_t> lookup_refused;   // [1] some id refused: the host's lookup instead
  DeviceBuffer<uint64_t> lookup_g;        // [N] unsharded row of each id
  DeviceBuffer<DeviceRows> lookup_rows;   // [F] where the feature's table rows are
  DeviceBuffer<int32_t> lookup_tab;       // [N] sequence: the id's feature, -1 when invalid
  DeviceBuffer<int64_t> lookup_bag_off;   // [bags+1] pooled: id offsets of the bags
  DeviceBuffer<int64_t> lookup_bag_out;   // [bags] pooled: first output element of the bag
  DeviceBuffer<int32_t> lookup_bag_feat;  // [bags] pooled: the bag's feature
  DeviceBuffer<int64_t> lookup_feat_dim;  // [F] pooled: the feature's dim
  DeviceBuffer<uint8_t> lookup_valid;     // [N] pooled: 1 when the id's row is looked up
  DeviceBuffer<float> lookup_weights;     // [N] pooled, weighted KJTs

  // sequence_output_dist(): the index tables (build_seq_dist_tables).
  SeqDistDevice seq_tables;

  DeviceBuffer<float> rows_in, rows_out;  // see above

  // The checks (device_comparator.hpp): what each tile adds to the diff (compare.hpp).
  DeviceBuffer<TileStatsOut> tile_stats;  // [ceil(n / tile)]
  // keep() (Kept::Role::input): rank r's tensor at r * n, so that when all W are the inputs of
  // a pooled dist it reads them in place. Grows as ranks come, keeping the slots filled.
  DeviceBuffer<float> kept;  // [W, n]
  // The output dists' outputs kept (Place::kept, Kept::Role::output): the outputs of all ranks,
  // one after the other, as rows_out would hold them; the reference of a check is made in
  // rows_out meanwhile.
  DeviceBuffer<float> held_out;
  // lookup(..., Place::kept) (Kept::Role::lookup): rank r's lookup, made here and kept for the
  // next output dist or check ([W] buffers, one rank's lookup output each).
  std::vector<DeviceBuffer<float>> kept_lookups;

  // Dense weights uploaded (EmbeddingSource::TableRows::weights): the copy of `host`, owned by
  // the source whose uid() is `owner`, kept while lookups keep asking for it and it fits the
  // backend's share of the device (CudaBackend::device_rows).
  struct DenseTable {
    uint64_t owner = 0;
    const std::vector<float>* host = nullptr;
    DeviceBuffer<float> dev;
  };
  std::vector<DenseTable> dense_tables;
};

}  // namespace dynemb::cuda
