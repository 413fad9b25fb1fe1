// The NCCL backend: W ranks hosted on G GPUs (G divides W; GPU g hosts ranks
// [g*W/G, (g+1)*W/G)), one NCCL rank and one stream per GPU: all G GPUs in one process
// (ncclCommInitAll), or spread over P processes with the same number of GPUs each
// (ncclCommInitRank, docs/multi-node.md "NCCL across processes"). Blocks that cross GPUs move
// through NCCL (grouped ncclSend/ncclRecv, ncclReduceScatter); blocks between ranks of one GPU are
// device copies. Index work (recat, unbucketize gather, reduce, codec) reuses the CUDA backend's
// kernels (gather.hpp, pooled.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
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
// The processes of one NCCL backend spread over processes (as nccl-tests with MPI=1): process
// `index` of `size`, each with the same number g of local GPUs, G = size * g GPUs in all.
// Process p's GPUs are the global GPUs [p*g, (p+1)*g), and it hosts the capture ranks
// [p*W/P, (p+1)*W/P) of a plan of W ranks (G must divide W). No MPI here: the caller supplies
// the broadcast (lib/replay/mpi_team.cpp, or a test).
struct NcclProcessGroup {
  int index = 0;  // this process, 0 .. size - 1
  int size = 1;
  // Broadcast from process 0, called once by make_nccl_backend in every process with a string
  // of the same length everywhere (process 0's holds the NCCL unique id and its GPU count); on
  // return every process's string must hold process 0's bytes. With MPI:
  //   MPI_Bcast(&s[0], int(s.size()), MPI_BYTE, 0, comm)
  std::function<void(std::string&)> broadcast;
  // A dist that has not finished after this long throws DeviceError (a peer process gone, or
  // one that never entered the collective) instead of waiting forever; 0: wait forever.
  double timeout_s = 600;
};

// The capture ranks process `pg.index` hosts under a plan of `world_size` ranks: [first, last).
inline std::pair<int64_t, int64_t> nccl_process_ranks(int64_t world_size,
                                                      const NcclProcessGroup& pg) {
  return {pg.index * world_size / pg.size, (pg.index + 1) * world_size / pg.size};
}

// The backend across processes, made collectively: every process of `pg` calls it at the same
// time (it broadcasts the unique id, then joins the communicator of all G GPUs). `devices`: this
// process's CUDA ordinals, distinct, all of them used (empty = every visible GPU: right when the
// launcher gives each process its own CUDA_VISIBLE_DEVICES). Then, for a plan of W ranks
// (G | W), each output dist is collective too, and in every process:
//   - local_embs has all W entries, each with its dtype and shape (identical in every process:
//     the checks read them), and host data for this process's ranks (nccl_process_ranks); the
//     other ranks' data is never read (their `host` may be null);
//   - ctx has all W contexts, identical in every process, so every process validates alike:
//     an OutputDistFailure, or the UsageError of a W that G does not divide, is thrown in every
//     process before any collective;
//   - the sink receives this process's ranks only, in rank order.
// Any other exception (DeviceError) aborts this process's communicators (ncclCommAbort) first,
// and the backend cannot run another dist; the peers then fail with DeviceError (an NCCL
// remote error, or `timeout_s`), but a peer blocked in NCCL's initialisation or connection
// setup is only ended by its launcher: the caller must end the job (MPI_Abort) on such an error.
// Throws DeviceError when a device is missing or NCCL cannot initialise, UsageError on a
// repeated device, a bad `pg`, or a GPU count that differs from process 0's; such a failure is
// this process's alone, its peers wait in the broadcast or in ncclCommInitRank: the caller must
// end the job on any exception from this call too.
std::unique_ptr<Backend> make_nccl_backend(const std::vector<int>& devices, const NcclOptions& opt,
                                           const NcclProcessGroup& pg);

// Visible CUDA devices (0 when none or no driver); never throws.
int nccl_visible_devices();
// "2.28.9" (the linked library's version).
std::string nccl_version();

}  // namespace dynemb
