// CPU reference versions of the FBGEMM / TorchRec ops of the RW data path, one function per
// op and named after it (docs/semantics.md §3, §4, §10.2). Each is testable on its own; the
// CPU backend and the context derivation are built from them.
//
// Ops throw dynemb::Error on inputs they cannot process (a permute index out of range, sizes
// that do not add up); the output dists turn that into OutputDistFailure naming rank + field.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/dtype.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// u64(x) of §0 for the index dtype: int32 ids are reinterpreted as uint32.
inline uint64_t index_unsigned(int64_t id, IndexType t) {
  return t == IndexType::i32 ? static_cast<uint64_t>(static_cast<uint32_t>(id))
                             : static_cast<uint64_t>(id);
}
// A value computed in the unsigned index type, stored back into the signed index dtype
// (int32 results are sign-extended into our int64 holders, as an int32 tensor would hold).
inline int64_t index_store(uint64_t v, IndexType t) {
  return t == IndexType::i32 ? static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(v)))
                             : static_cast<int64_t>(v);
}

struct Route {
  int64_t dest = 0;   // destination rank p
  int64_t local = 0;  // id written into the bucketized KJT (index dtype value)
};

// §3.2 / §10.2: the routing of one id of a feature with block size `blk`, for `W` ranks.
// continuous: x < blk*W ? (x/blk, x%blk) : (x%W, x/W); roundrobin: (x%W, id);
// hash_roundrobin: (u(fmix64(x)) % W, id), u = the unsigned index type.
Route route_id(DistType dist, int64_t id, IndexType t, int64_t blk, int64_t W);

// §3.6 block_bucketize_pos variant: pos = [o_0=0, o_1, ..., o_{W-1}, total]. With
// lb = upper_bound(pos, x) - 1 (empty shards repeat an offset and are skipped): lb < W ?
// (lb, x - pos[lb]) : (x % W, x / W), x the unsigned id (negative ids are past total).
Route route_block_bucketize_pos(const std::vector<int64_t>& pos, int64_t id, IndexType t,
                                int64_t W);

// The routing of one id of feature `fi` as the plan's input dist routes it: by its
// bucketize_pos when it has one (an inference plan's uneven shards), else route_id. The one
// routing rule of the engine: bucketize, the unsharded reference and the load model use it.
inline Route route_feature(const FeatureInfo& fi, int64_t id, IndexType t, int64_t W) {
  return fi.bucketize_pos.empty() ? route_id(fi.dist_type, id, t, fi.block_size, W)
                                  : route_block_bucketize_pos(fi.bucketize_pos, id, t, W);
}

// FBGEMM block_bucketize_sparse_features (stable CPU kernel, sequence=True semantics: the
// unbucketize_permute is always produced). block_sizes/dist_types: [F]. VBE KJTs use the
// flat VBE bag index (§3.5). `block_bucketize_pos`, when non-null, gives [F] boundary lists:
// a feature's non-empty list replaces its rule (§3.6), an empty one keeps it.
BucketizedKjt block_bucketize_sparse_features(
    const Kjt& kjt, const std::vector<int64_t>& block_sizes,
    const std::vector<DistType>& dist_types, int64_t my_size,
    const std::vector<std::vector<int64_t>>* block_bucketize_pos = nullptr);

// block_bucketize_sparse_features of one rank's KJT with the plan's block sizes and dist_types,
// and the bucketize_pos of the features that route by shards.
BucketizedKjt bucketize_on_host(const Plan& plan, const Kjt& kjt);

// TorchRec _get_recat(local_split=F, num_splits=W, stagger=1): recat[f*W+s] = s*F+f.
std::vector<int32_t> get_recat(int64_t F, int64_t W);

// FBGEMM expand_into_jagged_permute: out[output_offsets[k] + i] = input_offsets[permute[k]] + i
// for i < output_offsets[k+1] - output_offsets[k]. Offsets are complete cumsums ([T+1]).
std::vector<int64_t> expand_into_jagged_permute(const std::vector<int64_t>& permute,
                                                const std::vector<int64_t>& input_offsets,
                                                const std::vector<int64_t>& output_offsets,
                                                int64_t output_size);

// FBGEMM invert_permute: inv[permute[k]] = k. Throws when `permute` is not a permutation.
std::vector<int64_t> invert_permute(const std::vector<int64_t>& permute);

template <class T>
std::vector<int64_t> to_i64(const std::vector<T>& v) {
  return std::vector<int64_t>(v.begin(), v.end());
}

struct SparseData {
  std::vector<int64_t> lengths;
  std::vector<int64_t> values;
  std::vector<float> weights;  // empty when unweighted
};

// FBGEMM permute_2D_sparse_data: lengths viewed [T][B]; output row k = input row permute[k]
// (its B lengths and its contiguous block of values/weights). permute may be a subset.
// T is explicit because B may be 0 (every rank's batch empty).
SparseData permute_2D_sparse_data(const std::vector<int64_t>& permute,
                                  const std::vector<int64_t>& lengths, int64_t T, int64_t B,
                                  const std::vector<int64_t>& values,
                                  const std::vector<float>& weights);
