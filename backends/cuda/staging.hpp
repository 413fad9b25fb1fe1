// Pinned (page-locked) host staging for the CUDA backend's host <-> device copies. A copy from
// pageable memory is staged by the driver through its own pinned buffer and blocks the host;
// through this ring the copies are cudaMemcpyAsync on the caller's stream and an upload returns
// as soon as its bytes are in pinned memory.
//
// Layout: two halves of one cudaHostAlloc'd block, used as a ring. A transfer takes room in
// the current half (a large one is cut into chunks at the half's end); when the half is full
// the ring moves to the other half, first waiting on that half's event, which is recorded
// after every copy into or out of it. So the host never rewrites pinned bytes that an earlier
// async copy still reads (an upload) or will still write (a download). One stream per staging:
// an event only covers the stream it was last recorded on.
//
// Size: grow-only. A half grows to the largest single transfer seen, rounded up to 1 MiB and
// capped at max_half_bytes (larger transfers take several chunks); after the first call of a
// given size no pinned allocation happens. Growing waits for every pending copy first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "device_buffer.hpp"

namespace dynemb::cuda {

// Every pinned allocation a PinnedStaging makes (see AllocCounters).
AllocCounters& pinned_alloc_counters();

class PinnedStaging {
 public:
  static constexpr size_t kDefaultMaxHalfBytes = size_t{32} << 20;
  explicit PinnedStaging(size_t max_half_bytes = kDefaultMaxHalfBytes);
  ~PinnedStaging();  // waits for pending copies, then frees
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // Copies `bytes` from host into pinned memory now and enqueues pinned -> dev on s. The host
  // source may be reused or freed on return; dev is written in stream order.
  void upload(void* dev, const void* host, size_t bytes, cudaStream_t s);
  template <typename T>
  void upload(DeviceBuffer<T>& dev, const std::vector<T>& host, cudaStream_t s) {
    dev.resize(static_cast<int64_t>(host.size()));
    upload(dev.data(), host.data(), sizeof(T) * host.size(), s);
  }

  // One device -> host copy: `bytes` from dev (device) to host (any host memory).
  struct ToHost {
    void* host;
    const void* dev;
    size_t bytes;
  };
  // Enqueues every copy on s (in stream order after the work already there) and returns when
  // all host bytes are written: the one synchronisation of a download.
  void download(const std::vector<ToHost>& parts, cudaStream_t s);
  template <typename T>
  std::vector<T> download(const DeviceBuffer<T>& dev, cudaStream_t s) {
    std::vector<T> v(static_cast<size_t>(dev.size()));
    download({{v.data(), dev.data(), sizeof(T) * v.size()}}, s);
    return v;
  }

  size_t half_bytes() const { return half_; }

  // Host memory lent for direct uploads (HostLending): the whole pages inside [p, p + bytes),
  // registered with the driver (cudaHostRegister) the first time, unregistered first where an
  // earlier registration overlaps them (memory freed since). false: too small to be worth it,
  // or the driver refused (uploads from it are staged). While lent, an upload from inside it is
  // one cudaMemcpyAsync from there (the bytes before and after its pages are staged).
  bool lend(void* p, size_t bytes);
  // Not lent any more. The caller has drained every stream that read it.
  void unlend(void* p);
  // Unpinned. The caller has drained every stream that read it.
  void forget(void* p);
  size_t lent_bytes() const;                               // pinned by lend(), lent or not
  uint64_t direct_bytes() const { return direct_bytes_; }  // uploaded from lent memory so far

 private:
  struct Lent {
    uintptr_t end;
    bool active;
  };
  std::map<uintptr_t, Lent> lent_;  // page-aligned begin -> its pages, registered
  uint64_t direct_bytes_ = 0;
  struct Pending {  // a chunk copied device -> pinned, to be copied on to the host
    void* host;
    size_t off, bytes;
  };
  struct Half {
    char* p = nullptr;
    cudaEvent_t done = nullptr;  // recorded after the latest copy into or out of this half
    size_t used = 0;
    std::vector<Pending> pending;
  };
  static uintptr_t page();
  std::pair<uintptr_t, uintptr_t> lent_part(uintptr_t h, size_t bytes) const;
  void staged_upload(void* dev, const void* host, size_t bytes, cudaStream_t s);
  // Room for up to `want` bytes (at least one) in the current half, moving to the other half
  // when this one is full; *got is how much of it the caller may use.
  char* take(size_t want, size_t* got);
  void grow(size_t want);
  // Waits for h's copies, then copies its pending downloads out and empties it.
  void drain(Half& h);
  void drain_all();
  size_t max_half_, half_ = 0;
  Half h_[2];
  int cur_ = 0;
};

}  // namespace dynemb::cuda
