// G GPUs of one process with one NCCL communicator and one stream each (ncclCommInitAll),
// and the two collectives of the output dists, one per file as nccl-tests has them:
// nccl_alltoall.cpp (uneven all-to-all of blocks) and nccl_reduce_scatter.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <vector>

namespace dynemb::nccl {

class World {
 public:
  explicit World(const std::vector<int>& devices);  // ncclCommInitAll; throws DeviceError
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  int size() const { return static_cast<int>(devices_.size()); }
  int device(int g) const { return devices_[g]; }
  ncclComm_t comm(int g) const { return comms_[g]; }
  cudaStream_t stream(int g) const { return streams_[g]; }
  void set_device(int g) const;  // cudaSetDevice(device(g))
  void synchronize() const;      // every stream; then NCCL's async errors, if any

 private:
  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
};

// One block of an uneven all-to-all: `count` floats from GPU src_gpu (device pointer `send`)
// to GPU dst_gpu (device pointer `recv`).
struct Block {
  int src_gpu = 0, dst_gpu = 0;
  const float* send = nullptr;
  float* recv = nullptr;
  int64_t count = 0;
};
// All blocks in one NCCL group: blocks between GPUs are ncclSend/ncclRecv pairs, issued in
// list order on both sides so the k-th send of a GPU pair meets the k-th receive; blocks
// inside one GPU are cudaMemcpyAsync on its stream (or a send/recv to self when
// `intra_via_nccl`). Enqueued on the streams; no synchronisation.
void alltoallv(const World& w, const std::vector<Block>& blocks, bool intra_via_nccl);

// ncclReduceScatter (sum, fp32) over the G GPUs: recv[g] = chunk g of sum_h send[h], every
// chunk `recvcount` floats. Enqueued on the streams.
void reduce_scatter(const World& w, const std::vector<const float*>& send,
                    const std::vector<float*>& recv, int64_t recvcount);

}  // namespace dynemb::nccl
