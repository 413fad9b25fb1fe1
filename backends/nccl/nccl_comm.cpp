// The communicator set of the NCCL backend: one rank per GPU, all in this process.
#include "nccl_comm.hpp"

#include "cuda_check.hpp"
#include "nccl_check.hpp"

namespace dynemb::nccl {

World::World(const std::vector<int>& devices) : devices_(devices) {
  comms_.assign(devices_.size(), nullptr);
  // ncclCommInitAll: a clique of devices_.size() ranks in this process, rank g on devices_[g].
  NCCL_CHECK(ncclCommInitAll(comms_.data(), size(), devices_.data()));
  for (int g = 0; g < size(); ++g) {
    set_device(g);
    cudaStream_t s = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams_.push_back(s);
  }
}

World::~World() {
  for (int g = 0; g < static_cast<int>(streams_.size()); ++g) {
    cudaSetDevice(devices_[g]);  // destructors never throw
    cudaStreamSynchronize(streams_[g]);
    cudaStreamDestroy(streams_[g]);
  }
  for (ncclComm_t c : comms_)
    if (c) ncclCommDestroy(c);
}

void World::set_device(int g) const {
  CUDA_CHECK(cudaSetDevice(devices_[g]));
}

void World::synchronize() const {
  for (int g = 0; g < size(); ++g) {
    set_device(g);
    CUDA_CHECK(cudaStreamSynchronize(streams_[g]));
  }
  for (int g = 0; g < size(); ++g) {
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comms_[g], &async));
    NCCL_CHECK(async);
  }
}

}  // namespace dynemb::nccl
