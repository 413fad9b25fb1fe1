// The GPUs of one NCCL communicator with one stream each, and the two collectives of the output
// dists, one per file as nccl-tests has them: nccl_alltoall.cpp (uneven all-to-all of blocks) and
// nccl_reduce_scatter.cpp.
//
// A World numbers its GPUs 0 .. size() - 1 over all processes: GPU g is NCCL rank g of the
// communicator. In one process (ncclCommInitAll) every GPU is local. Across processes
// (ncclCommInitRank, as nccl-tests builds it with MPI=1) this process holds the consecutive
// global GPUs [first(), first() + local_size()); the others belong to peer processes, and the
// collectives enqueue only what local GPUs send and receive.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <vector>

namespace dynemb::nccl {

class World {
 public:
  // One process, every GPU: ncclCommInitAll, global GPU g on CUDA device devices[g]. Throws
  // DeviceError.
  explicit World(const std::vector<int>& devices);
  // One process of several: `nranks` GPUs over all processes, this process's GPUs the global
  // GPUs first .. first + devices.size() - 1 (global GPU first + i on CUDA device devices[i]).
  // Every process calls it with the same `id` (ncclGetUniqueId on one process, broadcast by the
  // caller) and `nranks`; ncclCommInitRank blocks until all nranks GPUs have joined.
  // `timeout_s` > 0: synchronize() gives up after that long without completion (a peer process
  // gone) and throws DeviceError; 0 waits forever. Throws DeviceError.
  World(const ncclUniqueId& id, int nranks, int first, const std::vector<int>& devices,
        double timeout_s);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int size() const { return nranks_; }  // GPUs over all processes
  int first() const { return first_; }  // this process's first global GPU
  int local_size() const { return static_cast<int>(devices_.size()); }
  bool is_local(int g) const { return g >= first_ && g < first_ + local_size(); }
  // Of a local GPU g (global index); DeviceError for a GPU of another process.
  int device(int g) const { return devices_[slot(g)]; }
  ncclComm_t comm(int g) const { return comms_[slot(g)]; }
  cudaStream_t stream(int g) const { return streams_[slot(g)]; }
  void set_device(int g) const;  // cudaSetDevice(device(g))
  // Waits for every local stream, then reads NCCL's asynchronous errors (a peer that failed
  // shows up there as ncclRemoteError where the transport notices). Across processes with a
  // timeout, polls instead of blocking, so that a peer that never enters the collective ends
  // in a DeviceError here rather than a hang.
  void synchronize() const;
  // ncclCommAbort on every local communicator: kernels waiting on peers are stopped and the
  // peers' transports see the connection go. The World cannot be used afterwards (every call
  // that needs a communicator throws DeviceError). Never throws.
  void abort() noexcept;
  bool aborted() const { return aborted_; }
  // Throws DeviceError after abort(): what a collective checks before its NCCL group.
  void require_live() const;

 private:
  int slot(int g) const;  // index into devices_/comms_/streams_; throws when g is not local
  void make_streams();

  int nranks_ = 0, first_ = 0;
  double timeout_s_ = 0;
  bool aborted_ = false;
  std::vector<int> devices_;  // [local_size()]
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
};

// One block of an uneven all-to-all: `count` floats from global GPU src_gpu (device pointer
// `send`, null where src_gpu is not local) to global GPU dst_gpu (device pointer `recv`, null
// where dst_gpu is not local).
struct Block {
  int src_gpu = 0, dst_gpu = 0;
  const float* send = nullptr;
  float* recv = nullptr;
  int64_t count = 0;
};
// All blocks in one NCCL group: blocks between GPUs are ncclSend/ncclRecv pairs, issued in list
// order on both sides so the k-th send of a GPU pair meets the k-th receive (every process passes
// the same list, so the order is the same in every process); blocks inside one GPU are
// cudaMemcpyAsync on its stream (or a send/recv to self when `intra_via_nccl`). A process
// enqueues the sends of its local source GPUs and the receives of its local destination GPUs.
// Enqueued on the streams; no synchronisation.
void alltoallv(const World& w, const std::vector<Block>& blocks, bool intra_via_nccl);

// ncclReduceScatter (sum, fp32) over the size() GPUs: recv[g] = chunk g of sum_h send[h], every
// chunk `recvcount` floats. send/recv are indexed by global GPU and read for local GPUs only.
// Enqueued on the streams.
void reduce_scatter(const World& w, const std::vector<const float*>& send,
                    const std::vector<float*>& recv, int64_t recvcount);

}  // namespace dynemb::nccl
