#include "common/trace.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.hpp"

namespace dynemb {

namespace {

struct Event {
  const char* name;
  int64_t arg;
  int tid;
  double t0_us, t1_us;
};

// The events of the whole process, written to $DYNEMB_TRACE when the process exits normally
// (a temporary name first, renamed once complete).
class Recorder {
 public:
  Recorder() {
    if (const char* p = std::getenv("DYNEMB_TRACE"); p && *p) path_ = p;
  }
  ~Recorder() { write(); }
  bool on() const { return !path_.empty(); }

  void add(const char* name, int64_t arg, std::chrono::steady_clock::time_point t0,
           std::chrono::steady_clock::time_point t1) {
    const auto us = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double, std::micro>(t - process_started()).count();
    };
    std::lock_guard<std::mutex> lock(m_);
    auto [it, fresh] = tids_.try_emplace(std::this_thread::get_id(), int(tids_.size()));
    events_.push_back({name, arg, it->second, us(t0), us(t1)});
  }

 private:
  void write() {
    if (!on()) return;
    std::lock_guard<std::mutex> lock(m_);
    const std::string tmp = path_ + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) return;
    std::fputs("{\"traceEvents\":[\n", f);
    for (size_t i = 0; i < events_.size(); ++i) {
      const Event& e = events_[i];
      std::fprintf(f,
                   "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.1f,\"dur\":%.1f,"
                   "\"args\":{\"arg\":%lld}}%s\n",
                   e.name, e.tid, e.t0_us, e.t1_us - e.t0_us, static_cast<long long>(e.arg),
                   i + 1 < events_.size() ? "," : "");
    }
    std::fputs("]}\n", f);
    if (std::fclose(f) == 0)
      std::rename(tmp.c_str(), path_.c_str());
    else
      std::remove(tmp.c_str());
  }

  std::string path_;
  std::mutex m_;
  std::unordered_map<std::thread::id, int> tids_;
  std::vector<Event> events_;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

}  // namespace

bool tracing() {
  static const bool on = recorder().on();
  return on;
}

void TraceSpan::record(const char* name, int64_t arg, std::chrono::steady_clock::time_point t0,
                       std::chrono::steady_clock::time_point t1) {
  recorder().add(name, arg, t0, t1);
}

}  // namespace dynemb
