// The NCCL backend: W ranks hosted on G GPUs of one process (G divides W; GPU g
// hosts ranks [g*W/G, (g+1)*W/G)), one communicator (ncclCommInitAll) and one stream per
// GPU. Blocks that cross GPUs move through NCCL (grouped ncclSend/ncclRecv, ncclReduceScatter);
// blocks between ranks of one GPU are device copies. Index work (recat, unbucketize gather,
// reduce, codec) reuses the CUDA backend's kernels (gather.hpp, pooled.hpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backend.hpp"

namespace dynemb {

struct NcclOptions {
  // Pooled, equal batch_size_per_rank, reduce in fp32 (no codec, fp32 data): ncclReduceScatter over
  // the G GPUs (after a local sum of the W/G ranks of each GPU). Otherwise (unequal batches, VBE,
  // codecs, or false here): all-to-all of the chunks, then our reduce kernel in rank order, which
  // is bit-exact with the CPU reference whatever the data (docs/multi-node.md, "Sum order").
  bool pooled_reduce_scatter = true;
  // Also send blocks between two ranks of the same GPU through NCCL (send/recv to self)
  // instead of device copies. Slower; lets a one-GPU machine exercise the grouped
  // ncclSend/ncclRecv code.
  bool intra_gpu_via_nccl = false;
};

// `devices`: CUDA ordinals, distinct; empty = every visible GPU. A plan with W ranks uses the
// first G' devices, G' the largest divisor of W not above devices.size(). Throws DeviceError
// when a device is missing or NCCL cannot initialise, UsageError on a repeated device.
std::unique_ptr<Backend> make_nccl_backend(const std::vector<int>& devices,
                                           const NcclOptions& opt = {});
// Visible CUDA devices (0 when none or no driver); never throws.
int nccl_visible_devices();
// "2.28.9" (the linked library's version).
std::string nccl_version();

}  // namespace dynemb
