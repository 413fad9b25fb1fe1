// How much memory one batch of a replay or a synth needs (docs/robustness.md "Size up front"):
// the whole batch of every rank is in memory at once, so the context holds W vectors of W
// splits per rank (W^2 terms), the pooled lookup output W ranks x sum_s B_s rows (W^2 again).
// `validate` prints it; synth and replay refuse a job that cannot fit before starting. A replay
// whose lookups are derived holds the lookups and outputs a slice of columns at a time instead
// (replay.cpp, check_memory: `lookup` and `output` per column).
#pragma once

#include <cstdint>
#include <string>

#include "plan/plan.hpp"

namespace dynemb {

struct MemoryEstimate {
  int64_t batch_size = 0;       // B per rank used
  double mean_bag_length = 0;   // ids per bag used
  double ids = 0;               // bytes: KJTs, bucketized ids, lookup KJTs, permutes
  double context = 0;           // bytes: the W contexts (W^2 terms included)
  double context_w2 = 0;        // of which the terms in W^2
  double lookup = 0;            // bytes: the W lookup outputs (local_embs)
  double output = 0;            // bytes: the W output dist results
  double synth = 0;             // one batch of synth (ids + context + lookup + output)
  double replay = 0;            // one batch of replay of a capture with every part
  std::string summary() const;  // "replay ~1.20 GiB, synth ~600.00 MiB per batch (...)"
};

// B local batch per rank, `mean_bag_length` ids per bag on average.
MemoryEstimate estimate_batch_memory(const Plan& plan, int64_t batch_size, double mean_bag_length);

}  // namespace dynemb
