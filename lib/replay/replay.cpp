#include "replay/replay.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <set>

#include "capture/batch_source.hpp"
#include "common/error.hpp"
#include "common/memory.hpp"
#include "common/test_hooks.hpp"
#include "replay/batch_run.hpp"
#include "replay/replay_setup.hpp"
#include "replay/team_run.hpp"

namespace dynemb {

namespace replay_detail {

namespace {

// True when both paths name the same existing file (or the same path text).
bool same_file(const std::string& a, const std::string& b) {
  if (a == b) return true;
  struct stat sa, sb;
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// The test hook DYNEMB_BY_DESTINATION=report says on stderr how each batch ran, and under a rank
// split (team.hpp) which destinations this process ran: "process q: ranks [a, b)".
void report_cut(int64_t k, bool by_destination, const RunContext& rc) {
  if (test_hooks::by_destination() != test_hooks::ByDestination::report) return;
  std::string own;
  if (by_destination && rc.own_ranks)
    own = fmt::format("; process {}: ranks [{}, {})", rc.opt.team->index(), rc.own_ranks->first,
                      rc.own_ranks->second);
  std::fprintf(stderr, "DYNEMB_BY_DESTINATION: batch %lld: %s%s\n", static_cast<long long>(k),
               by_destination ? "one destination at a time" : "whole", own.c_str());
}

}  // namespace

// One run of `dynemb-dist replay`: the capture opened and sized up, then batch by batch, read
// (one ahead), rebased onto --plan, cut into units and checked, and copied to --write-output.
class Replayer {
 public:
  Replayer(const ReplayOptions& opt, BackendStartup& backend, const ReplayCallbacks& cb,
           Report& rep)
      : opt_(opt),
        rep_(rep),
        log_(opt, cb, rep, backend),
        rc_(opt, backend, log_),
        team_(opt, rc_, log_, rep) {
    log_.join(opt.team.get());
  }
  void run();
  TeamRun& team() { return team_; }
  CheckLog& log() { return log_; }
  // --write-output is complete in its temporary (finished, not yet committed by the caller).
  bool write_output_finished() const { return write_output_finished_; }

 private:
  bool by_destination(BatchSource& src, int64_t k, int64_t next);
  void replay_read(int64_t k, std::optional<Batch>& read);
  // The first replayed batch decides --ctx automatic (captured when it has a ctx/ group), and
  // the header may be shown from then on.
  void choose_ctx_mode(int64_t k, const Batch& batch);
  // A worker of a team: the mode the first selected batch chose (`any_ctx`: it has a ctx/ group).
  void preset_ctx_mode(bool any_ctx);
  // fn() with its trouble recorded as batch k's (out of memory named by the step running).
  template <class Fn>
  bool guarded(int64_t k, Fn&& fn);
  void drop_writer();

