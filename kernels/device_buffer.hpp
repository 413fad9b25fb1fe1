// DeviceBuffer: a move-only RAII device allocation, and the counters of what those allocations
// cost this process (the GPU tests read them to prove a warm backend allocates nothing).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda_check.hpp"

namespace dynemb::cuda {

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

}  // namespace dynemb::cuda
