// Equal-chunk reduce-scatter (sum, fp32) over the GPUs of a World: reduce_scatter_tensor.
// Across processes each process enqueues it on its own GPUs.
#include "nccl_check.hpp"
#include "nccl_comm.hpp"

namespace dynemb::nccl {

void reduce_scatter(const World& w, const std::vector<const float*>& send,
                    const std::vector<float*>& recv, int64_t recvcount) {
  if (recvcount <= 0) return;
  // Nothing may throw inside the group (see alltoallv): the first failure is thrown after it.
  w.require_live();
  ncclResult_t res = ncclSuccess;
  NCCL_CHECK(ncclGroupStart());
  for (int g = w.first(); g < w.first() + w.local_size() && res == ncclSuccess; ++g)
    res = ncclReduceScatter(send[g], recv[g], static_cast<size_t>(recvcount), ncclFloat32, ncclSum,
                            w.comm(g), w.stream(g));
  const ncclResult_t end = ncclGroupEnd();
  if (res != ncclSuccess) throw_nccl(res, "ncclReduceScatter", __FILE__, __LINE__);
  NCCL_CHECK(end);
}

}  // namespace dynemb::nccl
