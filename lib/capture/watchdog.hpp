// The two guards around opening a capture file (internal to lib/capture): the open watchdog
// armed by set_capture_open_watchdog, and the name of the file being read that
// capture_being_read hands to the CLI's crash handler (capture.hpp says why both exist).
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace dynemb::capture_detail {

// Lives for the duration of one capture open; calls the armed callback if that open is
// still running after the configured time.
class OpenWatchdog {
 public:
  explicit OpenWatchdog(const std::string& path);
  ~OpenWatchdog();
  OpenWatchdog(const OpenWatchdog&) = delete;
  OpenWatchdog& operator=(const OpenWatchdog&) = delete;

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started once the members above exist
};

// `path` is the capture being read from now on (truncated to the fixed buffer).
void note_capture_open(const std::string& path);
// No reader of the capture being read is left (its open failed).
void clear_capture_being_read();
// A reader of `path` is gone: forget it when it is the capture being read.
void note_capture_closed(const std::string& path);

}  // namespace dynemb::capture_detail
