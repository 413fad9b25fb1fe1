// What a replay opens before its first batch: the plan it runs under (the capture's, or --plan's,
// with what differs from the capture's), the tolerance and the batches; the embedding source and
// the output dist module, built once and latched across batches like the real module; the
// --write-output copy. And, for a --plan that shards differently, each batch rebased onto it.
#pragma once

#include <memory>

#include "capture/capture.hpp"
#include "replay/run_context.hpp"

namespace dynemb::replay_detail {

struct PlanChoice {
  // --plan shards differently from the capture's plan (replan.hpp): batches are read with the
  // capture's plan (cap_plan), then rebased onto rc.plan.
  bool replan = false;
  Plan cap_plan;
  const Plan& read_plan(const RunContext& rc) const { return replan ? cap_plan : rc.plan; }
};

// Sets rc.plan and rc.tol and the report's header fields (plan, module, world size, tolerance,
// the batches selected).
PlanChoice open_plan(RunContext& rc, const CaptureReader& reader, ReportInfo& info);
void open_source_and_dists(RunContext& rc, const CaptureReader& reader);
// --write-output's copy of the capture (its table weights first); null without --write-output.
std::unique_ptr<CaptureWriter> open_writer(const RunContext& rc, const CaptureReader& reader);
// Batch k rebased onto rc.plan: captured ctx/ dropped, sequence local_embs re-sharded, pooled
// partial sums dropped. False: nothing of it can run under rc.plan (its skipped checks emitted).
bool rebase_batch(RunContext& rc, const PlanChoice& pc, int64_t k, Batch& batch, bool selected);

}  // namespace dynemb::replay_detail
