#include "common/parallel.hpp"

#include <sched.h>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <system_error>

namespace dynemb {

int hardware_threads() {
  static const int n = [] {
    int cpus = static_cast<int>(std::thread::hardware_concurrency());
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) > 0)
      cpus = CPU_COUNT(&mask);
    return std::max(1, cpus);
  }();
  return n;
}

namespace {

// One run_on_pool call: chunks are claimed by `next`; `done` counts the finished ones.
struct Job {
  int64_t n = 0;
  const std::function<void(int64_t)>* task = nullptr;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex m;
  std::condition_variable finished;

  // Runs unclaimed chunks until none is left; true when this thread finished the last one.
  bool work() {
    bool last = false;
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      (*task)(i);
      last = done.fetch_add(1, std::memory_order_acq_rel) + 1 == n;
    }
    return last;
  }
};

class Pool {
 public:
  Pool() {
    for (int i = 1; i < hardware_threads(); ++i) {
      try {
        std::thread(&Pool::worker, this).detach();
      } catch (const std::system_error&) {
        break;  // no memory for a stack, a process limit: fewer workers
      }
    }
  }

  void run(int64_t n, const std::function<void(int64_t)>& task,
           const std::function<void()>* alongside = nullptr) {
    auto job = std::make_shared<Job>();
    job->n = n;
    job->task = &task;
    {
      std::lock_guard<std::mutex> lock(m_);
      queue_.push_back(job);
    }
    ready_.notify_all();
    if (alongside) (*alongside)();
    if (job->work()) return;  // the calling thread ran the last chunk
    std::unique_lock<std::mutex> lock(job->m);
    job->finished.wait(lock, [&] { return job->done.load(std::memory_order_acquire) == n; });
  }

 private:
  // Workers take the oldest job with chunks left; a job whose chunks are all claimed leaves
  // the queue (its caller waits on the job itself, not on the queue).
  void worker() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(m_);
        ready_.wait(lock, [&] {
          while (!queue_.empty() &&
                 queue_.front()->next.load(std::memory_order_relaxed) >= queue_.front()->n)
            queue_.pop_front();
          return !queue_.empty();
        });
        job = queue_.front();
      }
      if (job->work()) {
        std::lock_guard<std::mutex> lock(job->m);
        job->finished.notify_all();
      }
    }
  }

  std::mutex m_;
  std::condition_variable ready_;
  std::deque<std::shared_ptr<Job>> queue_;
};

// Never destroyed: detached workers wait on it until the process exits.
Pool& the_pool() {
  static Pool* const pool = new Pool;
  return *pool;
}

}  // namespace

void run_on_pool(int64_t n, const std::function<void(int64_t)>& task) {
  if (n <= 0) return;
  if (n == 1) {
    task(0);
    return;
  }
  the_pool().run(n, task);
}

void run_on_pool(int64_t n, const std::function<void(int64_t)>& task,
                 const std::function<void()>& alongside) {
  if (n <= 0) return alongside();
  the_pool().run(n, task, &alongside);
}

}  // namespace dynemb
