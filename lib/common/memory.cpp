#include "common/memory.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>

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

uint64_t address_space_limit_bytes() {
  struct rlimit rl;
  if (::getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<uint64_t>(rl.rlim_cur);
}

uint64_t usable_memory_bytes() {
  const uint64_t a = physical_memory_bytes(), b = address_space_limit_bytes();
  if (a == 0) return b;
  if (b == 0) return a;
  return a < b ? a : b;
}

}  // namespace dynemb
