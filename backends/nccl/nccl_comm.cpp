// The communicator set of the NCCL backend: one NCCL rank per GPU, all in this process
// (ncclCommInitAll) or spread over processes (ncclCommInitRank per local GPU).
#include "nccl_comm.hpp"

#include <chrono>
#include <string>
#include <thread>

#include "common/error.hpp"
#include "cuda_check.hpp"
#include "nccl_check.hpp"

namespace dynemb::nccl {

World::World(const std::vector<int>& devices)
    : nranks_(static_cast<int>(devices.size())), devices_(devices) {
  comms_.assign(devices_.size(), nullptr);
  try {
    // ncclCommInitAll: a clique of nranks_ ranks in this process, rank g on devices_[g].
    NCCL_CHECK(ncclCommInitAll(comms_.data(), nranks_, devices_.data()));
    make_streams();
  } catch (...) {
    abort();  // the destructor does not run for a constructor that throws
    throw;
  }
}

World::World(const ncclUniqueId& id, int nranks, int first, const std::vector<int>& devices,
             double timeout_s)
    : nranks_(nranks), first_(first), timeout_s_(timeout_s), devices_(devices) {
  if (devices_.empty() || first < 0 || nranks < first + local_size())
    throw Error("nccl::World: local GPUs [" + std::to_string(first) + ", " +
                std::to_string(first + local_size()) + ") do not fit a communicator of " +
                std::to_string(nranks) + " GPUs");
  comms_.assign(devices_.size(), nullptr);
  try {
    // One thread joins several NCCL ranks: NCCL needs them in one group, or the first
    // ncclCommInitRank would wait for the others forever. Nothing may throw between
    // ncclGroupStart and ncclGroupEnd (the group would stay open), so errors are kept and thrown
    // after it.
    cudaError_t set = cudaSuccess;
    ncclResult_t init = ncclSuccess;
    NCCL_CHECK(ncclGroupStart());
    for (int i = 0; i < local_size() && set == cudaSuccess && init == ncclSuccess; ++i) {
      set = cudaSetDevice(devices_[i]);
      if (set == cudaSuccess) init = ncclCommInitRank(&comms_[i], nranks_, id, first_ + i);
    }
    const ncclResult_t end = ncclGroupEnd();
    CUDA_CHECK(set);
    NCCL_CHECK(init);
    NCCL_CHECK(end);
    make_streams();
  } catch (...) {
    abort();
    throw;
  }
}

void World::make_streams() {
  for (int i = 0; i < local_size(); ++i) {
    CUDA_CHECK(cudaSetDevice(devices_[i]));
    cudaStream_t s = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams_.push_back(s);
  }
}

World::~World() {
  // Destructors never throw. After abort() the streams may still hold kernels that never end
  // (a peer gone): they are not waited for.
  for (size_t i = 0; i < streams_.size(); ++i) {
    cudaSetDevice(devices_[i]);
    if (!aborted_) cudaStreamSynchronize(streams_[i]);
    cudaStreamDestroy(streams_[i]);
  }
  for (ncclComm_t c : comms_)
    if (c) ncclCommDestroy(c);
}

void World::abort() noexcept {
  aborted_ = true;
  for (size_t i = 0; i < comms_.size(); ++i) {
    if (!comms_[i]) continue;
    cudaSetDevice(devices_[i]);
    ncclCommAbort(comms_[i]);  // its own error, if any, changes nothing: we are failing already
    comms_[i] = nullptr;
  }
}

void World::require_live() const {
  if (aborted_)
    throw DeviceError(
        "NCCL: the communicators were aborted after an earlier error; the nccl backend cannot run "
        "another collective");
}

int World::slot(int g) const {
  require_live();
  if (!is_local(g))
    throw Error("nccl::World: GPU " + std::to_string(g) + " is not one of this process's GPUs [" +
                std::to_string(first_) + ", " + std::to_string(first_ + local_size()) + ")");
  return g - first_;
}

void World::set_device(int g) const {
  CUDA_CHECK(cudaSetDevice(device(g)));
}

void World::synchronize() const {
  const int g0 = first_, g1 = first_ + local_size();
  if (timeout_s_ <= 0) {
    for (int g = g0; g < g1; ++g) {
      set_device(g);
      CUDA_CHECK(cudaStreamSynchronize(stream(g)));
    }
  } else {
    // A watchdog as PyTorch's ProcessGroupNCCL has: poll the streams and NCCL's asynchronous
    // errors until every stream is idle, an error shows, or the timeout passes.
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      bool idle = true;
      for (int g = g0; g < g1; ++g) {
        set_device(g);
        const cudaError_t q = cudaStreamQuery(stream(g));
        if (q == cudaErrorNotReady)
          idle = false;
        else
          CUDA_CHECK(q);
        ncclResult_t async = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(comm(g), &async));
        NCCL_CHECK(async);
      }
      if (idle) break;
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_)
        throw DeviceError("NCCL: the collective did not finish within " +
                          std::to_string(static_cast<int64_t>(timeout_s_)) + " s (GPUs [" +
                          std::to_string(g0) + ", " + std::to_string(g1) + ") of " +
                          std::to_string(nranks_) +
                          "); a peer process has probably failed or never entered it");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  for (int g = g0; g < g1; ++g) {
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm(g), &async));
    NCCL_CHECK(async);
  }
}

}  // namespace dynemb::nccl
