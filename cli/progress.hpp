// The progress line of a long command, for a person at a terminal: a bar, counts, bytes, rate
// and time left, redrawn at most ten times a second on stderr and erased when the work is done
// or before anything else is printed. Inactive unless stderr is a terminal (never in pipes or
// CI logs) and the command is not --quiet.
#pragma once

#include <chrono>
#include <string>

namespace dynemb::cli {

class ProgressLine {
 public:
  // `what`: the command ("replay"); `enabled`: false for --quiet.
  ProgressLine(std::string what, bool enabled);
  ~ProgressLine() { clear(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool active() const { return active_; }
  // `counts`: e.g. "3/8 batches"; bytes: the work's logical bytes done and in all (0: unknown,
  // then the rate and time left are not shown). `force`: draw even within the redraw interval.
  void update(double fraction, const std::string& counts, double bytes_done, double bytes_total,
              bool force = false);
  // Erases the line (call before printing on stdout or stderr while it is shown).
  void clear();

 private:
  std::string what_;
  bool active_ = false, shown_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

// "1:05", "12:00:07".
std::string clock_text(double seconds);

}  // namespace dynemb::cli
