#include "staging.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>

#include <unistd.h>

#include "common/parallel.hpp"
#include "common/trace.hpp"

namespace dynemb::cuda {

namespace {

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

constexpr size_t kGrain = size_t{1} << 20;  // a half's size is a multiple of this
constexpr size_t kAlign = 256;              // every chunk starts on this boundary
// Lent memory smaller than this is staged: pinning it costs more than copying it.
constexpr uintptr_t kMinLend = uintptr_t{1} << 20;

// memcpy on every core for large copies: one core moves a fraction of what the host's memory
// and the PCIe link carry, and every transfer of the backend passes through here twice (into
// pinned memory and out of it).
void copy(void* dst, const void* src, size_t n) {
  constexpr size_t kPerThread = size_t{4} << 20;
  const int64_t parts = int64_t(std::min<size_t>(size_t(hardware_threads()), n / kPerThread));
  if (parts <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  parallel_for(
      int(parts), parts,
      [&](int64_t p0, int64_t p1) {
        const size_t a = n * size_t(p0) / size_t(parts), b = n * size_t(p1) / size_t(parts);
        std::memcpy(static_cast<char*>(dst) + a, static_cast<const char*>(src) + a, b - a);
      },
      /*grain=*/1);
}

}  // namespace

AllocCounters& pinned_alloc_counters() {
  static AllocCounters c;
  return c;
}

PinnedStaging::PinnedStaging(size_t max_half_bytes)
    : max_half_(std::max(kGrain, round_up(max_half_bytes, kGrain))) {
  for (Half& h : h_) CUDA_CHECK(cudaEventCreateWithFlags(&h.done, cudaEventDisableTiming));
}

PinnedStaging::~PinnedStaging() {
  // Never throws: errors here (a device already lost) are left to the next CUDA call.
  for (Half& h : h_) {
    if (h.done) {
      cudaEventSynchronize(h.done);
      cudaEventDestroy(h.done);
    }
  }
  if (h_[0].p) {
    cudaFreeHost(h_[0].p);
    pinned_alloc_counters().bytes_held -= static_cast<int64_t>(2 * half_);
  }
  for (const auto& [a, l] : lent_) cudaHostUnregister(reinterpret_cast<void*>(a));
}

void PinnedStaging::drain(Half& h) {
  CUDA_CHECK(cudaEventSynchronize(h.done));
  for (const Pending& d : h.pending) copy(d.host, h.p + d.off, d.bytes);
  h.pending.clear();
  h.used = 0;
}

void PinnedStaging::drain_all() {
  drain(h_[cur_ ^ 1]);  // the older half first (order does not matter: chunks are disjoint)
  drain(h_[cur_]);
}

void PinnedStaging::grow(size_t want) {
  const size_t half = std::min(max_half_, round_up(want, kGrain));
  if (half <= half_) return;
  drain_all();  // no copy may still read or write the old block
  if (h_[0].p) {
    CUDA_CHECK(cudaFreeHost(h_[0].p));
    pinned_alloc_counters().bytes_held -= static_cast<int64_t>(2 * half_);
    h_[0].p = h_[1].p = nullptr;
    half_ = 0;
  }
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, 2 * half, cudaHostAllocDefault));
  pinned_alloc_counters().allocations += 1;
  pinned_alloc_counters().bytes_held += static_cast<int64_t>(2 * half);
  h_[0].p = static_cast<char*>(p);
  h_[1].p = h_[0].p + half;
  half_ = half;
  cur_ = 0;
}

char* PinnedStaging::take(size_t want, size_t* got) {
  if (want > half_) grow(want);
  Half* h = &h_[cur_];
  h->used = std::min(half_, round_up(h->used, kAlign));
  if (h->used == half_) {  // full: move on once the other half's copies are done
    cur_ ^= 1;
    h = &h_[cur_];
    drain(*h);
  }
  *got = std::min(want, half_ - h->used);
  char* p = h->p + h->used;
  h->used += *got;
  return p;
}

uintptr_t PinnedStaging::page() {
  static const uintptr_t bytes =
      uintptr_t(sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096);
  return bytes;
}

