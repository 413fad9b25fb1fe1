// Data model of one batch of the RW data path (docs/semantics.md §1, §3, §4.4, §5).
// Names follow TorchRec: a reader who knows TorchRec should recognise every field.
//
// Ids and lengths are held as int64 whatever their dtype on disk; `values_type` /
// `lengths_type` remember it, because routing uses the unsigned value *of the index dtype*
// (u64(id) for int64, u32(id) for int32, docs/semantics.md §0 and §10.2).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.hpp"

namespace dynemb {

// What the module's MEAN pooling divides a bag's sum by (docs/mean-pooling.md): the bag's id
// count, or the sum of its ids' weights. TorchRec takes the weights when the module's own input
// KJT is weighted; a feature-processed EBC's input is not, though its lookup gets weights.
enum class MeanDivisor : uint8_t { count, weights };

// One rank's local KJT for this sharding, before the input dist (§1).
struct Kjt {
  int64_t num_features = 0;      // F
  std::vector<int64_t> lengths;  // [F*B] key-major (lengths[f*B + b]); VBE: [sum_f B_f]
  std::vector<int64_t> values;   // [N] ids, all features concatenated
  std::vector<float> weights;    // [N] when `weighted`, else empty
  bool weighted = false;
  // VBE (variable batch per feature): B_f for every feature. Empty when not VBE.
  std::vector<int64_t> stride_per_feature;
  // [F] as captured (`mean_divisor`); empty: `weights` for every feature of a weighted KJT,
  // else `count`.
  std::vector<MeanDivisor> mean_divisor;
  IndexType lengths_type = IndexType::i64;
  IndexType values_type = IndexType::i64;

  bool is_vbe() const { return !stride_per_feature.empty(); }
  // B (non-VBE); for VBE the max over features (what EC pads to).
  int64_t stride() const;
  // Batch size of feature f (B, or B_f for VBE).
  int64_t batch_size(int64_t f) const;
  // First bag index of feature f in `lengths` (f*B, or sum_{f'<f} B_f').
  int64_t bag_begin(int64_t f) const;
  int64_t num_bags() const { return static_cast<int64_t>(lengths.size()); }
  int64_t num_ids() const { return static_cast<int64_t>(values.size()); }
  // length_per_key[f]: ids of feature f.
  std::vector<int64_t> length_per_key() const;
  // Complete cumsum of lengths, [num_bags + 1], offsets[0] = 0.
  std::vector<int64_t> offsets() const;
};

// Output of block_bucketize_sparse_features for one rank (§3.3). L = num input bags.
struct BucketizedKjt {
  std::vector<int64_t> new_lengths;          // [W*L], bucket (dest rank) major
  std::vector<int64_t> new_values;           // [N] local ids, bucketized order
  std::vector<float> new_weights;            // [N] when the input is weighted
  std::vector<int64_t> unbucketize_permute;  // [N]: original position -> bucketized position
  std::vector<int64_t> dest_rank;            // [N] per original id: where it was routed
};

// What rank r holds after the KJT all-to-all + recat (§4.3): the lookup's input.
struct LookupKjt {
  int64_t num_features = 0;
  int64_t world_size = 0;
  // [F][W]: batch size of feature f from source rank s (= B_s when not VBE).
  std::vector<std::vector<int64_t>> stride_per_key_per_rank;
  std::vector<int64_t> lengths;  // (f, s, b) order
  std::vector<int64_t> values;   // local ids, same order
  std::vector<float> weights;    // when weighted
  // Pooled VBE (the KJTAllToAll ran with strides): the lookup returns the 1-D [s][f][b][d]
  // layout instead of [sum_s B_s, sum_D].
  bool variable_batch = false;
};

// The sharding context of rank r (§4.4), TorchRec's field names. A captured context may
// lack any field, hence optionals; a derived context sets every field its module uses.
struct ShardingContext {
  std::optional<std::vector<int64_t>> input_splits;         // [W] ids this rank sent to each rank
  std::optional<std::vector<int64_t>> output_splits;        // [W] ids received from each rank
  std::optional<std::vector<int64_t>> batch_size_per_rank;  // [W] B_s; absent when VBE
  // [W][F]: B_{s,f}; VBE only (transpose of stride_per_key_per_rank).
  std::optional<std::vector<std::vector<int64_t>>> batch_size_per_rank_per_feature;
  // [F*W] recat[f*W+s] = s*F+f, or expanded per bag when the B_s differ (§4.3).
  std::optional<std::vector<int32_t>> sparse_features_recat;
  std::optional<std::vector<int64_t>> unbucketize_permute;  // [N_r], sequence only
  // [F, sum_s B_s] row-major, (f, s, b) order; sequence only.
  std::optional<std::vector<int64_t>> lengths_after_input_dist;
  int64_t lengths_after_input_dist_cols = 0;  // sum_s B_s
  std::optional<bool> variable_batch_per_feature;
  std::optional<std::vector<int64_t>> batch_size_per_feature_pre_a2a;  // [F], pooled only
};

// A dense float tensor whose values are exactly representable in `dtype` (see dtype.hpp).
//   sequence local_embs [sum_s output_splits[s], D], output [N_r, D]
//   pooled   local_embs [sum_s B_s, sum_D],          output [B_r, sum_D]
//   pooled VBE: 1-D [sum_s sum_f B_{s,f} D_f] / [sum_f B_{r,f} D_f]
// Elements of a tensor of this shape (0 for no shape).
inline int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return shape.empty() ? 0 : n;
}

struct EmbTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<float> data;

  int64_t numel() const { return shape_numel(shape); }
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? 1 : shape[1]; }
  static EmbTensor zeros(DType t, std::vector<int64_t> shape_) {
    EmbTensor e;
    e.dtype = t;
    e.shape = std::move(shape_);
    e.data.assign(static_cast<size_t>(e.numel()), 0.0f);
    return e;
  }
};

// Everything known about one rank in one batch: the input and what the capture holds.
struct RankBatch {
  Kjt kjt;
  std::optional<ShardingContext> ctx;   // as captured (ctx/ group)
  std::optional<EmbTensor> local_embs;  // as captured
  std::optional<EmbTensor> output;      // golden, as captured: the dist's result (MEAN: sums)
  // The KJT keys as the input dist saw them (the sharding's feature order), when captured.
  std::optional<std::vector<std::string>> keys;
  // Pooled: the module's final output, after the mean-pooling step (mean_pooling.hpp):
  // [B_r, sum_D], or [B_full, sum_D] for a VBE KJT (expanded by `inverse_indices`).
  std::optional<EmbTensor> module_output;
  // Pooled VBE: [F * B_full] row-major, the module input KJT's inverse indices per feature.
  std::optional<std::vector<int64_t>> inverse_indices;
};

struct Batch {
  int64_t index = 0;
  std::vector<RankBatch> ranks;  // [W]
};

}  // namespace dynemb
