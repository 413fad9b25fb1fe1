// The capture open watchdog and the name of the capture being read (watchdog.hpp).
#include "capture/watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

#include "capture/capture.hpp"
#include "common/safe_text.hpp"

namespace dynemb {

namespace {

struct WatchdogConfig {
  std::mutex m;
  double seconds = 0;
  std::function<void(const std::string&)> on_timeout;
};
WatchdogConfig& watchdog_config() {
  static WatchdogConfig c;
  return c;
}

char g_capture_being_read[4096];  // written outside signal handlers only

}  // namespace

namespace capture_detail {

OpenWatchdog::OpenWatchdog(const std::string& path) {
  WatchdogConfig& c = watchdog_config();
  std::function<void(const std::string&)> cb;
  double secs = 0;
  {
    std::lock_guard<std::mutex> lk(c.m);
    secs = c.seconds;
    cb = c.on_timeout;
  }
  if (secs <= 0 || !cb) return;
  thread_ = std::thread([this, path, secs, cb] {
    std::unique_lock<std::mutex> lk(m_);
    if (!cv_.wait_for(lk, std::chrono::duration<double>(secs), [this] { return done_; })) {
      lk.unlock();
      cb(path);
    }
  });
}

OpenWatchdog::~OpenWatchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(m_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

// Kept escaped (common/safe_text.hpp): the crash handler writes it to stderr as it is, and a
// signal handler can escape nothing.
void note_capture_open(const std::string& path) {
  const std::string shown = escape_field(path);
  const size_t n = std::min(shown.size(), sizeof g_capture_being_read - 1);
  std::memcpy(g_capture_being_read, shown.data(), n);
  g_capture_being_read[n] = '\0';
}

void clear_capture_being_read() {
  g_capture_being_read[0] = '\0';
}

void note_capture_closed(const std::string& path) {
  if (escape_field(path) == g_capture_being_read) g_capture_being_read[0] = '\0';
}

}  // namespace capture_detail

const char* capture_being_read() noexcept {
  return g_capture_being_read;
}

void set_capture_open_watchdog(double seconds,
                               std::function<void(const std::string& path)> on_timeout) {
  WatchdogConfig& c = watchdog_config();
  std::lock_guard<std::mutex> lk(c.m);
  c.seconds = seconds;
  c.on_timeout = std::move(on_timeout);
}

}  // namespace dynemb
