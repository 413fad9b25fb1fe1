// A timeline of the whole command for whoever tunes it: with DYNEMB_TRACE=FILE in the
// environment, every TraceSpan's begin and end on every thread, written at exit as a Chrome
// trace (JSON "X" events: chrome://tracing or Perfetto open it; bench/trace_summary.py prints
// it as text). Without the variable a span costs one load of a flag.
#pragma once

#include <chrono>
#include <cstdint>

namespace dynemb {

bool tracing();

// Records [construction, destruction) under `name` (a string literal: kept by pointer) with an
// optional argument (a rank, a batch, a chunk count), when tracing.
class TraceSpan {
 public:
  explicit TraceSpan(const char* name, int64_t arg = -1)
      : name_(tracing() ? name : nullptr), arg_(arg) {
    if (name_) t0_ = std::chrono::steady_clock::now();
  }
  ~TraceSpan() {
    if (name_) record(name_, arg_, t0_, std::chrono::steady_clock::now());
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

  static void record(const char* name, int64_t arg, std::chrono::steady_clock::time_point t0,
                     std::chrono::steady_clock::time_point t1);

 private:
  const char* name_;
  int64_t arg_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace dynemb
