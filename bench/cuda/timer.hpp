// RAII stream and event timer of the CUDA stages.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

#include "cuda/probes.hpp"
#include "cuda_check.hpp"
#include "stages.hpp"

namespace dynemb::bench {

// A non-blocking stream, destroyed with its owner (also when a stage throws).
class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Device events around each timed repeat, after three warm-up calls (module load, first
// touch); the median in us. Before each repeat a one-thread kernel spins queue_ahead SM
// cycles so the host has enqueued the start event, the stage and the end event before the GPU
// reaches them: the time is GPU execution, not launch latency (0: launch latency included).
class CudaTimer {
 public:
  CudaTimer(cudaStream_t s, int iters, int64_t queue_ahead)
      : s_(s), iters_(iters), queue_ahead_(queue_ahead) {
    CUDA_CHECK(cudaEventCreate(&e0_));
    CUDA_CHECK(cudaEventCreate(&e1_));
  }
  ~CudaTimer() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }
  CudaTimer(const CudaTimer&) = delete;
  CudaTimer& operator=(const CudaTimer&) = delete;

  double operator()(const std::function<void()>& launch) {
    for (int i = 0; i < 3; ++i) launch();
    CUDA_CHECK(cudaStreamSynchronize(s_));
    std::vector<double> t;
    for (int i = 0; i < iters_; ++i) {
      cuda::launch_spin(queue_ahead_, s_);
      CUDA_CHECK(cudaEventRecord(e0_, s_));
      launch();
      CUDA_CHECK(cudaEventRecord(e1_, s_));
      CUDA_CHECK(cudaEventSynchronize(e1_));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0_, e1_));
      t.push_back(ms * 1e3);
    }
    return median(t);
  }

 private:
  cudaStream_t s_;
  int iters_;
  int64_t queue_ahead_;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
};

}  // namespace dynemb::bench
