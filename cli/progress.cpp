#include "progress.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/memory.hpp"

namespace dynemb::cli {

ProgressLine::ProgressLine(std::string what, bool enabled)
    : what_(std::move(what)),
      active_(enabled && ::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

std::string clock_text(double seconds) {
  const int64_t s = std::max<int64_t>(0, std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

void ProgressLine::update(double fraction, const std::string& counts, double bytes_done,
                          double bytes_total, bool force) {
  if (!active_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && shown_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  fraction = std::clamp(fraction, 0.0, 1.0);
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(fraction * kWidth);
  std::string line = fmt::format("\r\x1b[K{} [{}{}] {:3.0f}%  {}", what_, std::string(filled, '#'),
                                 std::string(kWidth - filled, '-'), 100 * fraction, counts);
  const double secs = std::chrono::duration<double>(now - start_).count();
  if (bytes_total > 0) {
    line += fmt::format("  {} / {}", human_bytes(bytes_done), human_bytes(bytes_total));
    if (secs > 0.5 && bytes_done > 0) {
      const double rate = bytes_done / secs;
      line += fmt::format("  {}/s  ETA {}", human_bytes(rate),
                          clock_text((bytes_total - bytes_done) / rate));
    }
  }
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  shown_ = true;
}

void ProgressLine::clear() {
  if (!shown_) return;
  std::fputs("\r\x1b[K", stderr);
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace dynemb::cli
