// The stages of each backend (internal to the bench library). The CUDA stages are in
// bench/cuda/ when the build has the CUDA backend, else bench/no_cuda.cpp says it has not.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "run.hpp"

namespace dynemb::bench {

Result run_cpu_stages(const Options& o, const Workload& w);
Result run_cuda_stages(const Options& o, const Workload& w);

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Host clock: one warm-up call, then the median of `iters` timed calls, in us.
class HostTimer {
 public:
  explicit HostTimer(int iters) : iters_(iters) {}
  double operator()(const std::function<void()>& f) const {
    f();
    std::vector<double> t;
    for (int i = 0; i < iters_; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      t.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(t);
  }

 private:
  int iters_;
};

}  // namespace dynemb::bench