// FBGEMM permute_1D_sparse_data: output bag k = input bag permute[k].
SparseData permute_1D_sparse_data(const std::vector<int64_t>& permute,
                                  const std::vector<int64_t>& lengths,
                                  const std::vector<int64_t>& values,
                                  const std::vector<float>& weights);

// Complete cumsum [n+1].
std::vector<int64_t> complete_cumsum(const std::vector<int64_t>& v);

// Where Backend::lookup puts a lookup KJT's output. Its bags are in (f, s, b) order, feature f's
// from bag0[f] ([F+1]). Sequence: [N, D], row p for value p (dst empty). Pooled, dst[j] = the
// first element of bag j's run of D_f sums ([bags]):
//   non-VBE [sum_s B_s, sum_D]: row sum_{s'<s} B_s' + b, at feature f's column offset;
//   VBE 1-D [s][f][b][d]: block (s, f)'s offset + b * D_f.
struct LookupOutputLayout {
  std::vector<int64_t> bag0, shape, dst;
  int64_t numel() const;
};
LookupOutputLayout lookup_output_layout(const Plan& plan, const LookupKjt& k);
// Its shape alone, without the walk over the bags.
std::vector<int64_t> lookup_output_shape(const Plan& plan, const LookupKjt& k);

// fn(f, j) for the bags j of [j0, j1) in order, f the feature of bag j: feature f holds bags
// [bag0[f], bag0[f + 1]) ([F + 1], some features may have none). The feature is searched once
// and then stepped along: how a chunk of a parallel walk over a KJT's bags knows its features.
template <class Fn>
void each_bag(const std::vector<int64_t>& bag0, int64_t j0, int64_t j1, Fn&& fn) {
  int64_t f = std::upper_bound(bag0.begin(), bag0.end(), j0) - bag0.begin() - 1;
  for (int64_t j = j0; j < j1; ++j) {
    while (j >= bag0[size_t(f + 1)]) ++f;
    fn(f, j);
  }
}

// Sequence plans: EmbeddingCollection pads a VBE KJT's lengths to max_f B_f (§6.2).
Kjt pad_vbe_kjt_lengths(const Kjt& kjt);

// The KJTAllToAll (splits a2a + tensor a2a + recat, §4.1-§4.3) for all W ranks, plus the
// contexts of §4.4. `kjts` are the per-sharding KJTs before bucketize (after VBE padding for
// sequence), `bucketized[s]` their bucketize outputs.
struct KjtAllToAllResult {
  std::vector<LookupKjt> lookup_kjts;  // [W]
  std::vector<ShardingContext> ctx;    // [W]
  bool variable_batch = false;         // VBE all-to-all (pooled, some KJT is VBE)
};
KjtAllToAllResult kjt_all_to_all(const Plan& plan, const std::vector<const Kjt*>& kjts,
                                 const std::vector<const BucketizedKjt*>& bucketized);

// The unsharded row g (§5, capture-format oracle) that a looked-up id of feature f reads on
// rank `rank`, after plan.bounds_check; nullopt-like `valid=false` = zeros (an empty shard
// under warn_zero_row/ignore). `oob` tells that the bounds check fired.
struct RowRef {
  uint64_t g = 0;
  bool valid = true;
  bool oob = false;
};
RowRef lookup_row(const Plan& plan, int64_t f, int64_t rank, int64_t local);

// §7.1 mean-pooling divisors of a pre-input-dist KJT, [num_bags] by flat bag index j:
// float32(length, or the sum of its weights in bag order) + 1e-6f for MEAN features, and
// 1 + 1e-6f for SUM features. The weights only where kjt.mean_divisor says so (empty: every
// feature of a weighted KJT). Only meaningful when plan.any_mean.
std::vector<float> mean_divisors(const Plan& plan, const Kjt& kjt);

// §7.2 VariableBatchPooledEmbeddingsReduceScatter input splits, in ELEMENTS:
// input_splits[r] = sum_f batch_size_per_rank_per_feature[r][f] * D_f.
std::vector<int64_t> vbe_reduce_scatter_input_splits(
    const Plan& plan, const std::vector<std::vector<int64_t>>& batch_size_per_rank_per_feature);

// The dtype pooled partial sums are reduced in: the codec's when there is one (§8), else the
// TBE output dtype. Sums are rounded to it after every add (rank order 0..W-1).
inline DType pooled_reduce_dtype(const Plan& plan) {
  return plan.comm_precision != DType::f32 ? plan.comm_precision : plan.data_type();
}
// Output dtype of both dists: fp32 after a codec decode, else the TBE output dtype (MEAN
// tables too: the dist carries their sums).
inline DType output_dist_dtype(const Plan& plan) {
  if (plan.comm_precision != DType::f32) return DType::f32;
  return plan.data_type();
}

}  // namespace dynemb
