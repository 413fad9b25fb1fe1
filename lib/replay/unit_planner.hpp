// How a replay cuts its batches into units (run_context.hpp), from the memory budget: sized up
// front from the first batch's metadata (a replay that cannot fit is refused before it starts),
// then cut batch by batch from what the batch holds.
//
//   whole         the batch at once: every rank's lookup, output dist and checks.
//   columns       slices of the embedding columns (column_slice.hpp), when the output dist runs
//                 on lookups derived from the embedding source and all W of them do not fit.
//   destinations  one destination rank at a time, a few of its output rows at a time (pooled,
//                 not VBE), reading from the capture only the rows each unit's output is made
//                 of (engine/dest_blocks.hpp), when every rank's local_embs is captured.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "capture/capture.hpp"
#include "engine/dest_blocks.hpp"
#include "replay/run_context.hpp"

namespace dynemb::replay_detail {

struct Sizing {
  // Embedding columns per slice when a batch's lookups are derived; 0: the whole batch at once.
  int64_t slice_cols = 0;
  // Bytes per embedding column a device holds when a slice's lookups and outputs stay on it
  // (the W lookups, the W outputs held for their checks, a reference and a golden slice): what
  // Backend::device_memory_for_kept is weighed against. 0 when the batch is never sliced.
  double kept_per_column = 0;
  // Batches whose every rank has local_embs may run one destination at a time.
  bool by_destination = false;
  uint64_t batch_bytes = 0;  // the estimate of one batch's replay
};

// The memory this process may plan for: --max-memory, or what the machine or its cgroup allows,
// shared evenly by the team's processes on this host (a launcher's processes on one machine
// together stay within what one process would use).
uint64_t memory_budget(const ReplayOptions& opt);
// The team's processes on this host (1 without a team).
int host_processes(const ReplayOptions& opt);

// Sizes the replay from the first selected batch's metadata; throws Error when one batch cannot
// fit in the budget, with the estimate (engine/memory_estimate.hpp). `replan`: --plan shards
// differently from the capture (its local_embs are re-sharded or dropped).
Sizing size_up(const RunContext& rc, const CaptureReader& reader, int64_t first_batch, bool replan);

// The column slices of a batch: the first `first` columns, then `width` at a time; width 0 runs
// the batch whole.
struct ColumnSlices {
  int64_t first = 0;
  int64_t width = 0;
};

// How this batch is cut into column slices. Slices are taken only where the sliced checks are
// exactly the whole ones and no whole output must be kept (column_slice.hpp).
ColumnSlices slice_width(const RunContext& rc, const BatchState& st, const Sizing& sizing);

// A batch cut by destination: where each (sender, destination) block lies ([s][d]) and the
// units, in destination order.
struct DestinationCut {
  std::vector<std::vector<DestBlock>> where;
  std::vector<Unit> units;
  std::vector<std::vector<int64_t>> shapes;  // [d]: the shape of destination d's whole output
  bool variable_batch = false;
};
// The cut of a batch whose contexts were checked and chosen; nullopt when its units would not
// be exactly the whole batch's checks (a context that differs from the derived one, a send
// order that is not increasing, a shape that is not the one its context implies): the batch then
// runs whole. Runs the output dist's own checks on the whole shapes (throws OutputDistFailure).
std::optional<DestinationCut> cut_destinations(RunContext& rc, BatchState& st);

}  // namespace dynemb::replay_detail
