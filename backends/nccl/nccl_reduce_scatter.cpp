// Equal-chunk reduce-scatter (sum, fp32) over the GPUs of a World: reduce_scatter_tensor.
#include "nccl_check.hpp"
#include "nccl_comm.hpp"

namespace dynemb::nccl {

void reduce_scatter(const World& w, const std::vector<const float*>& send,
                    const std::vector<float*>& recv, int64_t recvcount) {
  if (recvcount <= 0) return;
  NCCL_CHECK(ncclGroupStart());
  for (int g = 0; g < w.size(); ++g)
    NCCL_CHECK(ncclReduceScatter(send[g], recv[g], static_cast<size_t>(recvcount), ncclFloat32,
                                 ncclSum, w.comm(g), w.stream(g)));
  NCCL_CHECK(ncclGroupEnd());
}

}  // namespace dynemb::nccl
