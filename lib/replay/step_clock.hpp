// Which step of a replay is running, for the trouble it may meet and for whoever tunes the
// replay: wall time per step, summed over batches and ranks (DYNEMB_STEP_TIMES=1: a table on
// stderr at the end), and spans of the --trace timeline. The time from one enter() to the next
// is the earlier step's; "read" is the wait for a batch (its read, or what is left of its read
// ahead).
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace dynemb::replay_detail {

class StepClock {
 public:
  StepClock();
  // `step` (a literal: the trace keeps it by pointer) begins on `rank` (-1: all ranks).
  void enter(const char* step, int rank = -1) {
    step_ = step;
    rank_ = rank;
    tick(step);
  }
  // The time from here on is `step`'s, and the step that trouble names stays as it is.
  void tick(const char* step);
  const char* step() const { return step_; }
  int rank() const { return rank_; }
  // The report's stage of the running step (docs/report-schema.md): the input dist derives the
  // contexts, the unsharded reference and the output dist are checked as `output`.
  std::string report_stage() const;
  void print() const;  // the table, when DYNEMB_STEP_TIMES is set

 private:
  bool on_;
  std::vector<std::pair<std::string, double>> seconds_;  // first-seen order
  const char* step_ = "open";
  int rank_ = -1;
  const char* timed_ = "open";  // the step being timed (enter's steps, without the rank)
  std::chrono::steady_clock::time_point since_, started_;
};

}  // namespace dynemb::replay_detail
