// A timeline of a whole command for whoever tunes it: once start_trace() is given a file
// (`replay` does so for DYNEMB_TRACE=FILE), every TraceSpan's begin and end on every thread,
// written by write_trace() as a Chrome trace (JSON "X" events: chrome://tracing or Perfetto
// open it; bench/trace_summary.py prints it as text). While not tracing, a span costs one load
// of a flag.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

namespace dynemb {

class OutputFile;

bool tracing();
// Records every span from now on into `out` (an output like any other: checked against the
// inputs and made by the caller, its temporary removed if the command fails or is interrupted).
void start_trace(std::unique_ptr<OutputFile> out);
// Writes the spans recorded so far into the file and hands it back for the caller to commit
// with the command's other outputs; recording stops. Throws Error (the file's own) when it
// cannot be written. Null when start_trace was not called.
std::unique_ptr<OutputFile> write_trace();

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
