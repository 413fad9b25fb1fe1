#include "replay/replay.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

#include "capture/capture.hpp"
#include "capture/h5util.hpp"
#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/memory.hpp"
#include "engine/dest_blocks.hpp"
#include "engine/dist_checks.hpp"
#include "engine/engine.hpp"
#include "engine/mean_pooling.hpp"
#include "engine/memory_estimate.hpp"
#include "engine/ops.hpp"
#include "engine/output_dist.hpp"
#include "replay/column_slice.hpp"
#include "replay/ctx_check.hpp"
#include "replay/diff.hpp"
#include "replay/replan.hpp"
#include "replay/sha256.hpp"

namespace dynemb {

std::vector<int64_t> parse_batch_range(const std::string& text, int64_t num_batches) {
  std::vector<int64_t> out;
  if (text.empty()) {
    for (int64_t k = 0; k < num_batches; ++k) out.push_back(k);
    return out;
  }
  auto number = [&](const std::string& s) -> int64_t {
    if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(
          fmt::format("--batches '{}': '{}' is not a batch number (expected a list "
                      "like 0-3,7)",
                      text, s));
    const int64_t v = std::stoll(s);
    if (v >= num_batches)
      throw UsageError(
          fmt::format("--batches '{}': batch {} does not exist (the capture has {} "
                      "batches, 0..{})",
                      text, v, num_batches, num_batches - 1));
    return v;
  };
  std::set<int64_t> set;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    const size_t dash = part.find('-');
    if (dash == std::string::npos) {
      set.insert(number(part));
      continue;
    }
    const int64_t a = number(part.substr(0, dash)), b = number(part.substr(dash + 1));
    if (b < a)
      throw UsageError(fmt::format("--batches '{}': range '{}' runs backwards", text, part));
    for (int64_t k = a; k <= b; ++k) set.insert(k);
  }
  if (set.empty()) throw UsageError(fmt::format("--batches '{}': no batch selected", text));
  return {set.begin(), set.end()};
}

namespace {

// The context fed to the output dist in --ctx captured mode: the captured fields, and the
// derived ones for fields the capture does not carry (optional in docs/capture-format.md).
// The derived id-sized fields (unbucketize_permute [N_r], lengths_after_input_dist) are moved
// out of `der`, not copied: nothing reads them there after the context checks, and a captured
// field then takes the moved vector's memory.
ShardingContext merge_ctx(const ShardingContext& cap, ShardingContext& der) {
  std::optional<std::vector<int64_t>> perm = std::move(der.unbucketize_permute);
  std::optional<std::vector<int64_t>> lens = std::move(der.lengths_after_input_dist);
  der.unbucketize_permute.reset();
  der.lengths_after_input_dist.reset();
  ShardingContext m = der;
  m.unbucketize_permute = std::move(perm);
  m.lengths_after_input_dist = std::move(lens);
  if (cap.input_splits) m.input_splits = cap.input_splits;
  if (cap.output_splits) m.output_splits = cap.output_splits;
  if (cap.batch_size_per_rank) m.batch_size_per_rank = cap.batch_size_per_rank;
  if (cap.batch_size_per_rank_per_feature)
    m.batch_size_per_rank_per_feature = cap.batch_size_per_rank_per_feature;
  if (cap.sparse_features_recat) m.sparse_features_recat = cap.sparse_features_recat;
  if (cap.unbucketize_permute) m.unbucketize_permute = cap.unbucketize_permute;
  if (cap.lengths_after_input_dist) {
    m.lengths_after_input_dist = cap.lengths_after_input_dist;
    m.lengths_after_input_dist_cols = cap.lengths_after_input_dist_cols;
  }
  if (cap.variable_batch_per_feature) m.variable_batch_per_feature = cap.variable_batch_per_feature;
  if (cap.batch_size_per_feature_pre_a2a)
    m.batch_size_per_feature_pre_a2a = cap.batch_size_per_feature_pre_a2a;
  return m;
}

std::string fmt_float(float v) {
  return fmt::format("{}", v);
}

// A CheckResult from a tensor diff. `what` names the pair, e.g. "replayed vs golden".
CheckResult tensor_check(int64_t batch, int rank, const std::string& stage,
                         const std::string& check, const std::string& got_label,
                         const std::string& want_label, const TensorDiff& d, const Tolerance& tol) {
  CheckResult c;
  c.batch = batch;
  c.rank = rank;
  c.stage = stage;
  c.check = check;
  c.got_label = got_label;
  c.want_label = want_label;
  c.compared = d.compared;
  if (!d.shape_ok) {
    c.status = CheckStatus::fail;
    c.mismatches = 1;
    c.message =
        fmt::format("{} has a different shape than {}: {}", got_label, want_label, d.shape_note);
    return c;
  }
  c.mismatches = d.mismatches;
  c.max_abs_err = d.max_abs_err;
  c.max_rel_err = d.max_rel_err;
  for (const ElementMismatch& m : d.first)
    c.details.push_back({m.where, fmt_float(m.got), fmt_float(m.want), ""});
  if (d.mismatches == 0) {
    c.message = fmt::format("{} elements within {} (max abs err {:g}, max rel err {:g})",
                            d.compared, tol.str(), d.max_abs_err, d.max_rel_err);
    return c;
  }
  c.status = CheckStatus::fail;
  c.message = fmt::format("{} of {} elements differ ({})", d.mismatches, d.compared, tol.str());
  if (!d.first.empty()) {
    const ElementMismatch& m = d.first.front();
    c.message += fmt::format("; first at {}: {} {}, {} {}", to_string(m.where), got_label,
                             fmt_float(m.got), want_label, fmt_float(m.want));
  }
  c.message += fmt::format("; max abs err {:g}, max rel err {:g}", d.max_abs_err, d.max_rel_err);
  return c;
}

CheckResult skipped(int64_t batch, int rank, const std::string& stage, const std::string& check,
                    const std::string& why) {
  CheckResult c;
  c.batch = batch;
  c.rank = rank;
  c.stage = stage;
  c.check = check;
  c.status = CheckStatus::skipped;
  c.message = why;
  return c;
}

// True when both paths name the same existing file (or the same path text).
bool same_file(const std::string& a, const std::string& b) {
  if (a == b) return true;
  struct stat sa, sb;
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

std::string read_text_file(const std::string& path) {
  return read_input_text(path, "plan file");  // errno's reason; a FIFO times out
}

// The capture's SHA-256 on another thread (read while the plan and the first batch are read);
// on this thread when no thread can be started.
std::future<std::string> start_capture_sha(const std::string& path) {
  try {
    return std::async(std::launch::async, [path] { return sha256_file(path); });
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, [path] { return sha256_file(path); });
  }
}

// A stand-in of rank r's whole lookup output with the shape alone (no data), from the shape of
// its slice `t` and its lookup KJT: [rows, columns], or pooled VBE 1-D [s][f][b][d] with
// sum_{s,f} B_{s,f} D_f elements. For the dist's context checks, which read shapes only.
EmbTensor whole_lookup_shape(const Plan& plan, const LookupKjt& lk, const EmbTensor& t) {
  EmbTensor e;
  e.dtype = t.dtype;
  if (t.shape.size() != 1) {
    e.shape = {t.rows(), embedding_columns(plan)};
    return e;
  }
  int64_t n = 0;
  for (int64_t f = 0; f < lk.num_features; ++f)
    for (int64_t s = 0; s < lk.world_size; ++s)
      n += lk.stride_per_key_per_rank[size_t(f)][size_t(s)] * plan.features[size_t(f)].dim;
  e.shape = {n};
  return e;
}

// fn(arg) on another thread (`ahead`), or deferred to the get() of the future: when not
// ahead, or when no thread can be started (the work then runs in turn).
template <class Fn, class Arg>
auto read_ahead_task(Fn& fn, Arg arg, bool ahead) -> std::future<decltype(fn(arg))> {
  try {
    if (ahead) return std::async(std::launch::async, [&fn, arg] { return fn(arg); });
    return std::async(std::launch::deferred, [&fn, arg] { return fn(arg); });
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, [&fn, arg] { return fn(arg); });
  }
}

// Every row of a captured tensor as the ranges of CaptureReader::read_rows.
std::vector<std::pair<int64_t, int64_t>> whole_rows(const EmbTensor& t) {
  if (t.rows() == 0) return {};
  return {{0, t.rows()}};
}

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
    rep_.checks.push_back(std::move(c));
  }
  // The header (on_start) once, then the checks decided before it (trouble in a batch read
  // before the first replayed one).
  void start() {
    if (header_shown_) return;
    take_capture_sha();
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

 private:
  std::future<std::string> capture_sha_;
  void warn(const std::string& w) { rep_.warnings.push_back(w); }
  // Trouble in one batch (or one rank of it): an error check, and the run goes on
  // (--fail-fast: thrown, the run stops). replay_keep_going.cpp.
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
  std::set<int64_t> selected_;             // the batches replayed (--batches)
  bool started_ = false;                   // the first replayed batch has begun
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
    std::string step = "open";
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
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
};

void Replayer::StepClock::enter(const char* next) {
  if (!on) return;
  const auto now = std::chrono::steady_clock::now();
  const double dt = std::chrono::duration<double>(now - since).count();
  auto it =
      std::find_if(seconds.begin(), seconds.end(), [&](const auto& e) { return e.first == step; });
  if (it == seconds.end())
    seconds.emplace_back(step, dt);
  else
    it->second += dt;
  step = next;
  since = now;
}

void Replayer::StepClock::print() const {
  if (!on) return;
  double total = 0;
  for (const auto& [name, secs] : seconds) total += secs;
  std::string out = "# step times (DYNEMB_STEP_TIMES): wall seconds per step, all batches\n";
  for (const auto& [name, secs] : seconds)
    out += fmt::format("#   {:<12} {:9.3f}  {:5.1f} %\n", name, secs,
                       total > 0 ? 100.0 * secs / total : 0.0);
  std::fputs(out.c_str(), stderr);
}

// Values computed two ways (a division, or a multiplication by 1/len) agree to a few ulps:
// the diagnoses below compare with this instead of the replay's tolerance.
Tolerance diagnosis_tolerance() {
  return Tolerance::rel(1e-5, 1e-6);
}

// The MEAN columns a mismatch report names: "table t1 (features f1, f3)".
std::string mean_tables(const Plan& plan) {
  std::vector<std::string> out;
  for (const TableConfig& t : plan.tables)
    if (t.pooling == PoolingMode::mean) out.push_back(t.name);
  return fmt::format("{}", fmt::join(out, ", "));
}

