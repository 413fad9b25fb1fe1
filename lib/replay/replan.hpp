// `replay --plan OTHER.yaml`: the same inputs under another plan (cli.md). What differs
// between the capture's plan and the other one, and the capture's sequence lookup output
// re-sharded to the other plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// One line per difference, key by key and table by table (tables matched by name), e.g.
// "tables[t0].num_embeddings: 1000 (capture) -> 4000 (--plan)". Empty when the plans shard
// the same way (text, comments and key order aside).
std::vector<std::string> plan_differences(const Plan& capture_plan, const Plan& other);

// Sequence `local_embs` hold one row per routed id, so they can be re-sharded: the rows per
// id are recovered with the capture plan's derived context and output dist, then looked up
// under `to`. `kjts[r]`, `local[r]` (under `from`) for every rank; returns local_embs[r] under
// `to`. `unknown` counts ids whose row the capture does not hold (outside a table of `from`,
// looked up as a zero row there, but inside `to`): their rows are zeros. Throws Error.
std::vector<EmbTensor> reshard_sequence_local_embs(const Plan& from, const Plan& to,
                                                   const std::vector<const Kjt*>& kjts,
                                                   const std::vector<const EmbTensor*>& local,
                                                   Backend& backend, int64_t batch,
                                                   int64_t& unknown);

}  // namespace dynemb
