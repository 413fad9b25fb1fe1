// Alternative plans for the same job, generated from the plan a capture was taken under
// (docs/load.md): every dist_type, other world sizes, and uneven row splits that balance the
// load observed in the capture. Each is a plan `validate` accepts and `replay --plan` uses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

 private:
  Plan plan_;
  std::vector<std::vector<int64_t>> counts_;
  std::vector<int64_t> widths_;
};

// The base plan with every continuous table split into uneven row ranges (explicit shards,
// as TorchRec takes for inference) whose observed ids are as even as the histogram's buckets
// allow; every rank keeps at least one row. Tables under (hash_)roundrobin are left as they
// are (their rows are not ranges).
Alternative balanced_rows_plan(const Plan& base, const RowHistogram& hist);

// The global batch of `kjts` (W ranks, each rank's bags in order, feature by feature)
// re-split over `world_size` ranks: each feature's bags, concatenated over ranks in rank
// order, cut into `world_size` consecutive runs. Non-VBE: each run has the global B /
// world_size bags (UsageError when it does not divide); VBE: each feature's B_f is split as
// evenly as possible, the first ranks taking one more.
std::vector<Kjt> resplit_batch(const std::vector<const Kjt*>& kjts, int64_t world_size);

}  // namespace dynemb::load