void Replayer::diagnose_local_means(CheckResult& c, const EmbTensor& captured,
                                    const EmbTensor& sums, const LookupKjt& lk,
                                    const TensorLayout& layout) const {
  const EmbTensor means = per_rank_means(plan_, lk, sums);
  const TensorDiff d = diff_tensors(captured, means, diagnosis_tolerance(), layout, 1);
  if (!d.shape_ok || d.mismatches != 0) return;
  c.cause = "lookup kept MEAN pooling under RW";
  std::string where;
  if (!c.details.empty()) where = fmt::format(" (first at {})", to_string(c.details[0].where));
  c.message =
      fmt::format(
          "local_embs of MEAN table(s) {} hold per-rank means, not per-rank sums{}: the lookup "
          "kept "
          "PoolingMode.MEAN under row-wise sharding, so the module divides a second time. Under RW "
          "the lookup must run MEAN tables as SUM and leave the division to the module's "
          "mean-pooling step. ",
          mean_tables(plan_), where) +
      c.message;
}

void Replayer::diagnose_output_after_callback(CheckResult& c, const EmbTensor& replayed,
                                              const EmbTensor& golden, const Kjt& kjt,
                                              const TensorLayout& layout) const {
  const EmbTensor divided = mean_divided(plan_, kjt, replayed);
  const TensorDiff d = diff_tensors(golden, divided, diagnosis_tolerance(), layout, 1);
  if (!d.shape_ok || d.mismatches != 0) return;
  c.cause = "output captured after the module's mean pooling";
  c.message =
      "output equals the MEAN-divided result: it was captured after the module's "
      "mean-pooling callback, not from the output dist (which returns the sums of MEAN "
      "tables). Capture the dist's result as output and the module's result as module_output "
      "(a capture written by a dynemb-dist synth older than this rule holds divided values "
      "too: regenerate it with synth). " +
      c.message;
}

TensorLayout Replayer::output_layout(const Kjt& kjt, const EmbTensor& t) const {
  if (plan_.module == ModuleKind::sequence) return TensorLayout::sequence_output(plan_, kjt);
  if (t.shape.size() == 1) {
    std::vector<int64_t> bpf;
    for (int64_t f = 0; f < plan_.num_features(); ++f)
      bpf.push_back(kjt.is_vbe() ? kjt.stride_per_feature[size_t(f)] : kjt.stride());
    return TensorLayout::pooled_vbe_output(plan_, bpf);
  }
  return TensorLayout::pooled_output(plan_);
}

void Replayer::run() {
  if (!opt_.write_output.empty() && same_file(opt_.write_output, opt_.capture_path))
    throw UsageError(
        fmt::format("--write-output {}: that is the input capture, which replay "
                    "never modifies; choose another file",
                    opt_.write_output));
  CaptureReader reader(opt_.capture_path);
  capture_sha_ = start_capture_sha(opt_.capture_path);
  open_plan(reader);
  check_memory(reader);
  open_source_and_dist(reader);
  open_writer(reader);

  const std::vector<int64_t>& batches = rep_.info.batches;
  selected_ = std::set<int64_t>(batches.begin(), batches.end());
  // --write-output copies every batch, replayed or not; otherwise read only the selected.
  std::vector<int64_t> order = batches;
  if (writer_) {
    order.clear();
    for (int64_t k = 0; k < reader.num_batches(); ++k) order.push_back(k);
  }
  if (cb_.on_progress) measure_progress(reader);
  // One batch ahead: batch k+1 is read (and inflated, h5chunks.hpp) on another thread while
  // batch k is replayed, so reading and replaying overlap. libhdf5 is not thread-safe: while a
  // read is in flight no other thread calls it, so with --write-output (the writer calls libhdf5)
  // the loop stays sequential. Two batches must fit in memory. A read that fails is redone on
  // this thread by read_batch_keeping_going, which records the trouble rank by rank.
  // A batch replayed one destination at a time reads its rows as it goes: no read ahead.
  const bool prefetch = opt_.read_ahead > 0 && !writer_ && !stream_ && order.size() > 1 &&
                        2 * batch_bytes_ <= memory_budget() / 4 * 3;
  std::future<std::optional<Batch>> ahead;
  auto read_ahead = [&](int64_t k) -> std::future<std::optional<Batch>> {
    try {
      return std::async(std::launch::async, [this, &reader, k]() -> std::optional<Batch> {
        h5::quiet();  // libhdf5's error printing is per thread: errors are reported, not dumped
        try {
          return reader.read_batch(read_plan(), k);
        } catch (...) {  // Error, bad_alloc: read again on the replay's thread
          return std::nullopt;
        }
      });
    } catch (const std::system_error&) {  // no thread to be had: batch k is read in turn
      return {};
    }
  };
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t k = order[i];
    if (stream_ && selected_.count(k)) {
      const bool taken = replay_by_destination(reader, k);
      report_by_destination(k, taken);
      if (taken) {
        progress_batch_done(k);
        continue;
      }
    }
    std::optional<Batch> read;
    clock_.enter("read");
    if (ahead.valid()) read = ahead.get();
    if (!read) read = read_batch_keeping_going(reader, k);
    if (prefetch && i + 1 < order.size()) ahead = read_ahead(order[i + 1]);
    clock_.enter("replay");
    replay_read(k, read);
    if (selected_.count(k)) progress_batch_done(k);
  }
  clock_.enter("end");
  clock_.print();
  start();  // when every batch was trouble
  if (writer_ && troubles_ > 0) drop_writer();
  if (writer_) writer_->commit();
}

// The plan (the capture's, or --plan's with what differs), the tolerance and the batches.
void Replayer::open_plan(const CaptureReader& reader) {
  ReportInfo& info = rep_.info;
  if (!opt_.plan_path.empty()) {
    const std::string text = read_text_file(opt_.plan_path);
    const Plan override_plan = load_plan_or_throw(text, opt_.plan_path);
    plan_ = capture_plan(reader, &override_plan);
    info.plan = {opt_.plan_path, sha256_hex(text), false};
    setup_replan(reader);
  } else {
    plan_ = capture_plan(reader);
    info.plan = {opt_.capture_path + ":/plan", sha256_hex(reader.plan_text()), true};
  }
  info.module = to_string(plan_.module);
  info.world_size = plan_.world_size;
  info.num_batches = reader.num_batches();
  tol_ = opt_.tolerance ? *opt_.tolerance : default_tolerance(plan_);
  info.tolerance = tol_.str();
  info.batches = parse_batch_range(opt_.batches, reader.num_batches());
}

// The embedding source (oracle or weights) and the output dist, built once and latched across
// batches like the real module.
void Replayer::open_source_and_dist(const CaptureReader& reader) {
  source_ = open_embedding_source(reader, plan_);
  if (!source_)
    warn(
        "the capture has no /oracle and no /tables weights: the lookup check and the unsharded "
        "reference are skipped; the output dist runs on the captured local_embs (add /oracle or "
        "/tables/<name>/weight for them)");
  if (plan_.module == ModuleKind::sequence)
    seq_dist_ = std::make_unique<RwSequenceEmbeddingDist>(plan_, backend_);
  else
    pooled_dist_ = std::make_unique<RwPooledEmbeddingDist>(plan_, backend_);
}

// --write-output: the copy of the capture (its table weights first) whose outputs are replaced.
void Replayer::open_writer(const CaptureReader& reader) {
  if (!opt_.write_output_file && opt_.write_output.empty()) return;
  std::shared_ptr<OutputFile> out = opt_.write_output_file
                                        ? opt_.write_output_file
                                        : std::make_shared<OutputFile>(opt_.write_output);
  writer_ = std::make_unique<CaptureWriter>(out, plan_, reader.oracle_seed());
  for (const std::string& name : reader.weight_tables()) {
    const auto t = std::find_if(plan_.tables.begin(), plan_.tables.end(),
                                [&](const TableConfig& tc) { return tc.name == name; });
    if (t == plan_.tables.end()) continue;  // a table the plan does not use: not copied
    writer_->write_table_weight(name, t->data_type, t->num_embeddings, t->embedding_dim,
                                reader.read_table_weight(*t));
  }
}

// Trouble in a batch: --write-output is then incomplete, so it is not written at all.
void Replayer::drop_writer() {
  if (!writer_) return;
  writer_.reset();  // every handle closed, the temporary removed, the target untouched
  warn(
      fmt::format("--write-output {}: not written (trouble in batch {}); the file, if it "
                  "existed, is unchanged",
                  opt_.write_output, first_trouble_batch_));
}

// The first replayed batch decides --ctx automatic (captured when it has a ctx/ group), and
// the header is shown.
void Replayer::begin(int64_t k, const Batch& batch) {
  if (started_) return;
  bool any_ctx = false;
  for (const RankBatch& rb : batch.ranks) any_ctx |= rb.ctx.has_value();
  use_captured_ =
      opt_.ctx_mode == CtxMode::captured || (opt_.ctx_mode == CtxMode::automatic && any_ctx);
  if (opt_.ctx_mode == CtxMode::captured && !any_ctx)
    warn(
        fmt::format("--ctx captured: batch {} has no ctx/ group; the derived context is "
                    "used where none was captured (--ctx derived says so explicitly)",
                    k));
  rep_.info.ctx_mode = use_captured_ ? "captured" : "derived";
  // The header names the capture's hash, still being computed on another thread for a large
  // file: it is shown once the hash is there, or before the first check, whichever is first;
  // the batch goes on meanwhile.
  started_ = true;
  show_header_when_hashed();
}

void Replayer::show_header_when_hashed() {
  using namespace std::chrono_literals;
  if (started_ && !header_shown_ &&
      (!capture_sha_.valid() || capture_sha_.wait_for(0s) == std::future_status::ready))
    start();
}