  const ReplayOptions& opt_;
  Report& rep_;
  CheckLog log_;
  RunContext rc_;
  TeamRun team_;
  PlanChoice plan_choice_;
  Sizing sizing_;
  std::set<int64_t> selected_;             // the batches replayed (--batches)
  bool started_ = false;                   // the first replayed batch has begun
  std::unique_ptr<CaptureWriter> writer_;  // --write-output; reset on trouble
  bool write_output_finished_ = false;
};

void Replayer::run() {
  if (!opt_.write_output.empty() && same_file(opt_.write_output, opt_.capture_path))
    throw UsageError(
        fmt::format("--write-output {}: that is the input capture, which replay "
                    "never modifies; choose another file",
                    opt_.write_output));
  CaptureReader reader(opt_.capture_path);
  if (!team_.worker()) log_.hash_capture(opt_.capture_path);  // the header is process 0's
  plan_choice_ = open_plan(rc_, reader, rep_.info);
  // A run that checks nothing is no pass: a capture of 0 batches (a job that captured none)
  // is trouble, not "PASS" on 0 checks.
  if (reader.num_batches() == 0)
    throw Error(
        fmt::format("{}: no batches: the capture holds 0 (num_batches = 0); there is "
                    "nothing to replay",
                    opt_.capture_path));
  sizing_ = size_up(rc_, reader, rep_.info.batches.front(), plan_choice_.replan);
  open_source_and_dists(rc_, reader);
  writer_ = team_.worker() ? nullptr : open_writer(rc_, reader);
  rc_.writing = writer_ != nullptr;

  const std::vector<int64_t>& batches = rep_.info.batches;
  selected_ = std::set<int64_t>(batches.begin(), batches.end());
  team_.choose_split(sizing_.by_destination, int64_t(batches.size()));
  // --write-output copies every batch, replayed or not; otherwise read only the selected.
  std::vector<int64_t> order = team_.share(batches);  // under a team, this process's
  if (writer_) {
    order.clear();
    for (int64_t k = 0; k < reader.num_batches(); ++k) order.push_back(k);
  }
  log_.measure_progress(reader, rc_.plan.world_size);
  if (const std::optional<bool> any_ctx = team_.begin(reader, batches, order))
    preset_ctx_mode(*any_ctx);
  // One batch ahead: batch k+1 is read (and inflated) on another thread while batch k is
  // replayed. With --write-output (the writer calls libhdf5 too) the loop stays sequential, and
  // two batches must fit in memory. A batch replayed one destination at a time reads its rows as
  // it goes.
  const bool prefetch = opt_.read_ahead > 0 && !writer_ && !sizing_.by_destination &&
                        order.size() > 1 && 2 * sizing_.batch_bytes <= memory_budget(opt_) / 4 * 3;
  // The lockstep split reads every batch whole, whatever its sizing.
  const bool lockstep_ahead = opt_.read_ahead > 0 && team_.lockstep() && order.size() > 1 &&
                              2 * sizing_.batch_bytes <= memory_budget(opt_) / 4 * 3;
  BatchSource src(reader, plan_choice_.read_plan(rc_),
                  BatchSource::Options{opt_.read_ahead, opt_.fail_fast});
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t k = order[i];
    team_.at_batch();
    if (team_.splits()) {  // its destinations shared by rank blocks, or whole on process 0
      // (lockstep: whole on every process, each recording its ranks' checks)
      team_.split_batch(k, [&] {
        if (!team_.lockstep() &&
            (by_destination(src, k, i + 1 < order.size() ? order[i + 1] : -1) || team_.worker()))
          return;
        rc_.clock.tick("read");
        BatchRead read = src.read(k);
        for (const ReadTrouble& t : read.troubles)
          log_.trouble(t.batch, t.rank, t.stage, t.message);
        if (lockstep_ahead && i + 1 < order.size()) src.read_ahead(order[i + 1]);
        rc_.clock.tick("replay");
        replay_read(k, read.batch);
      });
      continue;
    }
    if (sizing_.by_destination && selected_.count(k)) {
      int64_t next = -1;  // the next batch this loop replays
      for (size_t j = i + 1; j < order.size() && next < 0; ++j)
        if (selected_.count(order[j])) next = order[j];
      if (by_destination(src, k, next)) {
        log_.batch_done(k);
        team_.after_batch();
        continue;
      }
    }
    rc_.clock.tick("read");
    BatchRead read = src.read(k);
    for (const ReadTrouble& t : read.troubles) log_.trouble(t.batch, t.rank, t.stage, t.message);
    if (prefetch && i + 1 < order.size()) src.read_ahead(order[i + 1]);
    rc_.clock.tick("replay");
    replay_read(k, read.batch);
    if (selected_.count(k)) log_.batch_done(k);
    team_.after_batch();
  }
  rc_.clock.tick("end");
  rc_.clock.print();
  log_.show_header();  // when every batch was trouble
  if (writer_ && log_.troubles() > 0) drop_writer();
  // A file the caller handed over is committed by the caller, with its other outputs.
  if (writer_ && opt_.write_output_file) {
    writer_->finish();
    write_output_finished_ = true;
  }
  if (writer_ && !opt_.write_output_file) writer_->commit();
}

template <class Fn>
bool Replayer::guarded(int64_t k, Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const DeviceError& e) {
    if (rc_.backend.failed()) throw;  // it could not start: the run's trouble, not a batch's
    log_.batch_trouble(k, -1, "replay", e.what());
  } catch (const CaptureError& e) {
    log_.batch_trouble(k, rank_of_h5path(e.h5path()), "replay", e.what());
  } catch (const Error& e) {
    log_.batch_trouble(k, -1, "replay", e.what());
  } catch (const std::bad_alloc&) {
    const StepClock& at = rc_.clock;
    const std::string rank = at.rank() >= 0 ? fmt::format("rank {}", at.rank()) : "all ranks";
    log_.batch_trouble(k, at.rank(), at.report_stage(),
                       fmt::format("{}:/batches/{}: {} in the {} step ({}) of this batch",
                                   opt_.capture_path, k, out_of_memory_text(), at.step(), rank));
  }
  drop_writer();
  return false;
}

// Batch k one destination at a time, when it can be (unit_planner.hpp): only its KJTs and
// contexts are read whole, the rows of each unit as it is checked. False, with nothing of it
// done, when it cannot (the caller reads it whole).
bool Replayer::by_destination(BatchSource& src, int64_t k, int64_t next) {
  bool cut_so = false;  // what the test hook reports
  rc_.clock.tick("read");
  std::optional<Batch> shapes = src.read_shapes(k);
  bool fits = shapes.has_value();  // else the whole read says what and where
  for (size_t r = 0; fits && r < shapes->ranks.size(); ++r)
    fits = shapes->ranks[r].local_embs && !shapes->ranks[r].module_output;
  if (fits) choose_ctx_mode(k, *shapes);
  if (!fits || !rc_.use_captured) {
    report_cut(k, false, rc_);
    return false;
  }
  std::optional<Batch> whole;
  guarded(k, [&] {
    rc_.clock.enter("replay");
    BatchState st(k, *shapes, rc_.plan.world_size);
    derive_batch(rc_, st);
    check_contexts(rc_, st);
    choose_contexts(rc_, st);
    if (const std::optional<DestinationCut> cut = cut_destinations(rc_, st)) {
      cut_so = true;
      run_destinations(rc_, st, *cut, src, next);
      return;
    }
    if (team_.splits() && team_.worker()) return;  // process 0 replays it whole
    // Cut whole after all: its float data is read now, and the steps go on from the contexts.
    BatchRead read = src.read(k);
    for (const ReadTrouble& t : read.troubles) log_.trouble(t.batch, t.rank, t.stage, t.message);
    if (!read.batch) return;
    whole = std::move(read.batch);
    st.rebind(*whole);
    run_whole(rc_, st);
  });
  rc_.clock.tick("replay");
  report_cut(k, cut_so, rc_);
  return true;
}

void Replayer::preset_ctx_mode(bool any_ctx) {
  rc_.use_captured =
      opt_.ctx_mode == CtxMode::captured || (opt_.ctx_mode == CtxMode::automatic && any_ctx);
  rep_.info.ctx_mode = rc_.use_captured ? "captured" : "derived";
  started_ = true;
  log_.batch_began();
}

void Replayer::choose_ctx_mode(int64_t k, const Batch& batch) {
  if (started_) return;
  bool any_ctx = false;
  for (const RankBatch& rb : batch.ranks) any_ctx |= rb.ctx.has_value();
  rc_.use_captured =
      opt_.ctx_mode == CtxMode::captured || (opt_.ctx_mode == CtxMode::automatic && any_ctx);
  if (opt_.ctx_mode == CtxMode::captured && !any_ctx)
    log_.warn(
        fmt::format("--ctx captured: batch {} has no ctx/ group; the derived context is "
                    "used where none was captured (--ctx derived says so explicitly)",
                    k));
  rep_.info.ctx_mode = rc_.use_captured ? "captured" : "derived";
  started_ = true;
  log_.batch_began();
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
  if (plan_choice_.replan && !rebase_batch(rc_, plan_choice_, k, batch, selected)) {
    if (writer_) writer_->write_batch(batch);
    return;
  }
  if (!selected) {
    writer_->write_batch(batch);
    return;
  }
  choose_ctx_mode(k, batch);
  // The steps of one batch, in the order a real job runs them: the input dist, the contexts
  // checked and chosen, then its units.
  std::vector<std::optional<EmbTensor>> outputs;
  const bool ok = guarded(k, [&] {
    rc_.clock.enter("replay");
    BatchState st(k, batch, rc_.plan.world_size);
    derive_batch(rc_, st);
    check_contexts(rc_, st);
    choose_contexts(rc_, st);
    if (const ColumnSlices slices = slice_width(rc_, st, sizing_); slices.width > 0)
      run_columns(rc_, st, slices);  // nothing kept: no --write-output
    else
      outputs = run_whole(rc_, st);
    rc_.clock.tick("replay");
  });
  if (!ok || !writer_) return;
  for (size_t r = 0; r < batch.ranks.size(); ++r) {
    if (r < outputs.size() && outputs[r]) {
      batch.ranks[r].output = std::move(*outputs[r]);
    } else if (batch.ranks[r].output) {
      log_.warn(
          fmt::format("--write-output: batch {} rank {}: the output dist did not run; the "
                      "captured output is copied unchanged",
                      k, r));
    }
  }
  writer_->write_batch(batch);
}

// Trouble in a batch: --write-output is then incomplete, so it is not written at all.
void Replayer::drop_writer() {
  if (!writer_) return;
  writer_.reset();  // every handle closed, the temporary removed, the target untouched
  log_.warn(
      fmt::format("--write-output {}: not written (trouble in batch {}); the file, if it "
                  "existed, is unchanged",
                  opt_.write_output, log_.first_trouble_batch()));
}

}  // namespace replay_detail

Report run_replay(const ReplayOptions& opt, BackendStartup& backend, const ReplayCallbacks& cb) {
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
  // The checks decided while the backend started are recorded; under a team, a worker's findings
  // go to process 0 (its report is not shown), which takes in every worker's, in batch order.
  try {
    rp.team().finish();
  } catch (const Error& e) {
    if (rep.trouble.empty()) rep.trouble = e.what();
  }
  if (rp.team().worker()) return rep;
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
    rp.log().take_capture_sha();
  } catch (const Error& e) {
    if (rep.trouble.empty()) rep.trouble = e.what();
  } catch (const std::bad_alloc&) {
  }
  if (info.device.empty()) {
    try {  // a backend that could not be made has no device to name: its error is the trouble
      info.device = backend.get().device();
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

Report run_replay(const ReplayOptions& opt, Backend& backend, const ReplayCallbacks& cb) {
  BackendStartup ready(backend);
  return run_replay(opt, ready, cb);
}

}  // namespace dynemb
