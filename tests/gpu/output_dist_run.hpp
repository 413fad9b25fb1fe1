// The output dist of one batch on a backend, from every rank's lookup output and the derived
// contexts: each rank's output, in rank order. The GPU tests run it on the CUDA backend and on
// the CPU reference and compare the two.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "engine/engine.hpp"

namespace dynemb::test {

inline std::vector<EmbTensor> run_output_dist(Backend& backend, const Plan& plan,
                                              const DerivedBatch& derived,
                                              const std::vector<EmbTensor>& local) {
  const size_t W = local.size();
  std::vector<const EmbTensor*> lp;
  std::vector<const ShardingContext*> cp;
  for (size_t r = 0; r < W; ++r) {
    lp.push_back(&local[r]);
    cp.push_back(&derived.ranks[r].ctx);
  }
  std::vector<EmbTensor> out(W);
  auto sink = [&out](int r, EmbTensor&& t) { out[static_cast<size_t>(r)] = std::move(t); };
  if (plan.module == ModuleKind::sequence)
    backend.sequence_output_dist(plan, lp, cp, sink);
  else
    backend.pooled_output_dist(plan, derived.variable_batch, lp, cp, sink);
  return out;
}

}  // namespace dynemb::test