// Batch k once read (nullopt: unreadable, its trouble recorded): checked, or only copied to
// --write-output when not selected; with --write-output, the replayed outputs replace the
// captured ones in the copy.
void Replayer::replay_read(int64_t k, std::optional<Batch>& read) {
  if (!read) {
    drop_writer();
    return;
  }
  Batch& batch = *read;
  const bool selected = selected_.count(k) > 0;
  if (replan_ && !rebase_batch(k, batch, selected)) {
    if (writer_) writer_->write_batch(batch);
    return;
  }
  if (!selected) {
    writer_->write_batch(batch);
    return;
  }
  begin(k, batch);
  std::vector<std::optional<EmbTensor>> outputs;
  try {
    at("replay", -1);
    outputs = replay_batch(k, batch);
    clock_.enter("replay");
  } catch (const Error& e) {
    record_trouble(k, -1, "replay", e.what());
    drop_writer();
    return;
  } catch (const std::bad_alloc&) {
    const std::string rank = at_.rank >= 0 ? fmt::format("rank {}", at_.rank) : "all ranks";
    record_trouble(k, at_.rank, at_.report_stage(),
                   fmt::format("{}:/batches/{}: {} in the {} step ({}) of this batch",
                               opt_.capture_path, k, out_of_memory_text(), at_.step, rank));
    drop_writer();
    return;
  }
  if (!writer_) return;
  for (size_t r = 0; r < batch.ranks.size(); ++r) {
    if (outputs[r]) {
      batch.ranks[r].output = std::move(*outputs[r]);
    } else if (batch.ranks[r].output) {
      warn(
          fmt::format("--write-output: batch {} rank {}: the output dist did not run; the "
                      "captured output is copied unchanged",
                      k, r));
    }
  }
  writer_->write_batch(batch);
}

// The steps of one batch, in the order a real job runs them: the input dist (derived from the
// KJTs), the contexts checked, the contexts the output dist gets, the lookup checked, the output
// dist run and each rank's output checked as it arrives. `at_` names the step and rank running,
// so trouble (out of memory included) is reported where it happened.
std::vector<std::optional<EmbTensor>> Replayer::replay_batch(int64_t k, const Batch& batch) {
  BatchState st(k, batch, plan_.world_size);
  derive_batch(st);
  check_contexts(st);
  choose_contexts(st);
  if (const int64_t width = slice_width(st); width > 0) {
    if (std::getenv("DYNEMB_SLICE_COLUMNS"))  // the test hook says it was taken
      std::fprintf(stderr, "DYNEMB_SLICE_COLUMNS: batch %lld: slices of %lld columns\n",
                   static_cast<long long>(k), static_cast<long long>(width));
    run_output_dist_sliced(st, width);  // nothing kept: no --write-output
    return std::vector<std::optional<EmbTensor>>(size_t(st.W));
  }
  check_lookup(st);
  return run_output_dist(st);
}

Replayer::BatchState::BatchState(int64_t k_, const Batch& batch_, int64_t W_)
    : k(k_),
      batch(batch_),
      W(W_),
      kjts(size_t(W_)),
      cap_ctx(size_t(W_), nullptr),
      cap_local(size_t(W_), nullptr),
      golden(size_t(W_), nullptr) {
  for (int64_t r = 0; r < W; ++r) {
    const RankBatch& rb = batch.ranks[size_t(r)];
    kjts[size_t(r)] = &rb.kjt;
    if (rb.ctx) cap_ctx[size_t(r)] = &*rb.ctx;
    if (rb.local_embs) cap_local[size_t(r)] = &*rb.local_embs;
    if (rb.output) golden[size_t(r)] = &*rb.output;
  }
}

// The input dist every rank ran: bucketize, the KJT all-to-all, the contexts.
void Replayer::derive_batch(BatchState& st) {
  at("input dist", -1);
  try {
    st.der = derive_input_dist(plan_, st.kjts, backend_);
  } catch (const OutputDistFailure& e) {
    throw Error(fmt::format("batch {}: input dist: {}", st.k, e.what()));
  } catch (const CaptureError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("{}:/batches/{}: {}", opt_.capture_path, st.k, e.what()));
  }
}

// 1. Captured context vs derived, field by field, and the plan-free checks.
void Replayer::check_contexts(BatchState& st) {
  const int64_t k = st.k, W = st.W;
  for (const RankBatch& rb : st.batch.ranks) ctx_seen_ |= rb.ctx.has_value();
  std::vector<int64_t> no_ctx;  // ranks of this batch without ctx/ while others have one
  for (int64_t r = 0; r < W; ++r) {
    at("ctx", int(r));
    const RankBatch& rb = st.batch.ranks[size_t(r)];
    if (!rb.ctx) {
      if (ctx_seen_) no_ctx.push_back(r);
      continue;
    }
    for (CheckResult& c : diff_context(plan_, k, int(r), rb.kjt, st.der.ranks[size_t(r)], *rb.ctx,
                                       opt_.max_mismatches)) {
      st.ctx_bad |= c.status == CheckStatus::fail;
      emit(std::move(c));
    }
  }
  if (!no_ctx.empty()) {
    warn(
        fmt::format("batch {}: rank(s) {} have no ctx/ group while other rank-batches have one: "
                    "their context checks are skipped and the output dist uses the derived "
                    "context for them",
                    k, fmt::join(no_ctx, ", ")));
    for (int64_t r : no_ctx)
      emit(skipped(k, int(r), "ctx", "context",
                   "no ctx/ group in this rank-batch (other rank-batches have one): the captured "
                   "context cannot be compared"));
  }
  at("ctx", -1);
  for (CheckResult& c : consistency_checks(plan_, k, st.kjts, st.cap_ctx, st.cap_local, st.golden,
                                           opt_.max_mismatches)) {
    st.ctx_bad |= c.status == CheckStatus::fail;
    emit(std::move(c));
  }
}

// 2. The context the output dist gets (captured fields over derived ones in --ctx captured),
// and the pooled module's variable-batch latch checked on it.
void Replayer::choose_contexts(BatchState& st) {
  const int64_t W = st.W;
  st.used.resize(size_t(W));
  st.used_ptr.resize(size_t(W));
  for (int64_t r = 0; r < W; ++r) {
    ShardingContext& d = st.der.ranks[size_t(r)].ctx;
    if (use_captured_ && st.cap_ctx[size_t(r)]) {
      st.used[size_t(r)] = merge_ctx(*st.cap_ctx[size_t(r)], d);
      st.used_ptr[size_t(r)] = &st.used[size_t(r)];
    } else {
      st.used_ptr[size_t(r)] = &d;  // not copied: a context holds id-sized vectors
    }
  }
  if (!pooled_dist_) return;
  const std::optional<bool> latched = pooled_dist_->latched_variable_batch();
  const bool mode = latched ? *latched : st.used_ptr[0]->variable_batch_per_feature.value_or(false);
  for (int64_t r = 0; r < W; ++r) {
    CheckResult c = latch_check(st.k, int(r),
                                st.used_ptr[size_t(r)]->variable_batch_per_feature.value_or(false),
                                mode, latched_batch_.value_or(st.k));
    st.ctx_bad |= c.status == CheckStatus::fail;
    emit(std::move(c));
  }
}

// The lookup of rank r (all ranks when r < 0) from the embedding source, with the file and the
// batch named on trouble (an out-of-table id gets the id, sample and routing).
// `slice`: only its columns (its plan and source).
template <class Fn>
auto Replayer::lookup_errors(const BatchState& st, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const LookupBoundsError& e) {
    throw Error(fmt::format("{}:/batches/{}: {}", opt_.capture_path, st.k,
                            describe_lookup_bounds_error(plan_, st.kjts, st.der, e)));
  } catch (const Error& e) {  // bounds_check=error: name the file and the batch
    throw Error(fmt::format("{}:/batches/{}: {}", opt_.capture_path, st.k, e.what()));
  }
}

std::vector<EmbTensor> Replayer::lookup(const BatchState& st, int r, const ColumnSlice* slice) {
  const Plan& plan = slice ? slice->plan : plan_;
  const EmbeddingSource& source = slice ? *slice->source : *source_;
  return lookup_errors(st, [&] {
    // A slice's lookups are only its dist's inputs: a device backend keeps them (lookup_for_dist).
    if (r < 0 && slice) return derive_dist_inputs(plan, st.der, source, backend_, st.k);
    if (r < 0) return derive_local_embs(plan, st.der, source, backend_, st.k);
    std::vector<EmbTensor> one;
    one.push_back(backend_.lookup(plan, r, st.der.ranks[size_t(r)].lookup_kjt, source));
    return one;
  });
}

// Rank r's lookup against the captured `got`, compared where the backend makes the lookup
// (Backend::lookup_differences: a device backend brings back only the tiles that differ, and
// keeps `got` for the pooled dist that follows). nullopt when the shapes differ: the host's diff
// says how.
std::optional<TensorDiff> Replayer::lookup_diff_where_made(const BatchState& st, int r,
                                                           const EmbTensor& got,
                                                           const TensorLayout& layout) {
  const LookupKjt& lk = st.der.ranks[size_t(r)].lookup_kjt;
  const int64_t n = got.numel(), maxm = opt_.max_mismatches;
  if (lookup_output_layout(plan_, lk).shape != got.shape || int64_t(got.data.size()) != n)
    return std::nullopt;
  const std::optional<std::vector<TileDiff>> tiles = lookup_errors(st, [&] {
    return backend_.lookup_differences(plan_, r, lk, *source_, got.data.data(), n,
                                       TileCompare{tol_, kCompareTile, maxm});
  });
  if (!tiles) return std::nullopt;
  TensorDiff d = diff_tiles(
      n, *tiles, tol_, [](int64_t e) { return e; }, maxm);
  locate_mismatches(d, layout);
  return d;
}

// 3. Lookup: captured local_embs vs the lookup derived from the embedding source. When the
// output dist needs derived lookups for some rank, all ranks are derived at once (they are kept
// for step 4); otherwise rank by rank, so only one derived lookup is in memory.
void Replayer::check_lookup(BatchState& st) {
  const int64_t W = st.W;
  bool need_all_derived = false;
  for (int64_t r = 0; r < W; ++r) need_all_derived |= !(use_captured_ && st.cap_local[size_t(r)]);
  if (!source_) return;  // no lookup to compare with (reported once in the warnings)
  if (need_all_derived) {
    at("lookup", -1);
    st.derived_local = lookup(st, -1);
  }
  for (int64_t r = 0; r < W; ++r) {
    if (!st.cap_local[size_t(r)]) continue;
    at("lookup", int(r));
    const TensorLayout layout = lookup_layout(st, int(r));
    const EmbTensor& got = *st.cap_local[size_t(r)];
    // Rank by rank, where the backend makes the lookup; the host makes it whole only when the
    // shapes differ or a MEAN diagnosis needs its sums.
    std::optional<TensorDiff> diff;
    if (!need_all_derived) diff = lookup_diff_where_made(st, int(r), got, layout);
    std::vector<EmbTensor> one;
    auto want = [&]() -> const EmbTensor& {
      if (need_all_derived) return st.derived_local[size_t(r)];
      if (one.empty()) one = lookup(st, int(r));
      return one[0];
    };
    if (!diff) diff = diff_tensors(got, want(), tol_, layout, opt_.max_mismatches);
    CheckResult c = tensor_check(st.k, int(r), "lookup", "local_embs", "captured", "derived",
                                 std::move(*diff), tol_);
    if (c.status == CheckStatus::fail && plan_.any_mean && plan_.module == ModuleKind::pooled)
      diagnose_local_means(c, got, want(), st.der.ranks[size_t(r)].lookup_kjt, layout);
    st.lookup_bad |= c.status == CheckStatus::fail;
    emit(std::move(c));
  }
}

