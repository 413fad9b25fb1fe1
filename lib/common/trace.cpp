#include "common/trace.hpp"

#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.hpp"
#include "common/output_file.hpp"

namespace dynemb {

namespace {

struct Event {
  const char* name;
  int64_t arg;
  int tid;
  double t0_us, t1_us;  // since the process started
};

// The process's spans while a trace is on.
struct Recorder {
  std::atomic<bool> on{false};
  std::mutex m;
  std::unique_ptr<OutputFile> out;
  std::unordered_map<std::thread::id, int> tids;  // in order of first span
  std::vector<Event> events;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

double micros(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t - process_started()).count();
}

}  // namespace

bool tracing() {
  return recorder().on.load(std::memory_order_relaxed);
}

void start_trace(std::unique_ptr<OutputFile> out) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.m);
  r.out = std::move(out);
  r.events.clear();
  r.on = r.out != nullptr;
}

std::unique_ptr<OutputFile> write_trace() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.m);
  r.on = false;
  if (!r.out) return nullptr;
  std::string json = "{\"traceEvents\":[\n";
  for (size_t i = 0; i < r.events.size(); ++i) {
    const Event& e = r.events[i];
    json += fmt::format(
        "{{\"name\":\"{}\",\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.1f},\"dur\":{:.1f},"
        "\"args\":{{\"arg\":{}}}}}{}\n",
        e.name, e.tid, e.t0_us, e.t1_us - e.t0_us, e.arg, i + 1 < r.events.size() ? "," : "");
  }
  json += "]}\n";
  r.events.clear();
  std::unique_ptr<OutputFile> out = std::move(r.out);
  out->write(json);
  return out;
}

void TraceSpan::record(const char* name, int64_t arg, std::chrono::steady_clock::time_point t0,
                       std::chrono::steady_clock::time_point t1) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.m);
  if (!r.on) return;
  const auto [it, fresh] = r.tids.try_emplace(std::this_thread::get_id(), int(r.tids.size()));
  r.events.push_back({name, arg, it->second, micros(t0), micros(t1)});
}

}  // namespace dynemb
