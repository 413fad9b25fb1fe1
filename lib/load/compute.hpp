// How load.hpp's report is computed (docs/load-report.md has the definitions): one pass over
// a capture's batches, KJTs only, every plan updated from the same read.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "load/load.hpp"
#include "load/space_saving.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb::load {

struct LoadOptions {
  double link_gbps = 100;           // per rank and direction, for the critical-path estimate
  int64_t top_rows = 10;            // hottest rows kept in PlanLoad::hottest_rows
  int64_t hot_row_capacity = 1024;  // Space-Saving entries per rank
  int64_t max_batch_columns = 1024;
  // What the run may use (bytes); 0: usable_memory_bytes() (DYNEMB_MEMORY_LIMIT, the cgroup
  // limit or the machine's memory). A batch whose KJTs and working copies do not fit is
  // refused before it is read; the next batch is read ahead only when two fit.
  uint64_t max_memory = 0;
};

// Bytes a batch of these KJT elements takes while it is counted: the KJTs as held (int64
// lengths and ids, float weights), the id buffers the plans share, and one re-split copy per
// other world size. `lengths`, `ids`: elements over all ranks; `weights`: weighted ids.
uint64_t batch_memory_estimate(int64_t lengths, int64_t ids, int64_t weights,
                               int64_t other_world_sizes);

// A plan to measure: its name (file-name safe), one line on what it is, the plan (finalized).
struct PlanSpec {
  std::string name, origin;
  Plan plan;
};

// Consecutive batches per BatchLoad column so that at most `max_columns` are kept.
int64_t batch_group_size(int64_t num_batches, int64_t max_columns);

// Seconds `bytes` take on a link of `gbps` Gbit/s.
double link_seconds(int64_t bytes, double gbps);

// Critical path of one dist: max over ranks of max(sent, received) off the diagonal, on one
// full-duplex link per rank (an estimate: no latency, no overlap, a non-blocking fabric).
double critical_path_seconds(const TrafficMatrix& m, double gbps);

// The bytes element size of the ids, lengths and output-dist elements (docs/load-report.md).
int index_bytes(IndexType t);
int comm_element_bytes(const Plan& plan);

// The buffers of one batch's ids ([N] each): accumulators that add their batches one after
// another (never at once) may share one, so that memory holds them once whatever the plans.
struct BatchScratch {
  std::vector<uint32_t> bucket;  // t * W + d of each id
  std::vector<uint64_t> keys;    // u64(id), by bucket
};

// One plan's load, batch by batch. add_batch takes the plan's W KJTs of one batch (already
// re-split when the plan's world size is not the capture's).
class PlanAccumulator {
 public:
  PlanAccumulator(PlanSpec spec, int64_t num_batches, const LoadOptions& opt,
                  std::shared_ptr<BatchScratch> scratch = nullptr);
  ~PlanAccumulator();
  PlanAccumulator(PlanAccumulator&&) noexcept;
  void add_batch(int64_t batch, const std::vector<const Kjt*>& kjts);
  // Hottest rank, its rows; the accumulator is spent.
  PlanLoad finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct LoadProgress {
  int64_t batches_done = 0, batches_total = 0;
  double bytes_done = 0, bytes_total = 0;  // KJT bytes read (lengths, values, weights)
};

// One pass over the capture: reads each batch's KJTs under `read_plan` (the capture's own,
// or a --plan of the same world size), hands them to `observe` when given (a histogram's
// first pass) and adds them to every plan (re-split for another world size).
LoadReport compute_load(const CaptureReader& reader, const Plan& read_plan,
                        std::vector<PlanSpec> plans, const LoadOptions& opt,
                        const std::function<void(const std::vector<const Kjt*>&)>& observe = {},
                        const std::function<void(const LoadProgress&)>& progress = {});

// The JSON document of docs/load-report.md ("schema": "dynemb-dist/load", version 1).
inline constexpr int kLoadSchemaVersion = 1;
std::string load_report_json(const LoadReport& r, const std::string& tool_version);

// The text report (docs/load.md): header, a block per plan, the comparison.
std::string load_report_text(const LoadReport& r);

}  // namespace dynemb::load