// Where an element of rank r's local_embs lies: feature, source rank, sample, position.
TensorLayout Replayer::lookup_layout(const BatchState& st, int r) const {
  const ShardingContext& dc = st.der.ranks[size_t(r)].ctx;
  if (plan_.module == ModuleKind::sequence)
    return TensorLayout::sequence_local_embs(
        plan_, st.der.ranks[size_t(r)].lookup_kjt.lengths,
        dc.batch_size_per_rank.value_or(std::vector<int64_t>{}));
  if (dc.batch_size_per_rank_per_feature)
    return TensorLayout::pooled_vbe_local_embs(plan_, *dc.batch_size_per_rank_per_feature);
  return TensorLayout::pooled_local_embs(plan_,
                                         dc.batch_size_per_rank.value_or(std::vector<int64_t>{}));
}

// The cause a failed check names, from the evidence of the batch so far.
std::string Replayer::BatchState::cause_before_output() const {
  return ctx_bad ? "context" : lookup_bad ? "lookup/local_embs" : "";
}

// 4a. Rank r's output as the output dist hands it over: vs golden, vs the unsharded reference,
// and the module's output after the mean-pooling step.
// `held`: the backend holds the output (out has its shape, no data), and both checks are made
// where it is.
void Replayer::check_output(BatchState& st, int r, EmbTensor&& out,
                            std::vector<std::optional<EmbTensor>>& kept, bool held) {
  const int64_t k = st.k, maxm = opt_.max_mismatches;
  at("output", r);
  st.got[size_t(r)] = true;
  const RankBatch& rb = st.batch.ranks[size_t(r)];
  const TensorLayout layout = output_layout(rb.kjt, out);
  std::optional<CheckResult> gold, ref;
  if (rb.output)
    gold = tensor_check(k, r, "output", "golden", "replayed", "golden",
                        held ? held_golden_diff(st, r, out, layout)
                             : diff_tensors(out, *rb.output, tol_, layout, maxm),
                        tol_);
  if (source_) {
    at("reference", r);
    TensorDiff d = held ? held_reference_diff(st, r, out, layout)
                        : diff_tensors(out, reference(st, r), tol_, layout, maxm);
    ref = tensor_check(k, r, "output", "reference", "replayed", "reference", std::move(d), tol_);
  }
  emit_output_checks(st, r, std::move(gold), std::move(ref), held ? nullptr : &out);
  if (!opt_.write_output.empty()) kept[size_t(r)] = std::move(out);
}

bool Replayer::outputs_may_stay(const BatchState& st) const {
  if (!opt_.write_output.empty()) return false;
  for (const RankBatch& rb : st.batch.ranks) {
    if (rb.module_output) return false;
    if (rb.output && plan_.any_mean && plan_.module == ModuleKind::pooled) return false;
  }
  return true;
}

// The held output of rank r against its golden output: what diff_tensors says of the pair.
TensorDiff Replayer::held_golden_diff(const BatchState& st, int r, const EmbTensor& out,
                                      const TensorLayout& layout) {
  const EmbTensor& golden = *st.batch.ranks[size_t(r)].output;
  const int64_t n = out.numel(), maxm = opt_.max_mismatches;
  if (golden.shape != out.shape || int64_t(golden.data.size()) != n)
    return shape_mismatch(out.shape, golden.shape);
  const std::optional<std::vector<TileDiff>> tiles = backend_.held_output_differences(
      r, golden.data.data(), n, TileCompare{tol_, kCompareTile, maxm});
  if (!tiles)
    throw Error(
        fmt::format("batch {} rank {}: the backend holds no output of {} elements", st.k, r, n));
  TensorDiff d = diff_tiles(
      n, *tiles, tol_, [](int64_t e) { return e; }, maxm);
  locate_mismatches(d, layout);
  return d;
}

// The held output of rank r against its unsharded reference, made and compared where the
// output is: what diff_tensors says of the pair.
TensorDiff Replayer::held_reference_diff(const BatchState& st, int r, const EmbTensor& out,
                                         const TensorLayout& layout) {
  const Kjt& kjt = st.batch.ranks[size_t(r)].kjt;
  const int64_t n = out.numel(), maxm = opt_.max_mismatches;
  std::optional<std::vector<TileDiff>> tiles;
  try {
    tiles = backend_.reference_differences(plan_, r, kjt, *source_, st.k, nullptr, r, n,
                                           TileCompare{tol_, kCompareTile, maxm});
  } catch (const CaptureError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("unsharded reference: {}", e.what()));
  }
  const std::vector<int64_t> want = reference_shape(plan_, kjt);
  if (!tiles || want != out.shape) return shape_mismatch(out.shape, want);
  TensorDiff d = diff_tiles(
      n, *tiles, tol_, [](int64_t e) { return e; }, maxm);
  locate_mismatches(d, layout);
  return d;
}

// The unsharded reference of rank r (`slice`: its columns).
EmbTensor Replayer::reference(const BatchState& st, int r, const ColumnSlice* slice) {
  try {
    return reference_output(slice ? slice->plan : plan_, r, st.batch.ranks[size_t(r)].kjt,
                            slice ? *slice->source : *source_, st.k);
  } catch (const CaptureError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("unsharded reference: {}", e.what()));
  }
}

// Rank r's output checks decided (vs golden, vs reference), with their causes, and the module's
// output after the mean-pooling step. `out`, the replayed output, is needed for the MEAN
// diagnosis and the module output (a sliced batch has neither: slice_width).
void Replayer::emit_output_checks(BatchState& st, int r, std::optional<CheckResult> gold,
                                  std::optional<CheckResult> ref, const EmbTensor* out) {
  const int64_t k = st.k, maxm = opt_.max_mismatches;
  const RankBatch& rb = st.batch.ranks[size_t(r)];
  const std::string upstream = st.cause_before_output();
  const bool ref_ok = ref && ref->status == CheckStatus::pass;
  if (ref && ref->status == CheckStatus::fail)
    ref->cause = !upstream.empty() ? upstream
                                   : "engine (consistent context and lookup, yet the sharded "
                                     "path differs from the unsharded reference)";
  if (gold && gold->status == CheckStatus::fail) {
    gold->cause = !upstream.empty() ? upstream
                  : ref_ok          ? "data (golden output)"
                  : ref             ? "undetermined (the replay differs from the reference too)"
                                    : "undetermined (no embedding source for a reference)";
    if (plan_.any_mean && plan_.module == ModuleKind::pooled && out)
      diagnose_output_after_callback(*gold, *out, *rb.output, rb.kjt, output_layout(rb.kjt, *out));
  }
  if (gold) emit(std::move(*gold));
  if (ref) emit(std::move(*ref));
  if (rb.module_output && out) {
    at("module", r);
    CheckResult m;
    try {
      const EmbTensor mo =
          module_output(plan_, rb.kjt, *out, rb.inverse_indices ? &*rb.inverse_indices : nullptr);
      m = tensor_check(
          k, r, "module", "module_output", "replayed", "captured",
          diff_tensors(mo, *rb.module_output, tol_, TensorLayout::pooled_output(plan_), maxm),
          tol_);
    } catch (const Error& e) {
      m = skipped(k, r, "module", "module_output", e.what());
    }
    if (m.status == CheckStatus::fail)
      m.cause = !upstream.empty() ? upstream
                : gold && gold->status == CheckStatus::fail
                    ? "the dist's output already differs"
                    : "data (module output: the mean-pooling step after the dist)";
    emit(std::move(m));
  }
  progress_rank_done(k);
}

void Replayer::measure_progress(const CaptureReader& reader) {
  progress_.batches_total = int64_t(rep_.info.batches.size());
  progress_.rank_batches_total = progress_.batches_total * plan_.world_size;
  for (int64_t k : rep_.info.batches) {
    double bytes = 0;
    for (const DatasetStat& d : reader.dataset_stats(k)) bytes += double(d.logical_bytes);
    batch_bytes_of_[k] = bytes;
    progress_.bytes_total += bytes;
  }
}

void Replayer::progress_rank_done(int64_t k) {
  if (!cb_.on_progress) return;
  show_header_when_hashed();  // before the bar moves on under a missing header
  const int64_t W = std::max<int64_t>(1, plan_.world_size);
  if (ranks_done_in_batch_ >= W) return;
  ++ranks_done_in_batch_;
  ++progress_.rank_batches_done;
  progress_.bytes_done += batch_bytes_of_[k] / double(W);
  cb_.on_progress(progress_);
}

// The rest of batch k (ranks whose output dist did not run, or trouble) counts as done.
void Replayer::progress_batch_done(int64_t k) {
  if (!cb_.on_progress) return;
  const int64_t W = std::max<int64_t>(1, plan_.world_size);
  progress_.rank_batches_done += W - ranks_done_in_batch_;
  progress_.bytes_done += batch_bytes_of_[k] * double(W - ranks_done_in_batch_) / double(W);
  ranks_done_in_batch_ = 0;
  ++progress_.batches_done;
  cb_.on_progress(progress_);
}

// Every output check of the ranks the output dist has not handed over, skipped with `why`.
void Replayer::skip_outputs(const BatchState& st, const std::string& why) {
  for (int64_t r = 0; r < st.W; ++r) {
    if (st.got[size_t(r)]) continue;
    if (st.golden[size_t(r)]) emit(skipped(st.k, int(r), "output", "golden", why));
    if (source_) emit(skipped(st.k, int(r), "output", "reference", why));
    if (st.batch.ranks[size_t(r)].module_output)
      emit(skipped(st.k, int(r), "module", "module_output", why));
  }
}

