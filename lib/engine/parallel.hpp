// A minimal fork-join loop for the CPU backend and the capture reader: splits [0, n) into `threads`
// contiguous chunks, runs fn(begin, end) on std::threads and rethrows the first exception (lowest
// chunk).
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace dynemb {

// Threads for work spread over every core: one per hardware thread, at least one.
inline int hardware_threads() {
  static const int n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return n;
}

// `grain`: the least work a thread is started for (elements by default; 1 for items that are
// each large, such as compressed chunks).
template <class Fn>
void parallel_for(int threads, int64_t n, Fn&& fn, int64_t grain = 4096) {
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, n / grain + 1));
  if (t == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> errs(static_cast<size_t>(t));
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(t));
  auto chunk = [&](int64_t i) {
    try {
      fn(n * i / t, n * (i + 1) / t);
    } catch (...) {
      errs[static_cast<size_t>(i)] = std::current_exception();
    }
  };
  // A thread that cannot be started (no memory for its stack, a process limit) leaves its
  // chunk and the rest to the calling thread: the work is done, only with fewer threads.
  int64_t started = 0;
  for (; started < t; ++started) {
    try {
      pool.emplace_back(chunk, started);
    } catch (const std::system_error&) {
      break;
    }
  }
  for (int64_t i = started; i < t; ++i) chunk(i);
  for (auto& th : pool) th.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

}  // namespace dynemb
