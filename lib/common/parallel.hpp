// A minimal fork-join loop for the CPU backend, the capture reader and the replay: splits
// [0, n) into `threads` contiguous chunks, runs fn(begin, end) on the process's worker pool and
// the calling thread, and rethrows the first exception (lowest chunk).
//
// Why a pool: a replay one destination at a time calls this a few thousand times per batch
// on pieces of a few MiB (a lookup, a tile compare, a staging copy), so starting and joining a
// thread per chunk cost as much as the work. The pool's workers are started once; a call
// queues one job whose chunks are claimed by index. The calling thread claims chunks too and
// only waits for chunks other threads already run, so a call made from inside a chunk (nested)
// or from two threads at once (the read-ahead thread and the replay) always makes progress.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace dynemb {

// Threads for work spread over every core this process may run on: one per CPU of its affinity
// mask (taskset, a cgroup cpuset, a launcher that binds each process to its cores), else one per
// hardware thread; at least one.
int hardware_threads();

// Runs task(0), ..., task(n - 1) on the worker pool (hardware_threads() - 1 workers, started at
// the first call; fewer when a thread cannot start, down to none) and on the calling thread;
// returns when all have returned. `task` must not throw.
void run_on_pool(int64_t n, const std::function<void(int64_t)>& task);
// The same, with `alongside()` run on the calling thread once the tasks are queued, before it
// claims any: work that must stay on this thread (libhdf5's calls) while the workers start on
// the tasks, which may wait for what it makes. `alongside` must not throw.
void run_on_pool(int64_t n, const std::function<void(int64_t)>& task,
                 const std::function<void()>& alongside);

// `grain`: the least work a thread is given (elements by default; 1 for items that are each
// large, such as compressed chunks).
template <class Fn>
void parallel_for(int threads, int64_t n, Fn&& fn, int64_t grain = 4096) {
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, n / grain + 1));
  if (t == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> errs(static_cast<size_t>(t));
  run_on_pool(t, [&](int64_t i) {
    try {
      fn(n * i / t, n * (i + 1) / t);
    } catch (...) {
      errs[static_cast<size_t>(i)] = std::current_exception();
    }
  });
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

}  // namespace dynemb