bool PinnedStaging::lend(void* p, size_t bytes) {
  const uintptr_t pg = page(), a = (uintptr_t(p) + pg - 1) / pg * pg,
                  b = (uintptr_t(p) + bytes) / pg * pg;
  if (b <= a || b - a < kMinLend) return false;
  auto it = lent_.find(a);
  if (it != lent_.end() && it->second.end == b) return it->second.active = true;
  // Whatever overlaps [a, b) is a registration of memory freed since (lent memory never
  // overlaps other live memory): unpinned first, or the driver refuses the range.
  for (it = lent_.lower_bound(a); it != lent_.begin() && std::prev(it)->second.end > a;) --it;
  while (it != lent_.end() && it->first < b) {
    cudaHostUnregister(reinterpret_cast<void*>(it->first));
    it = lent_.erase(it);
  }
  const TraceSpan span("pin host", int64_t(b - a));
  if (cudaHostRegister(reinterpret_cast<void*>(a), b - a, cudaHostRegisterDefault) != cudaSuccess) {
    (void)cudaGetLastError();  // a refusal (memlock limits) is not an error: staged instead
    return false;
  }
  lent_[a] = Lent{b, true};
  return true;
}

void PinnedStaging::unlend(void* p) {
  const uintptr_t pg = page();
  const auto it = lent_.find((uintptr_t(p) + pg - 1) / pg * pg);
  if (it != lent_.end()) it->second.active = false;
}

void PinnedStaging::forget(void* p) {
  const uintptr_t pg = page();
  const auto it = lent_.find((uintptr_t(p) + pg - 1) / pg * pg);
  if (it == lent_.end()) return;
  cudaHostUnregister(reinterpret_cast<void*>(it->first));
  lent_.erase(it);
}

size_t PinnedStaging::lent_bytes() const {
  size_t n = 0;
  for (const auto& [a, l] : lent_) n += l.end - a;
  return n;
}

// The part of [h, h + bytes) inside memory lent now ([a, b), empty when none).
std::pair<uintptr_t, uintptr_t> PinnedStaging::lent_part(uintptr_t h, size_t bytes) const {
  if (lent_.empty()) return {0, 0};
  const uintptr_t end = h + bytes;
  auto it = lent_.upper_bound(h);  // the first range beginning after h
  if (it != lent_.begin() && std::prev(it)->second.end > h) --it;  // one holding h
  if (it == lent_.end() || !it->second.active || it->first >= end) return {0, 0};
  return {std::max(h, it->first), std::min(end, it->second.end)};
}

void PinnedStaging::upload(void* dev, const void* host, size_t bytes, cudaStream_t s) {
  const auto [a, b] = lent_part(uintptr_t(host), bytes);
  if (a < b) {  // staged before and after, one copy by the device from the lent pages
    const size_t head = a - uintptr_t(host);
    char* d = static_cast<char*>(dev);
    staged_upload(d, host, head, s);
    CUDA_CHECK(cudaMemcpyAsync(d + head, reinterpret_cast<const void*>(a), b - a,
                               cudaMemcpyHostToDevice, s));
    direct_bytes_ += b - a;
    staged_upload(d + head + (b - a), reinterpret_cast<const void*>(b), bytes - head - (b - a), s);
    return;
  }
  staged_upload(dev, host, bytes, s);
}

void PinnedStaging::staged_upload(void* dev, const void* host, size_t bytes, cudaStream_t s) {
  char* d = static_cast<char*>(dev);
  const char* src = static_cast<const char*>(host);
  while (bytes > 0) {
    size_t got = 0;
    char* p = take(bytes, &got);
    copy(p, src, got);
    CUDA_CHECK(cudaMemcpyAsync(d, p, got, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaEventRecord(h_[cur_].done, s));
    d += got;
    src += got;
    bytes -= got;
  }
}

void PinnedStaging::download(const std::vector<ToHost>& parts, cudaStream_t s) {
  try {
    for (const ToHost& part : parts) {
      char* dst = static_cast<char*>(part.host);
      const char* src = static_cast<const char*>(part.dev);
      for (size_t left = part.bytes; left > 0;) {
        size_t got = 0;
        char* p = take(left, &got);
        CUDA_CHECK(cudaMemcpyAsync(p, src, got, cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaEventRecord(h_[cur_].done, s));
        Half& h = h_[cur_];
        h.pending.push_back({dst, static_cast<size_t>(p - h.p), got});
        dst += got;
        src += got;
        left -= got;
      }
    }
    drain_all();
  } catch (...) {
    // The destinations may not outlive the caller's unwinding: forget them. The pinned bytes
    // stay guarded by the halves' events.
    for (Half& h : h_) h.pending.clear();
    throw;
  }
}

}  // namespace dynemb::cuda