// 4. The output dist on the chosen inputs (captured local_embs in --ctx captured, else the
// derived lookups), each rank's output checked as it arrives. Returns the outputs for
// --write-output (rank order), nullopt where the dist did not run.
std::vector<std::optional<EmbTensor>> Replayer::run_output_dist(BatchState& st) {
  const int64_t W = st.W;
  std::vector<const EmbTensor*> local(size_t(W), nullptr);
  bool runnable = true;
  for (int64_t r = 0; r < W; ++r) {
    if (use_captured_ && st.cap_local[size_t(r)])
      local[size_t(r)] = st.cap_local[size_t(r)];
    else if (!st.derived_local.empty())
      local[size_t(r)] = &st.derived_local[size_t(r)];
    else if (st.cap_local[size_t(r)])  // --ctx derived without an embedding source
      local[size_t(r)] = st.cap_local[size_t(r)];
    runnable &= local[size_t(r)] != nullptr;
  }
  std::vector<std::optional<EmbTensor>> kept(static_cast<size_t>(W));
  st.got.assign(size_t(W), false);
  if (!runnable) {
    if (!warned_no_local_)
      warn(
          "some ranks have no local_embs and there is no embedding source to derive them: "
          "their output dist is not run; synth or capture with --store local_embs, or add /oracle "
          "or /tables/<name>/weight to the capture");
    warned_no_local_ = true;
    skip_outputs(st, "no local_embs captured and no embedding source to derive them");
    return kept;
  }
  at("output dist", -1);
  // Outputs checked where the backend makes them when the host needs none of them whole.
  std::optional<HeldOutputs> held;
  if (outputs_may_stay(st)) held.emplace(backend_);
  const bool on = held && held->on;
  auto sink = [&](int r, EmbTensor&& out) {
    check_output(st, r, std::move(out), kept, on);
    at("output dist", -1);
  };
  try {
    if (seq_dist_) {
      seq_dist_->forward(local, st.used_ptr, sink);
    } else {
      pooled_dist_->forward(st.k, local, st.used_ptr, sink);
      if (!latched_batch_ && pooled_dist_->latched_variable_batch()) latched_batch_ = st.k;
    }
  } catch (const OutputDistFailure& e) {
    output_dist_failed(st, e);
  }
  return kept;
}

// The width of this batch's column slices, 0 to run it whole. Slices pay off when the output
// dist runs on lookups derived from the embedding source (all W of them in memory at once
// otherwise), and are taken only where the sliced checks are exactly the whole ones and no whole
// output must be kept: no --write-output, no captured local_embs (their lookup check and the
// dist over captured rows stay whole), no module_output (the mean-pooling step and its check
// take whole outputs), no golden output of a MEAN pooled plan (its diagnosis divides whole
// outputs), and for a variable batch the contexts' batch_size_per_rank_per_feature as derived
// (the reduce-scatter's chunks then hold whole bags, so a column of each is reduced on its own;
// a captured context that cuts bags elsewhere runs whole, to give the whole batch's result).
int64_t Replayer::slice_width(const BatchState& st) const {
  if (slice_cols_ <= 0 || slice_cols_ >= embedding_columns(plan_) || !source_ || writer_) return 0;
  for (int64_t r = 0; r < st.W; ++r) {
    const RankBatch& rb = st.batch.ranks[size_t(r)];
    if (rb.local_embs || rb.module_output) return 0;
    if (rb.output && plan_.any_mean && plan_.module == ModuleKind::pooled) return 0;
  }
  if (plan_.module == ModuleKind::pooled) {
    bool vbe = st.der.variable_batch || pooled_dist_->latched_variable_batch().value_or(false);
    for (const ShardingContext* c : st.used_ptr)
      vbe |= c->variable_batch_per_feature.value_or(false);
    for (int64_t r = 0; vbe && r < st.W; ++r)
      if (st.used_ptr[size_t(r)]->batch_size_per_rank_per_feature !=
          st.der.ranks[size_t(r)].ctx.batch_size_per_rank_per_feature)
        return 0;
  }
  return slice_cols_;
}

// 3-4 over column slices [c0, c0 + width): the W lookups of the slice, the output dist on them
// and each rank's output slice diffed with the golden output's and the reference's; the checks
// are emitted once every slice is merged, in the order the whole batch emits them. The context
// checks the dist makes (dist_checks.hpp) run first on the whole shapes, so a context that
// cannot work fails with the whole batch's words and numbers.
void Replayer::run_output_dist_sliced(BatchState& st, int64_t width) {
  const int64_t W = st.W, C = embedding_columns(plan_), k = st.k;
  st.got.assign(size_t(W), false);
  std::vector<SlicedDiffs> diffs(static_cast<size_t>(W));
  std::vector<EmbTensor> local;  // [W]: the slice of every rank's lookup
  std::vector<const EmbTensor*> local_ptr(static_cast<size_t>(W));
  bool variable_batch = false;
  // Each output slice checked where the backend makes it (slice_width: the host needs none
  // whole).
  const HeldOutputs held(backend_);
  for (int64_t c0 = 0; c0 < C; c0 += width) {
    ColumnSlice slice = make_column_slice(plan_, source_, c0, std::min(C, c0 + width));
    // warn_zero_row warns of out-of-table ids once per lookup of the batch: on the first slice.
    // The rows looked up are those of `ignore` (lookup_row does not tell them apart).
    if (c0 > 0 && slice.plan.bounds_check == BoundsCheck::warn_zero_row)
      slice.plan.bounds_check = BoundsCheck::ignore;
    local.clear();  // the previous slice's, before the next is made
    at("lookup", -1);
    local = lookup(st, -1, &slice);
    for (int64_t r = 0; r < W; ++r) local_ptr[size_t(r)] = &local[size_t(r)];
    if (c0 == 0) drop_derived_extras(st);
    at("output dist", -1);
    try {
      if (c0 == 0) {
        std::vector<EmbTensor> whole(static_cast<size_t>(W));  // shapes only
        std::vector<const EmbTensor*> whole_ptr(static_cast<size_t>(W));
        for (int64_t r = 0; r < W; ++r) {
          whole[size_t(r)] =
              whole_lookup_shape(plan_, st.der.ranks[size_t(r)].lookup_kjt, local[size_t(r)]);
          whole_ptr[size_t(r)] = &whole[size_t(r)];
        }
        if (seq_dist_)
          check_sequence_dist(plan_, whole_ptr, st.used_ptr);
        else
          variable_batch = pooled_dist_->check(k, whole_ptr, st.used_ptr);
      }
      auto sink = [&](int r, EmbTensor&& out) {
        check_output_slice(st, r, slice, out, held.on, diffs[size_t(r)]);
        at("output dist", -1);
      };
      if (seq_dist_)
        backend_.sequence_output_dist(slice.plan, local_ptr, st.used_ptr, sink);
      else
        backend_.pooled_output_dist(slice.plan, variable_batch, local_ptr, st.used_ptr, sink);
    } catch (const OutputDistFailure& e) {
      output_dist_failed(st, e);
      return;
    }
  }
  local.clear();
  if (pooled_dist_ && !latched_batch_ && pooled_dist_->latched_variable_batch()) latched_batch_ = k;
  for (int64_t r = 0; r < W; ++r) {
    SlicedDiffs& d = diffs[size_t(r)];
    if (d.whole_shape.empty()) continue;  // never handed over
    at("output", int(r));
    st.got[size_t(r)] = true;
    EmbTensor shape;
    shape.shape = d.whole_shape;
    const TensorLayout layout = output_layout(st.batch.ranks[size_t(r)].kjt, shape);
    std::optional<CheckResult> gold, ref;
    if (d.gold) {
      locate_mismatches(*d.gold, layout);
      gold = tensor_check(k, int(r), "output", "golden", "replayed", "golden", *d.gold, tol_);
    }
    locate_mismatches(*d.ref, layout);
    ref = tensor_check(k, int(r), "output", "reference", "replayed", "reference", *d.ref, tol_);
    emit_output_checks(st, int(r), std::move(gold), std::move(ref), nullptr);
  }
}

// Once the first slice is looked up, the bucketize outputs are read no more (they trace an
// out-of-table id to its origin, and the first slice's lookup met every id): W times three
// id-sized vectors, given to the slices.
void Replayer::drop_derived_extras(BatchState& st) {
  for (DerivedRank& d : st.der.ranks) d.bucketized = BucketizedKjt{};
}

// Rank r's output slice `out`: diffed with the same columns of its golden output and of its
// unsharded reference, merged into `d`. A pair whose whole shapes differ is decided on the
// first slice (shape_mismatch, as the whole diff says it) and not compared further. `held`: the
// backend holds the slice (out has its shape, no data), and both are compared where it is.
void Replayer::check_output_slice(BatchState& st, int r, const ColumnSlice& slice,
                                  const EmbTensor& out, bool held, SlicedDiffs& d) {
  const int64_t maxm = opt_.max_mismatches;
  at("output", r);
  const RankBatch& rb = st.batch.ranks[size_t(r)];
  const SliceLayout l = output_slice_layout(plan_, slice, out, rb.kjt);
  const auto to_whole = [&l](int64_t e) { return l.to_whole(e); };
  if (d.whole_shape.empty()) {
    d.whole_shape = l.whole_shape;
    if (rb.output) {
      const int64_t n = EmbTensor{DType::f32, l.whole_shape, {}}.numel();
      d.gold = rb.output->shape == l.whole_shape && int64_t(rb.output->data.size()) == n
                   ? TensorDiff{}
                   : shape_mismatch(l.whole_shape, rb.output->shape);
    }
  }
  if (d.gold && d.gold->shape_ok) {
    EmbTensor want{rb.output->dtype, out.shape, std::vector<float>(size_t(out.numel()))};
    l.gather(rb.output->data.data(), want.data.data());
    if (!held) {
      merge_diff(*d.gold, diff_part(out, want, tol_, to_whole, maxm), maxm);
    } else {
      const std::optional<std::vector<TileDiff>> tiles = backend_.held_output_differences(
          r, want.data.data(), out.numel(), TileCompare{tol_, kCompareTile, maxm});
      if (!tiles)
        throw Error(fmt::format("batch {} rank {}: the backend holds no output of {} elements",
                                st.k, r, out.numel()));
      merge_diff(*d.gold, diff_tiles(out.numel(), *tiles, tol_, to_whole, maxm), maxm);
    }
  }
  if (d.ref && !d.ref->shape_ok) return;
  at("reference", r);
  if (!d.ref) {
    const EmbTensor want{out.dtype, reference_shape(slice.plan, rb.kjt), {}};
    const SliceLayout lw = output_slice_layout(plan_, slice, want, rb.kjt);
    d.ref = lw.whole_shape == l.whole_shape ? TensorDiff{}
                                            : shape_mismatch(l.whole_shape, lw.whole_shape);
    if (!d.ref->shape_ok) return;
  }
  // Compared as the backend makes the reference's runs: no reference tensor when they agree.
  std::optional<std::vector<TileDiff>> tiles;
  try {
    tiles = backend_.reference_differences(slice.plan, r, rb.kjt, *slice.source, st.k,
                                           held ? nullptr : out.data.data(), held ? r : -1,
                                           out.numel(), TileCompare{tol_, kCompareTile, maxm});
  } catch (const CaptureError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("unsharded reference: {}", e.what()));
  }
  if (!tiles)
    throw Error(fmt::format("unsharded reference of batch {} rank {}: not {} elements", st.k, r,
                            out.numel()));
  merge_diff(*d.ref, diff_tiles(out.numel(), *tiles, tol_, to_whole, maxm), maxm);
}

