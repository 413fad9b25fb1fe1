// parallel_for on the worker pool: every index once, nested calls, calls from several threads
// at once, the first exception by chunk, and many small calls in a row (what a replay one
// destination at a time makes).
#include <doctest/doctest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/parallel.hpp"

using namespace dynemb;

namespace {

// Sum of i over [0, n) by parallel_for with `threads` chunks: each index visited once.
int64_t parallel_sum(int threads, int64_t n, int64_t grain) {
  std::vector<int> hits(static_cast<size_t>(n), 0);
  std::atomic<int64_t> sum{0};
  parallel_for(
      threads, n,
      [&](int64_t b, int64_t e) {
        int64_t s = 0;
        for (int64_t i = b; i < e; ++i) {
          ++hits[size_t(i)];
          s += i;
        }
        sum += s;
      },
      grain);
  for (int h : hits) REQUIRE(h == 1);
  return sum;
}

}  // namespace

TEST_CASE("parallel_for visits every index once, whatever the chunks") {
  for (const int threads : {1, 2, 3, 16, 64})
    for (const int64_t n : {int64_t(0), int64_t(1), int64_t(5), int64_t(1000), int64_t(100003)})
      for (const int64_t grain : {int64_t(1), int64_t(7), int64_t(4096)}) {
        CAPTURE(threads);
        CAPTURE(n);
        CAPTURE(grain);
        CHECK(parallel_sum(threads, n, grain) == n * (n - 1) / 2);
      }
}

TEST_CASE("parallel_for: nested calls and calls from several threads at once finish") {
  // Every chunk of the outer loop runs an inner parallel_for; four threads do it at once.
  std::vector<std::thread> callers;
  std::vector<int64_t> got(4, 0);
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      std::atomic<int64_t> total{0};
      parallel_for(
          16, 32,
          [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) total += parallel_sum(8, 1000 + i, 1);
          },
          1);
      got[size_t(c)] = total;
    });
  for (std::thread& t : callers) t.join();
  int64_t want = 0;
  for (int64_t i = 0; i < 32; ++i) want += (1000 + i) * (999 + i) / 2;
  for (const int64_t g : got) CHECK(g == want);
}

TEST_CASE("parallel_for rethrows the exception of the lowest chunk, after every chunk ran") {
  std::atomic<int> ran{0};
  try {
    parallel_for(
        8, 8,
        [&](int64_t b, int64_t) {
          ++ran;
          if (b == 5 || b == 2) throw std::runtime_error("chunk " + std::to_string(b));
        },
        1);
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "chunk 2");
  }
  CHECK(ran == 8);
  CHECK(parallel_sum(8, 100, 1) == 4950);  // the pool still works
}

TEST_CASE("parallel_for: many small calls in a row") {
  int64_t total = 0;
  for (int k = 0; k < 20000; ++k) total += parallel_sum(16, 64, 1);
  CHECK(total == int64_t(20000) * 2016);
}

TEST_CASE("run_on_pool: work alongside runs on the calling thread while the tasks run") {
  // The tasks wait for what the caller makes alongside (as the chunk decode waits for the chunk
  // fetch, which must stay on the caller's thread): they must all finish, each seeing it.
  for (int64_t n : {0, 1, 2, 7, 64}) {
    const std::thread::id caller = std::this_thread::get_id();
    std::atomic<int64_t> made{0}, seen{0};
    std::thread::id alongside_on;
    run_on_pool(
        n,
        [&](int64_t i) {
          while (made.load() <= i) std::this_thread::yield();
          seen.fetch_add(1);
        },
        [&] {
          alongside_on = std::this_thread::get_id();
          for (int64_t i = 0; i < n; ++i) made.store(i + 1);
        });
    const bool on_caller = alongside_on == caller;
    CHECK(on_caller);
    CHECK(seen.load() == n);
    CHECK(made.load() == n);
  }
}
