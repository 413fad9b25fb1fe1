// Uneven all-to-all of float blocks over the GPUs of a World (what all_to_all_single with
// split sizes does across processes): grouped ncclSend/ncclRecv between GPUs, device copies
// inside one GPU.
#include <cuda_runtime_api.h>

#include "cuda_check.hpp"
#include "nccl_check.hpp"
#include "nccl_comm.hpp"

namespace dynemb::nccl {

void alltoallv(const World& w, const std::vector<Block>& blocks, bool intra_via_nccl) {
  // Device copies first: they need no peer and overlap the NCCL kernels on the same stream
  // order (copies, then the group).
  for (const Block& b : blocks) {
    if (b.count <= 0 || b.src_gpu != b.dst_gpu || intra_via_nccl) continue;
    w.set_device(b.src_gpu);
    CUDA_CHECK(cudaMemcpyAsync(b.recv, b.send, sizeof(float) * static_cast<size_t>(b.count),
                               cudaMemcpyDeviceToDevice, w.stream(b.src_gpu)));
  }
  // One group for every GPU: a single thread drives all communicators, which NCCL allows
  // only inside ncclGroupStart/End. Zero-count blocks are skipped on both sides alike.
  NCCL_CHECK(ncclGroupStart());
  for (const Block& b : blocks) {
    if (b.count <= 0 || (b.src_gpu == b.dst_gpu && !intra_via_nccl)) continue;
    const size_t n = static_cast<size_t>(b.count);
    NCCL_CHECK(ncclSend(b.send, n, ncclFloat32, b.dst_gpu, w.comm(b.src_gpu), w.stream(b.src_gpu)));
    NCCL_CHECK(ncclRecv(b.recv, n, ncclFloat32, b.src_gpu, w.comm(b.dst_gpu), w.stream(b.dst_gpu)));
  }
  NCCL_CHECK(ncclGroupEnd());
}

}  // namespace dynemb::nccl
