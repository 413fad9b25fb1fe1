// What a failing check of a plan with MEAN tables says of its cause, where the evidence shows
// it: a lookup that kept MEAN pooling under row-wise sharding (it must sum, and the module
// divides), an output captured after the module's mean pooling instead of from the dist, and
// a module that divides by another divisor than the capture's mean_divisor says. Each only
// rewrites the check's cause and message; none changes its verdict.
#pragma once

#include "engine/tolerance.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"
#include "replay/coords.hpp"
#include "replay/report.hpp"

namespace dynemb::replay_detail {

// A failed lookup check of captured local_embs against the derived per-rank sums.
void diagnose_local_means(const Plan& plan, const Tolerance& tol, CheckResult& c,
                          const EmbTensor& captured, const EmbTensor& sums, const LookupKjt& lk,
                          const TensorLayout& layout);
// A failed golden check whose golden output equals the replayed one divided by the MEAN counts.
void diagnose_output_after_callback(const Plan& plan, CheckResult& c, const EmbTensor& replayed,
                                    const EmbTensor& golden, const Kjt& kjt,
                                    const TensorLayout& layout);
// A failed module check whose MEAN columns match a division by another divisor.
void diagnose_module_divisor(const Plan& plan, const Tolerance& tol, CheckResult& m,
                             const EmbTensor& out, const RankBatch& rb);

}  // namespace dynemb::replay_detail