// The crash a real rank would have had: a context mismatch finding, not trouble; no output
// checks for the ranks not handed over.
void Replayer::output_dist_failed(BatchState& st, const OutputDistFailure& e) {
  CheckResult c;
  c.batch = st.k;
  c.rank = e.rank();
  c.stage = "ctx";
  c.check = "output_dist";
  c.status = CheckStatus::fail;
  c.mismatches = 1;
  c.compared = 1;
  c.message = fmt::format("the output dist cannot run with this context (field {}): {}", e.field(),
                          e.what());
  emit(std::move(c));
  skip_outputs(st, fmt::format("the output dist failed on rank {} ({})", e.rank(), e.field()));
}

// ---------------------------------------------------------------- one destination at a time

// Batch k one destination rank at a time (dest_blocks.hpp), its checks emitted only once the
// whole batch went through; false, with nothing of it counted (checks, warnings, progress),
// when the batch must run whole: a rank without local_embs or with a module_output, --ctx
// derived, a context that differs from the derived one (the blocks then are not the lookup's
// bags), or trouble of any kind (the whole run reports it in its own words).
bool Replayer::replay_by_destination(const CaptureReader& reader, int64_t k) {
  clock_.enter("read");
  std::optional<Batch> batch;
  ReadParts shapes;  // the KJTs and contexts; local_embs and outputs checked, not read
  shapes.float_data = false;
  try {
    batch = reader.read_batch(read_plan(), k, shapes);
  } catch (const std::exception&) {  // Error, bad_alloc: the whole read says what and where
    return false;
  }
  for (const RankBatch& rb : batch->ranks)
    if (!rb.local_embs || rb.module_output) return false;
  begin(k, *batch);
  if (!use_captured_) return false;
  const size_t warned = rep_.warnings.size();
  const ReplayProgress progress = progress_;
  const int64_t ranks_done = ranks_done_in_batch_;
  deferring_ = true;
  bool ok = false;
  try {
    BatchState st(k, *batch, plan_.world_size);
    ok = stream_batch(reader, st);
  } catch (const std::exception&) {
    ok = false;
  }
  deferring_ = false;
  std::vector<CheckResult> checks = std::move(pending_);
  pending_.clear();
  if (!ok) {
    rep_.warnings.resize(warned);
    progress_ = progress;
    ranks_done_in_batch_ = ranks_done;
    return false;
  }
  for (CheckResult& c : checks) emit(std::move(c));
  clock_.enter("replay");
  return true;
}

// A unit of a batch replayed by destination: destination d's whole output, or rows [r0, r1) of
// it (pooled, not variable-batch: the senders' chunks are summed row by row, so a few rows at a
// time keep a unit's blocks within kUnitBytes whatever the batch size).
struct DestUnit {
  int64_t d = 0;
  bool rows = false;  // false: the whole destination
  int64_t r0 = 0, r1 = 0;
};
constexpr double kUnitBytes = 64.0 * (1 << 20);

// The block of sender s in unit u.
DestBlock unit_block(const std::vector<std::vector<DestBlock>>& where, int64_t s,
                     const DestUnit& u) {
  const DestBlock& b = where[size_t(s)][size_t(u.d)];
  return u.rows ? block_rows(b, u.r0, u.r1) : b;
}

// What a unit's checks read from the capture: the block of every sender and the unit's rows
// of the golden output (when captured).
struct DestRows {
  std::vector<EmbTensor> blocks;  // pooled: [W] the senders' chunks
  EmbTensor recv;                 // sequence: what d receives, the senders' blocks in rank order
  std::vector<int64_t> recv_off;  // sequence: [W + 1] where each block starts in recv (elements)
  std::optional<EmbTensor> golden;

  // Sender s's block: its first element.
  const float* block(size_t s) const {
    return blocks.empty() ? recv.data.data() + recv_off[s] : blocks[s].data.data();
  }
};

// Unit u's rows, read on the calling thread (the only one calling libhdf5 meanwhile).
// The float buffers of units already checked, handed back to the reader for the next ones: a
// pooled destination's units are all one size, so their memory is neither zeroed nor faulted
// in again. Holds one unit's worth at most; shared by the checking and the reading thread.
class SpareRows {
 public:
  explicit SpareRows(size_t most) : most_(most) {}
  std::vector<std::vector<float>> take(size_t n) {
    std::lock_guard<std::mutex> lock(m_);
    std::vector<std::vector<float>> out;
    while (out.size() < n && !spare_.empty()) {
      out.push_back(std::move(spare_.back()));
      spare_.pop_back();
    }
    return out;
  }
  void give(std::vector<float>&& v) {
    std::lock_guard<std::mutex> lock(m_);
    if (spare_.size() < most_) spare_.push_back(std::move(v));
  }

 private:
  std::mutex m_;
  size_t most_;
  std::vector<std::vector<float>> spare_;
};

DestRows read_unit(const CaptureReader& reader, int64_t k, const DestUnit& u, bool sequence,
                   const std::vector<std::vector<DestBlock>>& where,
                   const std::vector<const EmbTensor*>& local, const EmbTensor* golden,
                   SpareRows& spare) {
  const size_t W = where.size();
  std::vector<DestBlock> b;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges(W);
  for (size_t s = 0; s < W; ++s) {
    b.push_back(unit_block(where, int64_t(s), u));
    ranges[s] = b.back().ranges;
  }
  const DType dt = local[0]->dtype;  // the plan's data_type on every rank (read_batch checks)
  DestRows out;
  if (sequence) {  // one buffer: the blocks are what d receives, in rank order
    out.recv.dtype = dt;
    out.recv.data = reader.read_rows_concat(k, "local_embs", dt, ranges, out.recv_off);
    out.recv.shape = {out.recv_off.back() / std::max<int64_t>(1, b[0].row_elems), b[0].row_elems};
  } else {
    std::vector<std::vector<float>> rows =
        reader.read_rows(k, "local_embs", dt, ranges, spare.take(W));
    for (size_t s = 0; s < W; ++s) out.blocks.push_back({dt, b[s].shape, std::move(rows[s])});
  }
  if (!golden) return out;
  if (!u.rows) {
    out.golden = EmbTensor{golden->dtype, golden->shape,
                           reader.read_rows(k, u.d, "output", golden->dtype, whole_rows(*golden))};
  } else {
    std::vector<std::pair<int64_t, int64_t>> gr;
    if (u.r1 > u.r0) gr.emplace_back(u.r0, u.r1);
    out.golden = EmbTensor{golden->dtype,
                           {u.r1 - u.r0, golden->cols()},
                           reader.read_rows(k, u.d, "output", golden->dtype, gr)};
  }
  return out;
}

// Where every unit's blocks lie ([s][d]) and the units, in destination order; false when the
// sequence dist's send order is not increasing (the batch then runs whole).
bool Replayer::plan_units(BatchState& st, std::vector<std::vector<DestBlock>>& where,
                          std::vector<DestUnit>& units, bool& variable_batch) {
  const int64_t W = st.W;
  std::optional<SequenceDistCheck> seq;
  std::optional<PooledDistCheck> pooled;
  variable_batch = false;
  if (seq_dist_) {
    seq = check_sequence_dist(plan_, st.cap_local, st.used_ptr);
  } else {
    variable_batch = pooled_dist_->check(st.k, st.cap_local, st.used_ptr);
    pooled = check_pooled_dist(plan_, variable_batch, st.cap_local, st.used_ptr);
  }
  where.assign(size_t(W), {});
  for (int64_t s = 0; s < W; ++s)
    for (int64_t d = 0; d < W; ++d) {
      if (pooled) {
        where[size_t(s)].push_back(pooled_block(*pooled, s, d, plan_.sum_dim, variable_batch));
        continue;
      }
      std::optional<DestBlock> b = sequence_block(seq->senders[size_t(s)], d, plan_.seq_dim());
      if (!b) return false;
      where[size_t(s)].push_back(std::move(*b));
    }
  int64_t step = std::max<int64_t>(1, int64_t(kUnitBytes / (4.0 * double(W * plan_.sum_dim))));
  if (const char* e = std::getenv("DYNEMB_DESTINATION_ROWS"); e && std::atoll(e) > 0)
    step = std::atoll(e);  // test hook: units of at most this many rows
  for (int64_t d = 0; d < W; ++d) {
    if (!pooled || variable_batch || plan_.sum_dim == 0) {
      units.push_back({d});
      continue;
    }
    const int64_t B = pooled->chunk_len[size_t(d)] / plan_.sum_dim;
    if (B == 0) units.push_back({d, true, 0, 0});
    for (int64_t r0 = 0; r0 < B; r0 += step) units.push_back({d, true, r0, std::min(B, r0 + step)});
  }
  return true;
}

