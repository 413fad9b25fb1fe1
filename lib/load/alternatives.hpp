// Alternative plans for the same job, generated from the plan a capture was taken under
// (docs/load.md): every dist_type, other world sizes, and uneven row splits that balance the
// load observed in the capture. Each is a plan `validate` accepts and `replay --plan` uses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ops.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb::load {

struct Alternative {
  std::string name;    // short and file-name safe: "continuous", "roundrobin", "w16", "balanced"
  std::string origin;  // one line: what changed from the base plan
  Plan plan;           // finalized; plan_to_yaml(plan) reads back to it
};

struct AlternativeRequest {
  bool dist_types = false;           // the base plan with every table under each dist_type
  std::vector<int64_t> world_sizes;  // the base plan at each of these world sizes
  bool balanced_rows = false;        // uneven continuous rows from a RowHistogram
};

// The alternatives that need no data: every dist_type the base does not already use
// throughout, then each world size (even rows by the ceil rule, explicit shards dropped).
// Throws UsageError for a world size < 1.
//
// At the edges: dist_type alternatives come in the order continuous, roundrobin,
// hash_roundrobin; under (hash_)roundrobin every table drops its explicit shards, under
// continuous only those that were not continuous (capacities, not ranges). A world size asked
// twice gives one plan; the base's own world size gives one too (its shards dropped). A world
// size over 65536 (what a plan allows) is a UsageError as well. `balanced_rows` is not read
// here (it needs a RowHistogram: balanced_rows_plan). Every plan returned passes parse_plan.
std::vector<Alternative> generate_alternatives(const Plan& base, const AlternativeRequest& req);

// Ids observed per table, counted over `buckets` equal row ranges of each table, so that its
// memory is bounded whatever the table's size. Ids outside the table are not counted.
class RowHistogram {
 public:
  explicit RowHistogram(const Plan& plan, int64_t buckets_per_table = 4096);
  void add(const Kjt& kjt);  // one rank's KJT, under the plan given to the constructor
  const Plan& plan() const { return plan_; }
  // counts(t)[i]: ids of table t in rows [i * width(t), (i + 1) * width(t)).
  const std::vector<int64_t>& counts(int t) const { return counts_[static_cast<size_t>(t)]; }
  int64_t width(int t) const { return widths_[static_cast<size_t>(t)]; }
  // Ids of table t outside [0, num_embeddings) (negative ones included), not counted above.
  int64_t outside(int t) const { return outside_[static_cast<size_t>(t)]; }

 private:
  Plan plan_;
  std::vector<std::vector<int64_t>> counts_;  // [T][ceil(num_embeddings / width)]
  std::vector<int64_t> widths_;               // [T]: ceil(num_embeddings / buckets_per_table)
  std::vector<int64_t> outside_;              // [T]
};

// The base plan with every continuous table split into uneven row ranges (explicit shards,
// as TorchRec takes for inference) whose observed ids are as even as the histogram's buckets
// allow; every rank keeps at least one row. Tables under (hash_)roundrobin are left as they
// are (their rows are not ranges).
//
// The cut: bucket edge r (r = 1..W-1) is the one whose prefix count is nearest r * total / W,
// the lowest on a tie, kept past edge r-1 and short enough of the end that every later rank
// keeps a bucket. A continuous table with no ids observed, or fewer buckets than ranks, keeps
// what it had (so does every table when W = 1). The plan says `input_dist: inference`: the
// shards are routed by their offsets (TorchRec's inference input dist), as replay and synth do
// on the host engine; the GPU backends refuse it while a table routes by shards
// (engine_routing_gap). Throws Error when the histogram was counted under a plan of other
// tables.
Alternative balanced_rows_plan(const Plan& base, const RowHistogram& hist);

// Where a plan routes each id (docs/semantics.md §3.2, §10.2): the engine's route_feature,
// which takes the shards' offsets (block_bucketize_pos) for a table that routes_by_shards (an
// inference plan's uneven continuous shards) and the ceil rule otherwise.
class PlanRouter {
 public:
  explicit PlanRouter(const Plan& plan);  // finalized
  Route route(int64_t f, int64_t id, IndexType t) const {
    return route_feature(features_[static_cast<size_t>(f)], id, t, world_size_);
  }
  bool by_shards(int64_t f) const {
    return !features_[static_cast<size_t>(f)].bucketize_pos.empty();
  }

 private:
  int64_t world_size_ = 1;
  std::vector<FeatureInfo> features_;  // [F], the plan's
};

// The global batch of `kjts` (W ranks, each rank's bags in order, feature by feature)
// re-split over `world_size` ranks: each feature's bags, concatenated over ranks in rank
// order, cut into `world_size` consecutive runs. Non-VBE: each run has the global B /
// world_size bags (UsageError when it does not divide); VBE: each feature's B_f is split as
// evenly as possible, the first ranks taking one more.
//
// At the edges: one VBE rank makes the whole batch VBE (a non-VBE rank's B_{s,f} = its B), and
// the result is VBE; weights, lengths_type, values_type, weighted and mean_divisor are rank 0's
// and must be every rank's (else Error, as for lengths that do not add up). world_size < 1 or
// no KJTs: UsageError. Re-splitting a non-VBE batch of equal B to its own W gives it back.
std::vector<Kjt> resplit_batch(const std::vector<const Kjt*>& kjts, int64_t world_size);

}  // namespace dynemb::load
