// The replay's engine room, private to lib/replay (replay.hpp is the API): Replayer, one run of
// `dynemb-dist replay`, and what its parts share. Its steps live by concern:
//   replay.cpp                 the run: open the capture and plan, size it up front, batch by
//                              batch with one read ahead, progress, --plan rebasing, the report
//   replay_steps.cpp           one batch whole: input dist, context checks, lookup checks, the
//                              output dist and its checks (golden, unsharded reference, module)
//   replay_sliced.cpp          one batch over column slices of derived lookups (column_slice.hpp)
//   replay_by_destination.cpp  one batch one destination rank at a time (dest_blocks.hpp)
//   replay_trouble.cpp         keep going after trouble: a bad rank-batch never hides the others
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "capture/capture.hpp"
#include "common/memory.hpp"
#include "engine/dest_blocks.hpp"
#include "engine/input_dist.hpp"
#include "engine/output_dist.hpp"
#include "replay/column_slice.hpp"
#include "replay/diff.hpp"
#include "replay/replay.hpp"

namespace dynemb::replay_detail {

// A CheckResult from the diff `d` of `got_label` against `want_label` under `tol`.
CheckResult tensor_check(int64_t batch, int rank, const std::string& stage,
                         const std::string& check, const std::string& got_label,
                         const std::string& want_label, const TensorDiff& d, const Tolerance& tol);
// A check not made, and why.
CheckResult skipped(int64_t batch, int rank, const std::string& stage, const std::string& check,
                    const std::string& why);

struct DestUnit;  // a unit of a batch replayed by destination (replay_by_destination)

// Elements per tile of a check made by the backend (Backend::lookup_differences and the other
// checks): a tile of the first mismatches brings both sides' values back, half a MiB.
constexpr int64_t kCompareTile = int64_t(1) << 16;

// The backend holds the output dists' outputs while this lives (Backend::hold_outputs); `on`:
// whether it does.
struct HeldOutputs {
  explicit HeldOutputs(Backend& b) : backend(b), on(b.hold_outputs(true)) {}
  ~HeldOutputs() { backend.hold_outputs(false); }
  HeldOutputs(const HeldOutputs&) = delete;
  HeldOutputs& operator=(const HeldOutputs&) = delete;
  Backend& backend;
  const bool on;
};

class Replayer {
 public:
  Replayer(const ReplayOptions& opt, Backend& backend, const ReplayCallbacks& cb, Report& rep)
      : opt_(opt), backend_(backend), cb_(cb), rep_(rep) {}

  void run();

 private:
  void emit(CheckResult c) {
    if (deferring_) {
      pending_.push_back(std::move(c));
      return;
    }
    if (started_ && !header_shown_) start();  // the header waited for the capture's hash
    if (cb_.on_check && header_shown_) cb_.on_check(c);
    if (opt_.passes != PassMode::whole && PassLog::fits(c)) {
      ++rep_.pass_counts[c.stage];
      if (opt_.passes == PassMode::compact) rep_.pass_log.add(c, rep_.checks.size());
      return;
    }
    rep_.checks.push_back(std::move(c));
  }
  // The header (on_start) once, then the checks decided before it (trouble in a batch read
  // before the first replayed one).
  void start() {
    if (header_shown_) return;
    take_capture_sha();
    rep_.info.device = backend_.device();  // waits for a backend still starting (start_backend)
    header_shown_ = true;
    if (cb_.on_start) cb_.on_start(rep_);
    if (cb_.on_check)
      for (const CheckResult& c : rep_.checks) cb_.on_check(c);
  }
  bool header_shown_ = false;
  // While a batch is tried one destination at a time (replay_by_destination), its checks wait
  // here: the batch may still have to run whole, and then only the whole run's checks count.
  bool deferring_ = false;
  std::vector<CheckResult> pending_;

