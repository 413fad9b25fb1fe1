// CUDA error checking and a tiny RAII device buffer, shared by the CUDA backend, the bench
// and the GPU tests. Every CUDA runtime call goes through CUDA_CHECK so a failure becomes a
// dynemb::DeviceError carrying file:line and the call text (cli maps it to exit 2).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"

namespace dynemb::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  throw DeviceError(std::string(file) + ":" + std::to_string(line) + ": CUDA error " +
                    cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in `" + call + "`");
}

}  // namespace dynemb::cuda

#define CUDA_CHECK(call)                                                       \
  do {                                                                         \
    cudaError_t dynemb_cuda_err_ = (call);                                     \
    if (dynemb_cuda_err_ != cudaSuccess)                                       \
      ::dynemb::cuda::throw_cuda(dynemb_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next sync.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace dynemb::cuda {

// Blocks of `threads` for a grid-stride loop over `work` items: enough to cover it, at most
// `per_sm` per SM of the current device (8 x 256 threads fill an H100/H200 SM).
inline unsigned grid_for(int64_t work, int threads, int per_sm = 8) {
  int dev = 0, sms = 132;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t need = (work + threads - 1) / threads;
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(need, int64_t{sms} * per_sm)));
}

// What a kind of allocation has cost this process so far (all threads): `allocations` counts
// the allocation calls made (never decreases), `bytes_held` the bytes live now. Tests read
// them to prove that a warm backend allocates nothing (tests/gpu/test_cuda_workspace.cpp).
struct AllocCounters {
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> bytes_held{0};
};
// Every cudaMalloc a DeviceBuffer makes.
inline AllocCounters& device_alloc_counters() {
  static AllocCounters c;
  return c;
}

// Device allocation of `n` elements of T; move-only. Sizes are int64 (> 2^31 elements ok).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(int64_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)),
        n_(std::exchange(o.n_, 0)),
        cap_(std::exchange(o.cap_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }
  // Reallocates only when growing (grow-only: a buffer reused for smaller sizes keeps its
  // allocation); contents are not kept.
  void resize(int64_t n) {
    if (n <= cap_) {
      n_ = n;
      return;
    }
    release();
    // Never a zero-byte allocation: kernels may be handed the pointer of an empty buffer.
    const size_t bytes = sizeof(T) * static_cast<size_t>(n > 0 ? n : 1);
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes));
    device_alloc_counters().allocations += 1;
    device_alloc_counters().bytes_held += static_cast<int64_t>(bytes);
    n_ = cap_ = n;
  }
  void upload(const T* host, int64_t n, cudaStream_t s = nullptr) {
    resize(n);
    if (n > 0) CUDA_CHECK(cudaMemcpyAsync(p_, host, sizeof(T) * n, cudaMemcpyHostToDevice, s));
  }
  void upload(const std::vector<T>& v, cudaStream_t s = nullptr) {
    upload(v.data(), static_cast<int64_t>(v.size()), s);
  }
  std::vector<T> download(cudaStream_t s = nullptr) const {
    std::vector<T> v(static_cast<size_t>(n_));
    if (n_ > 0) {
      CUDA_CHECK(cudaMemcpyAsync(v.data(), p_, sizeof(T) * n_, cudaMemcpyDeviceToHost, s));
      CUDA_CHECK(cudaStreamSynchronize(s));
    }
    return v;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  int64_t size() const { return n_; }

 private:
  void release() {
    if (p_) {
      cudaFree(p_);  // never throws from a destructor
      device_alloc_counters().bytes_held -=
          static_cast<int64_t>(sizeof(T) * static_cast<size_t>(cap_ > 0 ? cap_ : 1));
    }
    p_ = nullptr;
    n_ = cap_ = 0;
  }
  T* p_ = nullptr;
  int64_t n_ = 0, cap_ = 0;
};

// True when a CUDA device and a working driver are present; never throws.
bool device_available(int device = 0);

}  // namespace dynemb::cuda
