#include "replay/step_clock.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/clock.hpp"
#include "common/trace.hpp"

namespace dynemb::replay_detail {

StepClock::StepClock()
    : on_(std::getenv("DYNEMB_STEP_TIMES") != nullptr),
      since_(std::chrono::steady_clock::now()),
      started_(since_) {}

void StepClock::tick(const char* step) {
  if (!on_ && !tracing()) {
    timed_ = step;
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (tracing()) TraceSpan::record(timed_, -1, since_, now);
  if (on_) {
    const double dt = std::chrono::duration<double>(now - since_).count();
    auto it = std::find_if(seconds_.begin(), seconds_.end(),
                           [&](const auto& e) { return e.first == timed_; });
    if (it == seconds_.end())
      seconds_.emplace_back(timed_, dt);
    else
      it->second += dt;
  }
  timed_ = step;
  since_ = now;
}

std::string StepClock::report_stage() const {
  const std::string s = step_;
  if (s == "input dist" || s == "ctx") return "ctx";
  if (s == "output dist" || s == "output" || s == "reference") return "output";
  if (s == "lookup" || s == "module") return s;
  return "replay";
}

void StepClock::print() const {
  if (!on_) return;
  double total = 0;
  for (const auto& [name, secs] : seconds_) total += secs;
  std::string out = "# step times (DYNEMB_STEP_TIMES): wall seconds per step, all batches\n";
  for (const auto& [name, secs] : seconds_)
    out += fmt::format("#   {:<12} {:9.3f}  {:5.1f} %\n", name, secs,
                       total > 0 ? 100.0 * secs / total : 0.0);
  // What the steps do not cover: from main() to the replay's start (argument parsing, the
  // plan), and from here to the exit (the report, the backend's teardown) is the process's
  // wall time less this.
  out += fmt::format(
      "#   (before the replay {:.3f} s; main() to here {:.3f} s)\n",
      std::chrono::duration<double>(started_ - process_started()).count(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - process_started()).count());
  std::fputs(out.c_str(), stderr);
}

}  // namespace dynemb::replay_detail
