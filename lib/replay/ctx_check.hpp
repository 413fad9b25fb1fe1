// Context checks of a replay (docs/cli.md `replay`):
//   diff_context      every captured ctx field vs the one derived from the plan and the KJTs,
//                     each differing element named by index with what the plan implies;
//   consistency_checks checks that need no plan: unbucketize_permute is a bijection of
//                     length N_r, input_splits[s][d] == output_splits[d][s], the splits and
//                     lengths_after_input_dist add up to the rows of local_embs,
//                     batch_size_per_rank matches the pooled rows;
//   latch_check       the variable-batch flag of a batch vs the mode the output dist latched.
// A wrong value of the right shape is a CheckStatus::fail (exit 1), never an exception.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/input_dist.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"
#include "replay/report.hpp"

namespace dynemb {

// One CheckResult per field present in `captured` (stage "ctx", check = field name).
// `kjt` is rank `rank`'s own KJT (before the input dist), `derived` its derived input dist.
std::vector<CheckResult> diff_context(const Plan& plan, int64_t batch, int rank, const Kjt& kjt,
                                      const DerivedRank& derived, const ShardingContext& captured,
                                      int64_t max_report);

// Plan-free checks over all W ranks of one batch. Entries of `ctx`, `local_embs`, `outputs`
// may be null (absent in the capture); checks that need an absent part are not emitted.
std::vector<CheckResult> consistency_checks(const Plan& plan, int64_t batch,
                                            const std::vector<const Kjt*>& kjts,
                                            const std::vector<const ShardingContext*>& ctx,
                                            const std::vector<const EmbTensor*>& local_embs,
                                            const std::vector<const EmbTensor*>& outputs,
                                            int64_t max_report);

// The variable-batch flag of (batch, rank) against the latched mode (set by batch
// `latched_batch`). Check "variable_batch_per_feature.latch".
CheckResult latch_check(int64_t batch, int rank, bool flag, bool latched, int64_t latched_batch);

}  // namespace dynemb
