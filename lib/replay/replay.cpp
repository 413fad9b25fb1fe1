#include "replay/replay.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <sstream>

#include "capture/h5util.hpp"
#include "common/clock.hpp"
#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/sha256.hpp"
#include "common/trace.hpp"
#include "engine/memory_estimate.hpp"
#include "replay/replan.hpp"
#include "replay/replayer.hpp"

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

namespace replay_detail {

namespace {

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

}  // namespace

void Replayer::StepClock::enter(const char* next) {
  if (!on && !tracing()) return;
  const auto now = std::chrono::steady_clock::now();
  if (tracing()) TraceSpan::record(step, -1, since, now);
  if (on) {
    const double dt = std::chrono::duration<double>(now - since).count();
    auto it = std::find_if(seconds.begin(), seconds.end(),
                           [&](const auto& e) { return e.first == step; });
    if (it == seconds.end())
      seconds.emplace_back(step, dt);
    else
      it->second += dt;
  }
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
  // What the steps do not cover: from main() to the replay's start (argument parsing, the
  // plan), and from here to the exit (the report, the backend's teardown) is the process's
  // wall time less this.
  out += fmt::format(
      "#   (before the replay {:.3f} s; main() to here {:.3f} s)\n",
      std::chrono::duration<double>(started - process_started()).count(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - process_started()).count());
  std::fputs(out.c_str(), stderr);
}

void Replayer::run() {
  if (!opt_.write_output.empty() && same_file(opt_.write_output, opt_.capture_path))
    throw UsageError(
        fmt::format("--write-output {}: that is the input capture, which replay "
                    "never modifies; choose another file",
                    opt_.write_output));
  CaptureReader reader(opt_.capture_path);
  // A read of the next batch's shapes in flight uses `reader`: it ends before `reader` goes,
  // whatever way run() leaves.
  struct SettleShapes {
    Replayer& r;
    ~SettleShapes() { r.settle_shapes_ahead(); }
  } settle_shapes{*this};
  capture_sha_ = start_capture_sha(opt_.capture_path);
  open_plan(reader);
  // A run that checks nothing is no pass: a capture of 0 batches (a job that captured none)
  // is trouble, not "PASS" on 0 checks.
  if (reader.num_batches() == 0)
    throw Error(
        fmt::format("{}: no batches: the capture holds 0 (num_batches = 0); there is "
                    "nothing to replay",
                    opt_.capture_path));
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
      next_by_destination_ = -1;  // the next batch this loop gives replay_by_destination
      for (size_t j = i + 1; j < order.size() && next_by_destination_ < 0; ++j)
        if (selected_.count(order[j])) next_by_destination_ = order[j];
      const bool taken = replay_by_destination(reader, k);
      report_by_destination(k, taken);
      if (taken) {
        progress_batch_done(k);
        continue;
      }
    }
    std::optional<Batch> read;
    clock_.enter("read");
    settle_shapes_ahead();  // no read of the next batch's shapes in flight while this one reads
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
  // A file the caller handed over is committed by the caller, with its other outputs.
  if (writer_ && opt_.write_output_file) {
    writer_->finish();
    write_output_finished_ = true;
  }
  if (writer_ && !opt_.write_output_file) writer_->commit();
}

// The plan (the capture's, or --plan's with what differs), the tolerance and the batches.
void Replayer::open_plan(const CaptureReader& reader) {
  ReportInfo& info = rep_.info;
  if (!opt_.plan_path.empty()) {
    std::string text;
    Plan override_plan;
    try {  // what goes wrong here is the plan's, not the capture's
      text = read_text_file(opt_.plan_path);
      override_plan = load_plan_or_throw(text, opt_.plan_path);
    } catch (const std::bad_alloc&) {
      throw Error(fmt::format("{}: {} while reading this plan (--plan)", opt_.plan_path,
                              out_of_memory_text()));
    }
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

namespace {

// The float tensors of a sliced batch (lookups, an output, its reference and golden slice) are
// held to this much, whatever the budget: wider slices would only save passes over the ids.
constexpr double kSliceBytes = 512.0 * (1 << 20);

}  // namespace

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

}  // namespace replay_detail

Report run_replay(const ReplayOptions& opt, Backend& backend, const ReplayCallbacks& cb) {
  Report rep;
  ReportInfo& info = rep.info;
  info.argv = opt.argv;
  info.tool_version = DYNEMB_VERSION;
  info.backend = backend.name();  // its device() when the header is shown (the backend may
                                  // still be starting: start_backend)
  info.capture.path = opt.capture_path;
  info.max_mismatches = opt.max_mismatches;
  info.write_output = opt.write_output;
  info.ctx_mode = opt.ctx_mode == CtxMode::derived ? "derived" : "captured";
  replay_detail::Replayer rp(opt, backend, cb, rep);
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
  // A run that checked nothing (every check skipped: --plan with nothing to run on, say) is
  // trouble: exit 2, never "PASS" on 0 checks.
  if (rep.trouble.empty()) {
    const Summary s = rep.summary();
    if (s.errors == 0 && s.passed + s.failed == 0)
      rep.trouble =
          s.skipped > 0
              ? fmt::format(
                    "{}: nothing was checked: all {} checks of the {} replayed batches "
                    "were skipped (the warnings say why)",
                    opt.capture_path, s.skipped, info.batches.size())
              : fmt::format("{}: nothing was checked: the {} replayed batches gave no check",
                            opt.capture_path, info.batches.size());
  }
  try {  // when the run stopped before its header (the hash's own trouble is the run's)
    rp.take_capture_sha();
  } catch (const Error& e) {
    if (rep.trouble.empty()) rep.trouble = e.what();
  } catch (const std::bad_alloc&) {
  }
  if (info.device.empty()) {
    try {  // a backend that could not be made has no device to name: its error is the trouble
      info.device = backend.device();
    } catch (const Error& e) {
      if (rep.trouble.empty()) rep.trouble = e.what();
    }
  }
  // A caller's --write-output file that the run did not finish (trouble before or while it was
  // written, or a run that checked nothing) is removed, never committed half-made or empty.
  if (opt.write_output_file && (!rp.write_output_finished() || !rep.trouble.empty()))
    opt.write_output_file->discard();
  return rep;
}

}  // namespace dynemb