 public:
  // The capture's SHA-256 is computed on another thread while the plan and the first batch are
  // read (the file is in the page cache for both); the header waits for it. Rethrows a read
  // error of the hash.
  void take_capture_sha() {
    if (capture_sha_.valid()) rep_.info.capture.sha256 = capture_sha_.get();
  }
  // --write-output is complete in its temporary (finished, not yet committed by the caller).
  bool write_output_finished() const { return write_output_finished_; }

 private:
  std::future<std::string> capture_sha_;
  void warn(const std::string& w) { rep_.warnings.push_back(w); }
  // Trouble in one batch (or one rank of it): an error check, and the run goes on
  // (--fail-fast: thrown, the run stops). replay_trouble.cpp.
  void record_trouble(int64_t k, int rank, const std::string& stage, const std::string& msg);
  // Batch k; a rank whose ctx/, local_embs or output cannot be read loses those parts (and
  // gets an error check). nullopt when the KJTs themselves cannot be read (recorded).
  std::optional<Batch> read_batch_keeping_going(const CaptureReader& reader, int64_t k);
  // --plan that shards differently from the capture's plan (replan.hpp): the batches are read
  // with the capture's plan, then rebased onto plan_ (captured ctx/ dropped, sequence
  // local_embs re-sharded, pooled partial sums dropped). False: nothing of batch k can run
  // under plan_ (its skipped checks are emitted).
  void setup_replan(const CaptureReader& reader);
  // Size up front: refuses (Error) a replay whose first batch cannot fit in this machine's
  // memory, with the estimate (engine/memory_estimate.hpp); sizes the column slices.
  void check_memory(const CaptureReader& reader);
  uint64_t memory_budget() const {
    return opt_.max_memory > 0 ? opt_.max_memory : usable_memory_bytes();
  }
  uint64_t batch_bytes_ = 0;  // check_memory's estimate of one batch's replay
  // Embedding columns per slice when a batch's lookups are derived (column_slice.hpp); 0 or
  // all the columns: the whole batch at once. Set by check_memory.
  int64_t slice_cols_ = 0;
  bool rebase_batch(int64_t k, Batch& batch, bool selected);
  const Plan& read_plan() const { return replan_ ? cap_plan_ : plan_; }
  bool replan_ = false;
  Plan cap_plan_;
  int64_t troubles_ = 0;
  int64_t first_trouble_batch_ = -1;
  void open_plan(const CaptureReader& reader);
  void open_source_and_dist(const CaptureReader& reader);
  void open_writer(const CaptureReader& reader);
  void drop_writer();
  void begin(int64_t k, const Batch& batch);
  void replay_read(int64_t k, std::optional<Batch>& read);
  std::unique_ptr<CaptureWriter> writer_;  // --write-output; reset on trouble
  bool write_output_finished_ = false;
  std::set<int64_t> selected_;  // the batches replayed (--batches)
  bool started_ = false;        // the first replayed batch has begun
  // Replays batch k; returns the outputs (when --write-output) in rank order.
  std::vector<std::optional<EmbTensor>> replay_batch(int64_t k, const Batch& batch);
  // What the steps of one batch share: its inputs by rank, what was derived and chosen, and
  // whether the checks so far found the context or the lookup wrong (the cause a later
  // mismatch names).
  struct BatchState {
    BatchState(int64_t k, const Batch& batch, int64_t W);
    int64_t k;
    const Batch& batch;
    int64_t W;
    std::vector<const Kjt*> kjts;                  // [W]
    std::vector<const ShardingContext*> cap_ctx;   // [W], null: no ctx/ captured
    std::vector<const EmbTensor*> cap_local;       // [W], null: no local_embs captured
    std::vector<const EmbTensor*> golden;          // [W], null: no output captured
    DerivedBatch der;                              // the input dist, derived
    std::vector<ShardingContext> used;             // [W] merged contexts (--ctx captured)
    std::vector<const ShardingContext*> used_ptr;  // [W] what the output dist gets: -> used or der
    std::vector<EmbTensor> derived_local;          // [W] or empty: lookups the dist runs on
    std::vector<bool> got;                         // [W] the output dist handed rank r over
    bool ctx_bad = false, lookup_bad = false;
    std::string cause_before_output() const;  // "context", "lookup/local_embs" or ""
  };
  void derive_batch(BatchState& st);
  void check_contexts(BatchState& st);
  void choose_contexts(BatchState& st);
  void check_lookup(BatchState& st);
  std::vector<EmbTensor> lookup(const BatchState& st, int r, const ColumnSlice* slice = nullptr);
  // fn() with a lookup's errors said in the capture's words: the file, the batch, and for an id
  // outside its table under bounds_check=error, the id as the user sent it.
  template <class Fn>
  auto lookup_errors(const BatchState& st, Fn&& fn) -> decltype(fn());
  std::optional<TensorDiff> lookup_diff_where_made(const BatchState& st, int r,
                                                   const EmbTensor& got,
                                                   const TensorLayout& layout);
  EmbTensor reference(const BatchState& st, int r, const ColumnSlice* slice = nullptr);
  std::vector<std::optional<EmbTensor>> run_output_dist(BatchState& st);
  // Whether this batch's outputs may stay where the backend makes them (Backend::hold_outputs):
  // not when the host needs them whole (--write-output, module_output, a MEAN diagnosis).
  bool outputs_may_stay(const BatchState& st) const;
  void check_output(BatchState& st, int r, EmbTensor&& out,
                    std::vector<std::optional<EmbTensor>>& kept, bool held);
  TensorDiff held_golden_diff(const BatchState& st, int r, const EmbTensor& out,
                              const TensorLayout& layout);
  TensorDiff held_reference_diff(const BatchState& st, int r, const EmbTensor& out,
                                 const TensorLayout& layout);
  void emit_output_checks(BatchState& st, int r, std::optional<CheckResult> gold,
                          std::optional<CheckResult> ref, const EmbTensor* out);
  void output_dist_failed(BatchState& st, const OutputDistFailure& e);
  // The batch over column slices (column_slice.hpp): the slice width, 0 when this batch runs
  // whole; the lookups, output dist and output checks of every slice, the checks merged.
  int64_t slice_width(const BatchState& st) const;
  struct SlicedDiffs {                 // rank r's output checks so far
    std::vector<int64_t> whole_shape;  // of its output; empty: not handed over yet
    std::optional<TensorDiff> gold, ref;
  };
  void run_output_dist_sliced(BatchState& st, int64_t width);
  static void drop_derived_extras(BatchState& st);
  void check_output_slice(BatchState& st, int r, const ColumnSlice& slice, const EmbTensor& out,
                          bool held, SlicedDiffs& d);
  void skip_outputs(const BatchState& st, const std::string& why);
  TensorLayout lookup_layout(const BatchState& st, int r) const;
  // The batch one destination rank at a time (dest_blocks.hpp): only the rows each rank's
  // output is made of are read, from the capture, while it is checked. Taken when check_memory
  // found the capture fit for it (stream_) and the batch's contexts are the derived ones;
  // false: nothing of it counted, the caller replays the batch whole.
  bool stream_ = false;
  static void report_by_destination(int64_t k, bool taken) {
    if (const char* e = std::getenv("DYNEMB_BY_DESTINATION"); e && std::string(e) == "report")
      std::fprintf(stderr, "DYNEMB_BY_DESTINATION: batch %lld: %s\n", static_cast<long long>(k),
                   taken ? "one destination at a time" : "whole");
  }
  bool replay_by_destination(const CaptureReader& reader, int64_t k);
  bool stream_batch(const CaptureReader& reader, BatchState& st);
  // The next batch's KJTs and contexts (replay_by_destination's first read), read on another
  // thread while this batch checks its last unit: no other read is in flight then (the units'
  // rows are all read). libhdf5 is not thread-safe, so the replay's thread waits for it before
  // it reads anything itself (settle_shapes_ahead).
  std::future<std::optional<Batch>> shapes_ahead_;
  int64_t shapes_ahead_k_ = -1;
  int64_t next_by_destination_ = -1;  // the batch replay_by_destination gets next; -1: none
  void start_shapes_ahead(const CaptureReader& reader);
  void settle_shapes_ahead() {
    if (shapes_ahead_.valid()) shapes_ahead_.wait();
  }
  // A destination's output checks, merged over its units (stream_batch).
  struct DestChecks {
    TensorDiff gold, ref;
    std::vector<int64_t> whole_shape;  // of d's output
  };
  bool check_unit_output(BatchState& st, const DestUnit& u, const EmbTensor& out,
                         const std::optional<EmbTensor>& golden, const TileCompare& how, bool held,
                         DestChecks& dest);
  bool plan_units(BatchState& st, std::vector<std::vector<DestBlock>>& where,
                  std::vector<DestUnit>& units, bool& variable_batch);
  // Progress: the logical bytes of each selected batch, read from the file's metadata up front
  // (only when someone shows progress), then advanced as each rank's output is checked.
  void measure_progress(const CaptureReader& reader);
  void progress_rank_done(int64_t k);
  void show_header_when_hashed();  // the header, once the first batch began and the hash is in
  void progress_batch_done(int64_t k);
  ReplayProgress progress_;
  std::map<int64_t, double> batch_bytes_of_;
  int64_t ranks_done_in_batch_ = 0;
  // The step of replay_batch running and its rank (-1: all ranks), for the trouble report.
  struct Where {
    const char* step = "replay";
    int rank = -1;
    // The report's stage of that step (docs/report-schema.md): the input dist derives the
    // contexts, the unsharded reference and the output dist are checked as `output`.
    std::string report_stage() const {
      const std::string s = step;
      if (s == "input dist" || s == "ctx") return "ctx";
      if (s == "output dist" || s == "output" || s == "reference") return "output";
      if (s == "lookup" || s == "module") return s;
      return "replay";
    }
  } at_;
  // Wall time per step, summed over batches and ranks, for whoever tunes the replay
  // (DYNEMB_STEP_TIMES=1: a table on stderr at the end). The time from one at() to the next
  // is the earlier step's; "read" is the wait for a batch (its read, or what is left of its
  // read ahead).
  struct StepClock {
    bool on = std::getenv("DYNEMB_STEP_TIMES") != nullptr;
    std::vector<std::pair<std::string, double>> seconds;  // first-seen order
    const char* step = "open";  // a literal (the trace keeps it by pointer)
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
    const std::chrono::steady_clock::time_point started = since;
    void enter(const char* next);
    void print() const;
  } clock_;
  void at(const char* step, int rank) {
    at_ = {step, rank};
    clock_.enter(step);
  }
  TensorLayout output_layout(const Kjt& kjt, const EmbTensor& t) const;

  const ReplayOptions& opt_;
  Backend& backend_;
  const ReplayCallbacks& cb_;
  Report& rep_;

  Plan plan_;
  Tolerance tol_;
  bool use_captured_ = false;
  std::shared_ptr<const EmbeddingSource> source_;
  std::unique_ptr<RwSequenceEmbeddingDist> seq_dist_;
  std::unique_ptr<RwPooledEmbeddingDist> pooled_dist_;
  std::optional<int64_t> latched_batch_;  // batch whose context latched the pooled module
  bool warned_no_local_ = false;
  bool ctx_seen_ = false;  // some rank-batch so far had a ctx/ group

  void diagnose_local_means(CheckResult& c, const EmbTensor& captured, const EmbTensor& sums,
                            const LookupKjt& lk, const TensorLayout& layout) const;
  void diagnose_output_after_callback(CheckResult& c, const EmbTensor& replayed,
                                      const EmbTensor& golden, const Kjt& kjt,
                                      const TensorLayout& layout) const;
  void diagnose_module_divisor(CheckResult& m, const EmbTensor& out, const RankBatch& rb) const;
};

}  // namespace dynemb::replay_detail
