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
  int64_t batch_size = 0;      // B per rank used
  double mean_bag_length = 0;  // ids per bag used
  double ids = 0;              // bytes: KJTs, bucketized ids, lookup KJTs, permutes
  double context = 0;          // bytes: the W contexts (W^2 terms included)
  double context_w2 = 0;       // of which the terms in W^2
  double lookup = 0;           // bytes: the W lookup outputs (local_embs)
  double output = 0;           // bytes: the W output dist results
  double synth = 0;            // one batch of synth (ids + context + lookup + output)
  // One batch of a synth that makes its output dist one destination rank at a time (synth.hpp,
  // synth_by_destination): ids and contexts, two ranks' lookups (one made, one being written),
  // four ranks' outputs (three waiting for the writer, one made; at most W of each) and one
  // destination's blocks
  // (pooled: at most 64 MiB at a time; sequence: what it receives, and its concatenation).
  double synth_by_destination = 0;
  double synth_one_lookup = 0;  // one rank's lookup (held there only when lookups are stored)
  double replay = 0;            // one batch of replay of a capture with every part
  // "replay ~1.20 GiB, synth ~600.00 MiB per batch (...)", synth one destination at a time.
  std::string summary() const;
};

// B local batch per rank, `mean_bag_length` ids per bag on average.
MemoryEstimate estimate_batch_memory(const Plan& plan, int64_t batch_size, double mean_bag_length);

}  // namespace dynemb