// Unit u's output checks, merged into d's: `out` (the unit's rows of d's output, as the dist
// handed it to its sink; held by the backend when `held`) against the unit's golden rows and
// against the unsharded reference of its samples, each compared where the backend has them.
// False when the unit cannot be checked this way (the batch then runs whole).
bool Replayer::check_unit_output(BatchState& st, const DestUnit& u, const EmbTensor& out,
                                 const std::optional<EmbTensor>& golden, const TileCompare& how,
                                 bool held, DestChecks& dest) {
  const int64_t d = u.d, maxm = how.max_report;
  const int64_t off = u.rows ? u.r0 * out.cols() : 0;  // out's first element in d's output
  const auto to_whole = [off](int64_t e) { return off + e; };
  // The dist's output of d: rank d's of the pooled dist, the one rank's of the sequence
  // destination's dist (destination_output).
  const int held_rank = held ? int(seq_dist_ ? 0 : d) : -1;
  if (!held && int64_t(out.data.size()) != out.numel()) return false;
  if (golden) {
    if (golden->shape != out.shape) return false;
    const std::optional<std::vector<TileDiff>> tiles =
        held ? backend_.held_output_differences(held_rank, golden->data.data(), out.numel(), how)
             : tile_diffs(out.data.data(), golden->data.data(), out.numel(), how);
    if (!tiles) return false;
    merge_diff(dest.gold, diff_tiles(out.numel(), *tiles, tol_, to_whole, maxm), maxm);
  }
  dest.whole_shape = out.shape;  // of d's output
  if (u.rows)
    dest.whole_shape = {st.golden[size_t(d)] ? st.golden[size_t(d)]->rows() : 0, out.cols()};
  if (!source_) return true;
  at("reference", int(d));
  const Kjt& kjt_d = st.batch.ranks[size_t(d)].kjt;
  if (u.rows) dest.whole_shape = {kjt_d.stride(), out.cols()};
  const std::optional<std::vector<TileDiff>> tiles =
      backend_.reference_differences(plan_, int(d), u.rows ? kjt_samples(kjt_d, u.r0, u.r1) : kjt_d,
                                     *source_, st.k, out.data.data(), held_rank, out.numel(), how);
  if (!tiles) return false;
  merge_diff(dest.ref, diff_tiles(out.numel(), *tiles, tol_, to_whole, maxm), maxm);
  return true;
}

// The steps of replay_batch with the data read block by block: for each unit (a destination d,
// or some rows of it), the block of every sender (a part of its lookup check), the unit's
// output from those blocks alone and its part of d's output checks, while the next unit's rows
// are read on another thread. Emitted in the whole batch's order: contexts, lookups by rank,
// outputs by rank.
bool Replayer::stream_batch(const CaptureReader& reader, BatchState& st) {
  const int64_t W = st.W, k = st.k, maxm = opt_.max_mismatches;
  derive_batch(st);
  check_contexts(st);
  choose_contexts(st);
  if (st.ctx_bad) return false;
  drop_derived_extras(st);  // trouble reruns the batch whole, which derives them again
  at("output dist", -1);    // the dist's own checks on the whole shapes (no data needed)
  std::vector<std::vector<DestBlock>> where;  // [s][d]
  std::vector<DestUnit> units;
  bool variable_batch = false;
  if (!plan_units(st, where, units, variable_batch)) return false;
  SpareRows spare(static_cast<size_t>(W));
  // Compared where the backend makes them: only the tiles that add to a diff come back, and the
  // dist's outputs stay where it makes them (a device backend's memory) for their checks.
  const TileCompare how{tol_, kCompareTile, maxm};
  const HeldOutputs held(backend_);
  const auto read = [&](size_t i) {
    h5::quiet();  // libhdf5's error printing is per thread: errors are reported, not dumped
    return read_unit(reader, k, units[i], seq_dist_ != nullptr, where, st.cap_local,
                     st.golden[size_t(units[i].d)], spare);
  };
  const bool ahead = opt_.read_ahead > 0;  // --read-ahead 0: read, then check, in turn
  std::future<DestRows> next = read_ahead_task(read, size_t{0}, ahead);
  std::vector<TensorDiff> looked(static_cast<size_t>(W));  // [s]: the lookup check, merged
  std::vector<std::vector<int64_t>> value_off(static_cast<size_t>(W));  // [s]: of its lookup KJT
  for (int64_t s = 0; source_ && s < W; ++s)
    value_off[size_t(s)] = complete_cumsum(st.der.ranks[size_t(s)].lookup_kjt.lengths);
  std::vector<std::optional<CheckResult>> gold(static_cast<size_t>(W)), ref(gold.size());
  DestChecks dest;  // destination d's output checks, merged over its units
  st.got.assign(size_t(W), false);
  for (size_t i = 0; i < units.size(); ++i) {
    const DestUnit& u = units[i];
    const int64_t d = u.d;
    at("read", int(d));
    DestRows rows = next.get();
    if (i + 1 < units.size()) next = read_ahead_task(read, i + 1, ahead);
    for (int64_t s = 0; source_ && s < W; ++s) {
      at("lookup", int(s));
      const DestBlock b = unit_block(where, s, u);
      const LookupKjt& lk = st.der.ranks[size_t(s)].lookup_kjt;
      // Compared where the backend makes it: only the tiles that add to the diff come back.
      const float* got = rows.block(size_t(s));
      const std::optional<std::vector<TileDiff>> tiles =
          backend_.lookup_differences(plan_, int(s),
                                      lookup_kjt_from(lk, value_off[size_t(s)], d,
                                                      u.rows ? u.r0 : 0, u.rows ? u.r1 : INT64_MAX),
                                      *source_, got, b.numel(), how);
      if (!tiles) return false;
      const auto to_whole = [&b](int64_t e) { return b.to_whole(e); };
      merge_diff(looked[size_t(s)], diff_tiles(b.numel(), *tiles, tol_, to_whole, maxm), maxm);
    }
    at("output dist", int(d));
    const EmbTensor out =
        rows.blocks.empty()
            ? sequence_destination_output(plan_, backend_, rows.recv, *st.used_ptr[size_t(d)])
            : destination_output(plan_, backend_, d, rows.blocks, st.used_ptr, variable_batch);
    for (EmbTensor& b : rows.blocks) spare.give(std::move(b.data));
    rows.blocks.clear();
    rows.recv = EmbTensor{};
    at("output", int(d));
    if (!check_unit_output(st, u, out, rows.golden, how, held.on, dest)) return false;
    rows.golden.reset();
    if (i + 1 < units.size() && units[i + 1].d == d) continue;
    // d's last unit: its checks, decided.
    st.got[size_t(d)] = true;
    EmbTensor shape;
    shape.shape = dest.whole_shape;
    const TensorLayout layout = output_layout(st.batch.ranks[size_t(d)].kjt, shape);
    if (st.golden[size_t(d)]) {
      locate_mismatches(dest.gold, layout);
      gold[size_t(d)] = tensor_check(k, int(d), "output", "golden", "replayed", "golden",
                                     std::exchange(dest.gold, TensorDiff{}), tol_);
    }
    if (source_) {
      locate_mismatches(dest.ref, layout);
      ref[size_t(d)] = tensor_check(k, int(d), "output", "reference", "replayed", "reference",
                                    std::exchange(dest.ref, TensorDiff{}), tol_);
    }
    progress_rank_done(k);
  }
  if (pooled_dist_ && !latched_batch_ && pooled_dist_->latched_variable_batch()) latched_batch_ = k;
  for (int64_t s = 0; source_ && s < W; ++s) {
    at("lookup", int(s));
    locate_mismatches(looked[size_t(s)], lookup_layout(st, int(s)));
    CheckResult c = tensor_check(k, int(s), "lookup", "local_embs", "captured", "derived",
                                 looked[size_t(s)], tol_);
    st.lookup_bad |= c.status == CheckStatus::fail;
    emit(std::move(c));
  }
  for (int64_t d = 0; d < W; ++d)
    emit_output_checks(st, int(d), std::move(gold[size_t(d)]), std::move(ref[size_t(d)]), nullptr);
  return true;
}

// ---------------------------------------------------------------- keep going after trouble

// "/batches/3/rank1/ctx/x" -> 1; -1 when the path names no rank.
int rank_in(const std::string& text) {
  const size_t at = text.find("/rank");
  if (at == std::string::npos) return -1;
  size_t i = at + 5, n = 0;
  int r = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9' && n < 9) {
    r = r * 10 + (text[i] - '0');
    ++i;
    ++n;
  }
  return n == 0 ? -1 : r;
}

void Replayer::record_trouble(int64_t k, int rank, const std::string& stage,
                              const std::string& msg) {
  if (opt_.fail_fast) throw Error(msg);
  if (troubles_++ == 0) first_trouble_batch_ = k;
  CheckResult c;
  c.batch = k;
  c.rank = rank >= 0 ? rank : rank_in(msg);
  c.stage = stage;
  c.check = "trouble";
  c.status = CheckStatus::error;
  c.message = msg;
  emit(std::move(c));
}

std::optional<Batch> Replayer::read_batch_keeping_going(const CaptureReader& reader, int64_t k) {
  const auto oom = [&](const std::string& what, int rank) {
    return fmt::format("{}:/batches/{}{}: {} while reading {}", opt_.capture_path, k,
                       rank >= 0 ? fmt::format("/rank{}", rank) : std::string(),
                       out_of_memory_text(), what);
  };
  try {
    return reader.read_batch(read_plan(), k);
  } catch (const Error&) {
    if (opt_.fail_fast) throw;
  } catch (const std::bad_alloc&) {
    if (opt_.fail_fast) throw Error(oom("the batch", -1));
  }
  // Something of batch k is unreadable: the KJTs of every rank are needed (the input dist is
  // an all-to-all), the optional parts are tried rank by rank.
  ReadParts kjt_only;
  kjt_only.ctx = kjt_only.local_embs = kjt_only.output = false;
  try {
    reader.read_batch(read_plan(), k, kjt_only);
  } catch (const Error& e) {
    record_trouble(k, -1, "capture", e.what());
    return std::nullopt;
  } catch (const std::bad_alloc&) {
    record_trouble(k, -1, "capture", oom("the KJTs", -1));
    return std::nullopt;
  }
  const size_t W = size_t(read_plan().world_size);
  ReadParts good;
  good.ranks.assign(W, 1);
  for (size_t r = 0; r < W; ++r) {
    ReadParts one;
    one.ranks.assign(W, 0);
    one.ranks[r] = 1;
    try {
      reader.read_batch(read_plan(), k, one);
      continue;
    } catch (const Error& e) {
      record_trouble(k, int(r), "capture",
                     std::string(e.what()) +
                         " (this rank's ctx/, local_embs and output are left out of the replay)");
    } catch (const std::bad_alloc&) {
      record_trouble(k, int(r), "capture", oom("ctx/, local_embs and output", int(r)));
    }
    good.ranks[r] = 0;
  }
  try {
    return reader.read_batch(read_plan(), k, good);
  } catch (const Error& e) {
    record_trouble(k, -1, "capture", e.what());
  } catch (const std::bad_alloc&) {
    record_trouble(k, -1, "capture", oom("the batch", -1));
  }
  return std::nullopt;
}

