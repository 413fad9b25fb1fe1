#include "replay/team_run.hpp"

#include <fmt/format.h>
#include <signal.h>

#include <cstdio>
#include <exception>
#include <sstream>

#include "common/error.hpp"
#include "common/test_hooks.hpp"

namespace dynemb::replay_detail {

namespace {

// Whether batch k has a ctx/ group on some rank, from the file's metadata alone.
bool has_ctx(const CaptureReader& reader, int64_t k) {
  for (const DatasetStat& d : reader.dataset_stats(k))
    if (d.path.find("/ctx/") != std::string::npos) return true;
  return false;
}

}  // namespace

std::vector<int64_t> TeamRun::share(const std::vector<int64_t>& selected) const {
  if (!team_ || split_) return selected;
  if (!opt_.write_output.empty() || opt_.write_output_file)
    return team_->index() == 0 ? selected : std::vector<int64_t>{};
  return team_share(selected, team_->index(), team_->size());
}

std::optional<bool> TeamRun::begin(const CaptureReader& reader,
                                   const std::vector<int64_t>& selected,
                                   const std::vector<int64_t>& mine) {
  began_ = true;
  if (worker() && !carry_in_) {
    // "1 MODE BATCH": the module latched MODE at BATCH; "0": not latched yet.
    std::istringstream in(team_->receive_carry());
    carry_in_ = true;
    int latched = 0, mode = 0;
    int64_t at = -1;
    in >> latched >> mode >> at;
    if (latched && rc_.pooled_dist) {
      rc_.pooled_dist->preset_latch(mode != 0);
      rc_.latched_batch = at;
    }
  }
  after_batch();
  if (!worker()) return std::nullopt;
  rep_.checks.clear();
  rep_.pass_log = PassLog();
  rep_.pass_counts.clear();
  rep_.warnings.clear();
  if (mine.empty() || split_) return std::nullopt;
  const int64_t first = mine.front();
  rc_.ctx_before = [&reader, &selected, first] {
    for (int64_t k : selected)
      if (k < first && has_ctx(reader, k)) return true;
    return false;
  };
  return has_ctx(reader, selected.front());
}

void TeamRun::choose_split(bool by_destination, int64_t selected) {
  if (team_ && team_->size() > 1 && opt_.team_split != TeamSplit::automatic) {
    if (!opt_.write_output.empty() || opt_.write_output_file)
      throw UsageError(
          "--write-output under a launcher with --backend nccl: each process receives only its "
          "own ranks' outputs, and the copy needs every rank's in one process; run the replay "
          "as one process to write the output");
    split_ = carry_in_ = carry_out_ = lockstep_ = true;
    rc_.own_ranks = rank_block(rc_.plan.world_size, team_->index(), team_->size());
    if (test_hooks::team_split_lockstep())  // the test hook says it was taken
      std::fprintf(stderr, "DYNEMB_TEAM_SPLIT: process %d of %d: lockstep, ranks [%lld, %lld)\n",
                   team_->index(), team_->size(), static_cast<long long>(rc_.own_ranks->first),
                   static_cast<long long>(rc_.own_ranks->second));
    return;
  }
  if (!team_ || team_->size() <= 1 || !by_destination || selected >= team_->size()) return;
  split_ = carry_in_ = carry_out_ = true;
  rc_.own_ranks = rank_block(rc_.plan.world_size, team_->index(), team_->size());
}

void TeamRun::split_batch(int64_t k, const std::function<void()>& fn) {
  log_.split_begin(k, rc_.own_ranks->first, rc_.own_ranks->second);
  std::exception_ptr fatal;
  try {
    fn();
  } catch (...) {
    fatal = std::current_exception();
  }
  log_.split_end(fatal);
  if (!worker()) log_.batch_done(k);
}

void TeamRun::at_batch() {
  if (team_ && test_hooks::mpi_kill() == team_->index()) ::raise(SIGKILL);
}

void TeamRun::send_carry() {
  carry_out_ = true;
  const std::optional<bool> m =
      rc_.pooled_dist ? rc_.pooled_dist->latched_variable_batch() : std::nullopt;
  team_->send_carry(m ? fmt::format("1 {} {}", int(*m), rc_.latched_batch.value_or(-1)) : "0");
}

void TeamRun::after_batch() {
  // Final once latched (a latch is never undone), or at once for a sequence module (none).
  if (!team_ || carry_out_ || team_->index() + 1 >= team_->size()) return;
  if (team_->index() > 0 && !carry_in_) return;
  if (!rc_.pooled_dist || rc_.pooled_dist->latched_variable_batch()) send_carry();
}

void TeamRun::finish() {
  rc_.ctx_before = nullptr;
  try {
    log_.settle();  // what was decided while the backend started (CheckLog::record)
  } catch (const Error& e) {
    if (rep_.trouble.empty()) rep_.trouble = e.what();
  }
  if (!team_) return;
  if (team_->index() > 0 && !carry_in_) {
    carry_in_ = true;
    team_->receive_carry();
  }
  if (!carry_out_ && team_->index() + 1 < team_->size()) send_carry();
  if (worker()) {
    // A worker that never began (trouble in the setup, which process 0 meets too) sends nothing
    // of the setup's findings.
    if (!began_) {
      rep_.checks.clear();
      rep_.pass_log = PassLog();
      rep_.pass_counts.clear();
      rep_.warnings.clear();
    }
    team_->send_result(encode_findings(rep_, opt_.passes == PassMode::counted));
    return;
  }
  bool merging = rep_.trouble.empty();
  const ReplayTeam::ProgressFn progress = [this](int64_t k, bool whole) {
    log_.remote_done(k, whole);
  };
  for (int q = 1; q < team_->size(); ++q) {
    std::string bytes = team_->receive_result(q, progress);
    log_.poll_team();
    if (!merging) continue;
    try {
      Findings f = decode_findings(bytes);
      bytes.clear();
      const std::string trouble = f.trouble;
      log_.merge(std::move(f));
      if (!trouble.empty()) {
        rep_.trouble = trouble;
        merging = false;
      }
    } catch (const Error& e) {
      rep_.trouble = fmt::format("process {} of {}: {}", q, team_->size(), e.what());
      merging = false;
    }
  }
  log_.poll_team();
}

}  // namespace dynemb::replay_detail
