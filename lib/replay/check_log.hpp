// Where a replay's findings go, in the order they are decided (replay.hpp is the API): the
// report (every check, or the passes kept compactly or only counted), the caller's callbacks
// (the header once, each check, progress after each rank-batch), warnings and trouble.
#pragma once

#include <cstdint>
#include <exception>
#include <future>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "capture/capture.hpp"
#include "engine/backend.hpp"
#include "replay/replay.hpp"
#include "replay/team.hpp"

namespace dynemb::replay_detail {

class CheckLog {
 public:
  CheckLog(const ReplayOptions& opt, const ReplayCallbacks& cb, Report& rep,
           BackendStartup& backend)
      : opt_(opt), cb_(cb), rep_(rep), backend_(backend) {}

  // A check decided: to the report, and to the caller once the header is out (the header waits
  // for the capture's hash, and the run does not: the checks decided meanwhile wait instead).
  void record(CheckResult c);
  // Waits for the backend still starting and records the checks decided meanwhile (record());
  // throws what its start threw, and those checks are not the run's. Before the run's findings
  // are reported or sent on.
  void settle();
  void warn(const std::string& w) { rep_.warnings.push_back(w); }
  // Trouble in batch k (rank -1: the batch as a whole): an error check of its own, and the run
  // goes on with the rest (--fail-fast: thrown, and the run stops).
  void trouble(int64_t k, int rank, const std::string& stage, const std::string& msg);
  int64_t troubles() const { return troubles_; }
  int64_t first_trouble_batch() const { return first_trouble_batch_; }

  // The capture's SHA-256, computed on another thread while the plan and the first batch are
  // read (the file is in the page cache for both); the header waits for it.
  void hash_capture(const std::string& path);
  // Rethrows a read error of the hash.
  void take_capture_sha();
  // The first replayed batch began: the header is shown once the hash is in and the backend has
  // started (at the latest when the run ends).
  void batch_began();
  // The header now (a run whose every batch was trouble), and the checks decided before it.
  void show_header();

  // Progress: the logical bytes of each selected batch, read from the file's metadata up front
  // (only when someone shows progress), advanced as each rank's output is checked.
  void measure_progress(const CaptureReader& reader, int64_t world_size);
  void rank_done(int64_t k);
  void batch_done(int64_t k);  // the rest of batch k counts as done

  // Under a team (team.hpp): a worker's progress goes to process 0, whose progress counts every
  // process's rank-batches.
  void join(ReplayTeam* team) { team_ = team; }
  void poll_team();
  void remote_done(int64_t k, bool whole_batch) {
    if (cb_.on_progress) count_done(k, whole_batch);
  }
  // Process 0: a worker's findings, recorded after the checks decided so far as if decided here
  // (troubles counted, warnings that this log has already given once not repeated).
  void merge(Findings&& f);

  // A batch split by rank blocks across the team (team.hpp): from split_begin to split_end every
  // process buffers what it records of batch k, keeping in phase 0 only what process 0 keeps
  // (everything) and in later phases only the checks of its ranks [lo, hi) (rank -1: process 0).
  void split_begin(int64_t k, int64_t lo, int64_t hi);
  bool splitting() const { return split_; }
  void split_phase(int phase) { phase_ = phase; }
  // Trouble that ends batch k where the replay caught it: trouble(), or under a rank split, the
  // end of this process's part of the batch, recorded in its place once every process's is in.
  void batch_trouble(int64_t k, int rank, const std::string& stage, const std::string& msg);
  // The batch's exchange: every process's findings to every process, process 0 records them in
  // the one-process order. Then the batch's stop, on every process alike: `fatal` (this process's
  // trouble that ends the run) rethrown or another's thrown, a --fail-fast trouble thrown.
  void split_end(std::exception_ptr fatal);
  // Every process's `bytes` (tagged: the processes must be at the same point of the batch).
  std::vector<std::string> exchange(char tag, const std::string& bytes);

 private:
  void record_confirmed(CheckResult c);
  void show_header_when_hashed();
  bool relays() const { return team_ && team_->index() > 0; }
  void count_done(int64_t k, bool whole_batch);

  const ReplayOptions& opt_;
  const ReplayCallbacks& cb_;
  Report& rep_;
  BackendStartup& backend_;
  std::future<std::string> capture_sha_;
  std::vector<CheckResult> waiting_;      // decided before the header was shown
  std::vector<CheckResult> unconfirmed_;  // decided while the backend was starting (record())
  bool began_ = false, header_shown_ = false, backend_ok_ = false;
  int64_t troubles_ = 0, first_trouble_batch_ = -1;
  int64_t world_size_ = 1;
  ReplayProgress progress_;
  std::map<int64_t, double> batch_bytes_;
  std::map<int64_t, int64_t> ranks_done_;  // [batch]: rank-batches counted of a batch not done
  ReplayTeam* team_ = nullptr;
  std::set<int64_t> finished_;  // batches counted as done: progress that comes late is dropped
  bool split_ = false;
  int phase_ = 0;
  int64_t split_k_ = -1, split_lo_ = 0, split_hi_ = 0;
  SplitFindings split_found_;
};

}  // namespace dynemb::replay_detail