void Replayer::setup_replan(const CaptureReader& reader) {
  const PlanLoadResult embedded = parse_plan(reader.plan_text(), reader.path() + ":/plan");
  if (!embedded.ok() || !embedded.plan) return;  // nothing to compare with: --plan is used as is
  const std::vector<std::string> diffs = plan_differences(*embedded.plan, plan_);
  if (diffs.empty()) return;
  cap_plan_ = *embedded.plan;
  replan_ = true;
  for (const std::string& d : diffs) warn("--plan differs from the capture's plan: " + d);
  warn(
      "--plan: the captured ctx/ was made under the capture's plan; it is not compared, the "
      "context is derived under --plan");
  if (plan_.module == ModuleKind::sequence)
    warn("--plan: sequence local_embs (one row per id) are re-sharded to --plan and checked there");
  else
    warn(source_ || open_embedding_source(reader, plan_)
             ? "--plan: pooled local_embs are partial sums over the capture's shards and cannot "
               "be re-sharded; the output dist runs on lookups from /oracle or /tables"
             : "--plan: pooled local_embs are partial sums over the capture's shards and cannot "
               "be re-sharded, and the capture has no /oracle or /tables: the output checks are "
               "skipped");
}

// The float tensors of a sliced batch (lookups, an output, its reference and golden slice) are
// held to this much, whatever the budget: wider slices would only save passes over the ids.
constexpr double kSliceBytes = 512.0 * (1 << 20);

void Replayer::check_memory(const CaptureReader& reader) {
  const uint64_t have = memory_budget();
  if (rep_.info.batches.empty()) return;
  const int64_t k = rep_.info.batches.front();
  int64_t ids = 0, bags = 0;
  double captured_floats = 0;  // local_embs and output as the replay holds them (float32)
  bool whole_only = !opt_.write_output.empty() || opt_.write_output_file;
  int64_t local_ranks = 0;  // ranks with local_embs
  bool module_outputs = false;
  for (const DatasetStat& d : reader.dataset_stats(k)) {
    const auto ends = [&](const std::string& tail) {
      return d.path.size() >= tail.size() &&
             d.path.compare(d.path.size() - tail.size(), tail.size(), tail) == 0;
    };
    int64_t numel = 1;
    for (int64_t x : d.dims) numel *= x;
    if (ends("/local_embs") || ends("/output")) captured_floats += 4.0 * double(numel);
    whole_only |= ends("/local_embs") || ends("/module_output");  // slice_width's rules
    local_ranks += ends("/local_embs");
    module_outputs |= ends("/module_output");
    if (d.dims.size() != 1) continue;
    if (ends("/values")) ids += d.dims[0];
    if (ends("/lengths")) bags += d.dims[0];
  }
  const int64_t W = plan_.world_size, F = std::max<int64_t>(1, plan_.num_features());
  const int64_t b = bags / std::max<int64_t>(1, W * F);
  const double len = bags > 0 ? double(ids) / double(bags) : 0;
  const MemoryEstimate m = estimate_batch_memory(plan_, b, len);
  // The derived context and lookup, the replayed outputs, and what the capture holds.
  const double fixed = m.ids + 2 * m.context + captured_floats;
  const double need = fixed + m.lookup + m.output;
  // One destination at a time (replay_by_destination) when every rank's lookup is captured and
  // each output can be checked on its own: no --write-output (it copies whole batches), no
  // re-sharding (--plan), no module_output and no MEAN diagnosis of a pooled lookup (both take
  // whole tensors). It holds the ids and contexts, and about two destinations' share of the
  // captured tensors (d's blocks, golden output, replayed output and reference).
  // The test hook DYNEMB_BY_DESTINATION=off keeps every batch whole, =report says on stderr
  // how each batch ran (tests compare the two).
  const char* hook = std::getenv("DYNEMB_BY_DESTINATION");
  stream_ = opt_.write_output.empty() && !opt_.write_output_file && !replan_ &&
            local_ranks == plan_.world_size && !module_outputs &&
            !(plan_.module == ModuleKind::pooled && plan_.any_mean) &&
            !(hook && std::string(hook) == "off");
  // Over column slices: the W lookups, and one rank's output, reference and golden slice at a
  // time, per column of the C.
  const int64_t C = std::max<int64_t>(1, embedding_columns(plan_));
  const double per_column = (m.lookup + 3 * m.output / double(std::max<int64_t>(1, W))) / double(C);
  const double room = std::min(kSliceBytes, double(have > 0 ? have : UINT64_MAX) - fixed);
  slice_cols_ = 0;
  if (!whole_only && (need > fixed + kSliceBytes || (have > 0 && need > double(have))))
    slice_cols_ = std::clamp<int64_t>(int64_t(room / std::max(1.0, per_column)), 1, C);
  // DYNEMB_SLICE_COLUMNS=n: slices of at most n columns (tests compare sliced and whole runs).
  if (const char* e = std::getenv("DYNEMB_SLICE_COLUMNS"); e && !whole_only && std::atoll(e) > 0)
    slice_cols_ = std::min<int64_t>(slice_cols_ > 0 ? slice_cols_ : C, std::atoll(e));
  if (slice_cols_ >= C) slice_cols_ = 0;
  const double sliced = fixed + double(slice_cols_) * per_column;
  batch_bytes_ = uint64_t(slice_cols_ > 0 ? sliced : need);
  if (stream_) batch_bytes_ = uint64_t(m.ids + 2 * m.context + 2 * captured_floats / double(W));
  const std::string limit =
      fmt::format("{} {}", human_bytes(double(have)),
                  opt_.max_memory > 0 ? "--max-memory allows"
                                      : "this machine has (physical memory, cgroup limit or "
                                        "DYNEMB_MEMORY_LIMIT)");
  if (have == 0) return;
  if (stream_ && double(batch_bytes_) > double(have))
    throw Error(fmt::format(
        "{}: replaying batch {} needs about {} even one destination rank at a time, more than "
        "the {}; W = {}, ids and contexts {}, captured local_embs and output {}",
        opt_.capture_path, k, human_bytes(double(batch_bytes_)), limit, W,
        human_bytes(m.ids + 2 * m.context), human_bytes(captured_floats)));
  if (stream_) return;
  if (slice_cols_ > 0 && sliced > double(have))
    throw Error(fmt::format(
        "{}: replaying batch {} needs about {} even one embedding column at a time, more than the "
        "{}; W = {}, ids and contexts {}, captured output {}, one column of the W lookups, an "
        "output and its reference {}; {}",
        opt_.capture_path, k, human_bytes(sliced), limit, W, human_bytes(m.ids + 2 * m.context),
        human_bytes(captured_floats), human_bytes(per_column), m.summary()));
  if (slice_cols_ == 0 && need > double(have))
    throw Error(
        fmt::format("{}: replaying batch {} needs about {}, more than the {}; W = {}, captured "
                    "local_embs and output {}; {}",
                    opt_.capture_path, k, human_bytes(need), limit, W, human_bytes(captured_floats),
                    m.summary()));
}

bool Replayer::rebase_batch(int64_t k, Batch& batch, bool selected) {
  const int64_t W = plan_.world_size;
  bool all_local = true;
  for (RankBatch& rb : batch.ranks) {
    rb.ctx.reset();
    all_local &= rb.local_embs.has_value();
  }
  if (plan_.module == ModuleKind::sequence) {
    if (!all_local) {
      for (RankBatch& rb : batch.ranks) rb.local_embs.reset();
      return true;
    }
    std::vector<const Kjt*> kjts(static_cast<size_t>(W));
    std::vector<const EmbTensor*> local(static_cast<size_t>(W));
    for (int64_t r = 0; r < W; ++r) {
      kjts[size_t(r)] = &batch.ranks[size_t(r)].kjt;
      local[size_t(r)] = &*batch.ranks[size_t(r)].local_embs;
    }
    int64_t unknown = 0;
    std::vector<EmbTensor> moved;
    try {
      moved = reshard_sequence_local_embs(cap_plan_, plan_, kjts, local, backend_, k, unknown);
    } catch (const Error& e) {
      for (RankBatch& rb : batch.ranks) rb.local_embs.reset();
      if (selected)
        record_trouble(k, -1, "replay",
                       fmt::format("{}:/batches/{}: re-sharding local_embs to --plan: {}",
                                   opt_.capture_path, k, e.what()));
      return true;
    }
    for (int64_t r = 0; r < W; ++r) batch.ranks[size_t(r)].local_embs = std::move(moved[size_t(r)]);
    if (unknown > 0 && selected)
      warn(
          fmt::format("--plan: batch {}: {} lookups under --plan read rows the capture does not "
                      "hold (ids outside a table of the capture's plan): zeros in the re-sharded "
                      "local_embs",
                      k, unknown));
    return true;
  }
  for (RankBatch& rb : batch.ranks) rb.local_embs.reset();
  if (source_) return true;
  if (selected)
    for (int64_t r = 0; r < W; ++r)
      if (batch.ranks[size_t(r)].output)
        emit(skipped(k, int(r), "output", "golden",
                     "--plan: pooled local_embs cannot be re-sharded to another plan, and the "
                     "capture has no /oracle or /tables to look the rows up"));
  return false;
}

}  // namespace

Report run_replay(const ReplayOptions& opt, Backend& backend, const ReplayCallbacks& cb) {
  Report rep;
  ReportInfo& info = rep.info;
  info.argv = opt.argv;
  info.tool_version = DYNEMB_VERSION;
  info.backend = backend.name();
  info.device = backend.device();
  info.capture.path = opt.capture_path;
  info.max_mismatches = opt.max_mismatches;
  info.write_output = opt.write_output;
  info.ctx_mode = opt.ctx_mode == CtxMode::derived ? "derived" : "captured";
  Replayer rp(opt, backend, cb, rep);
  try {
    rp.run();
  } catch (const Error& e) {
    rep.trouble = e.what();
  } catch (const std::bad_alloc&) {
    rep.trouble = fmt::format(
        "{}: {} (opening the capture, reading its plan or tables, or "
        "writing --write-output)",
        opt.capture_path, out_of_memory_text());
  }
  try {  // when the run stopped before its header (the hash's own trouble is the run's)
    rp.take_capture_sha();
  } catch (const Error& e) {
    if (rep.trouble.empty()) rep.trouble = e.what();
  } catch (const std::bad_alloc&) {
  }
  return rep;
}

}  // namespace dynemb
