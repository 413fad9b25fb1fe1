// Uneven all-to-all of float blocks over the GPUs of a World (what all_to_all_single with
// split sizes does across processes): grouped ncclSend/ncclRecv between GPUs, device copies
// inside one GPU. Across processes each process enqueues its own GPUs' halves of each pair.
#include <cuda_runtime_api.h>

#include "cuda_check.hpp"
#include "nccl_check.hpp"
#include "nccl_comm.hpp"

namespace dynemb::nccl {

void alltoallv(const World& w, const std::vector<Block>& blocks, bool intra_via_nccl) {
  // Device copies first: they need no peer and overlap the NCCL kernels on the same stream
  // order (copies, then the group). A block inside one GPU is local to one process.
  for (const Block& b : blocks) {
    if (b.count <= 0 || b.src_gpu != b.dst_gpu || intra_via_nccl || !w.is_local(b.src_gpu))
      continue;
    w.set_device(b.src_gpu);
    CUDA_CHECK(cudaMemcpyAsync(b.recv, b.send, sizeof(float) * static_cast<size_t>(b.count),
                               cudaMemcpyDeviceToDevice, w.stream(b.src_gpu)));
  }
  // One group for every local GPU: a single thread drives all local communicators, which NCCL
  // allows only inside ncclGroupStart/End. Zero-count blocks are skipped on both sides alike.
  // Nothing may throw inside the group (it would stay open): the first failing call's result is
  // kept, the rest skipped, and it is thrown after ncclGroupEnd.
  w.require_live();
  ncclResult_t res = ncclSuccess;
  const char* call = "";
  NCCL_CHECK(ncclGroupStart());
  for (const Block& b : blocks) {
    if (res != ncclSuccess) break;
    if (b.count <= 0 || (b.src_gpu == b.dst_gpu && !intra_via_nccl)) continue;
    const size_t n = static_cast<size_t>(b.count);
    if (w.is_local(b.src_gpu)) {
      res = ncclSend(b.send, n, ncclFloat32, b.dst_gpu, w.comm(b.src_gpu), w.stream(b.src_gpu));
      call = "ncclSend";
    }
    if (res == ncclSuccess && w.is_local(b.dst_gpu)) {
      res = ncclRecv(b.recv, n, ncclFloat32, b.src_gpu, w.comm(b.dst_gpu), w.stream(b.dst_gpu));
      call = "ncclRecv";
    }
  }
  const ncclResult_t end = ncclGroupEnd();
  if (res != ncclSuccess) throw_nccl(res, call, __FILE__, __LINE__);
  NCCL_CHECK(end);
}

}  // namespace dynemb::nccl
