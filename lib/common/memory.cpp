#include "common/memory.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "common/env.hpp"

namespace dynemb {

namespace {
std::atomic<std::size_t> g_failed{0};
}

void note_failed_allocation(std::size_t bytes) noexcept {
  g_failed.store(bytes);
}

std::size_t last_failed_allocation() noexcept {
  return g_failed.load();
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024.0 && u < 6) {
    b /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[u]);
}

std::string out_of_memory_text() {
  const std::size_t n = last_failed_allocation();
  if (n == 0) return "out of memory";
  return fmt::format("out of memory (a request for {} failed)", human_bytes(double(n)));
}

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

namespace {

uint64_t cgroup_limit() {
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(path);
    std::string text;
    if (f >> text && text != "max") {
      const uint64_t v = parse_size(text);
      if (v > 0 && v < (uint64_t{1} << 60)) return v;
    }
  }
  return 0;
}
}  // namespace

uint64_t usable_memory_bytes() {
  if (const std::optional<uint64_t> v = env::size("DYNEMB_MEMORY_LIMIT")) return *v;
  const uint64_t a = physical_memory_bytes(), b = cgroup_limit();
  if (a == 0) return b;
  if (b == 0) return a;
  return a < b ? a : b;
}

uint64_t parse_size(const std::string& text) {
  if (text.empty()) return 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !std::isfinite(v) || v <= 0) return 0;
  const std::string unit = end;
  double mult = 1;
  if (unit == "K" || unit == "k" || unit == "KiB")
    mult = 1024.0;
  else if (unit == "M" || unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TiB")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty())
    return 0;
  // No size past 2^63 bytes means anything here (nor converts to uint64_t defined).
  if (v * mult >= 9.2e18) return 0;
  return static_cast<uint64_t>(v * mult);
}

}  // namespace dynemb
