// The CUDA backend: all W ranks of a batch live on one GPU; the exchange is
// device memory traffic and the bucketize, lookups, permutes and reductions are our kernels
// (kernels/*.cu). Results are bit-identical to the CPU reference (cpu_backend.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "bucketize.hpp"
#include "cuda_check.hpp"
#include "device_buffer.hpp"
#include "engine/backend.hpp"
#include "gather.hpp"
#include "plan/plan.hpp"
#include "pooled.hpp"
#include "staging.hpp"

namespace dynemb {

// Throws DeviceError when the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
// True when a CUDA device and driver are present; never throws.
bool cuda_device_available();

}  // namespace dynemb

namespace dynemb::cuda {

// The kernels' enums carry the values of the model's (checked here, at the one crossing).
static_assert(static_cast<int>(DType::f32) == static_cast<int>(Precision::f32) &&
              static_cast<int>(DType::f16) == static_cast<int>(Precision::f16) &&
              static_cast<int>(DType::bf16) == static_cast<int>(Precision::bf16));
static_assert(static_cast<int>(DistType::continuous) == static_cast<int>(RouteRule::continuous) &&
              static_cast<int>(DistType::roundrobin) == static_cast<int>(RouteRule::roundrobin) &&
              static_cast<int>(DistType::hash_roundrobin) ==
                  static_cast<int>(RouteRule::hash_roundrobin));
inline Precision precision(DType t) {
  return static_cast<Precision>(static_cast<int>(t));
}
inline RouteRule route_rule(DistType t) {
  return static_cast<RouteRule>(static_cast<int>(t));
}

// Host side of SeqDistArgs for W ranks (all vectors concatenated over ranks; see
// gather.hpp): unbucketize perms, splits prefixes and forward-recat segments.
struct SeqDistTables {
  std::vector<int64_t> local_row_off, out_row_off, perm, recv_off, send_off;
  std::vector<int64_t> seg_base, seg_out, seg_src;
};
// Checks the contexts exactly as the CPU reference does (throws OutputDistFailure naming
// rank and field) and builds the tables. Only the shapes of local_embs are read.
SeqDistTables build_seq_dist_tables(const Plan& plan,
                                    const std::vector<const EmbTensor*>& local_embs,
                                    const std::vector<const ShardingContext*>& ctx);

// The tables on the device. The backend keeps one across calls (assign() refills it, the
// buffers grow only); the bench builds one per run.
struct SeqDistDevice {
  SeqDistDevice() = default;
  SeqDistDevice(const SeqDistTables& t, cudaStream_t s) { assign(t, s); }
  // Uploads t on s, through `staging` when given (pinned, async) else from pageable memory.
  void assign(const SeqDistTables& t, cudaStream_t s, PinnedStaging* staging = nullptr);
  SeqDistArgs args(const Plan& plan, const float* local) const;
  int64_t world_size = 0, total_local_rows = 0, total_out_rows = 0;
  DeviceBuffer<int64_t> local_row_off, out_row_off, perm, recv_off, send_off;
  DeviceBuffer<int64_t> seg_base, seg_out, seg_src;
};

// One batch's bucketize for all W ranks in one launch sequence (launch_bucketize
// over the ranks' bags concatenated rank-major), with the device buffers it reads and writes.
// The backend's bucketize (a replay's input dist) runs every rank of a batch through one
// BatchedBucketize that it keeps across calls (its workspace: assign() refills the buffers,
// which only grow); `dynemb-dist bench` times it and the GPU tests check it against the CPU
// reference. Outputs are laid out rank after rank, each as the CPU reference's BucketizedKjt of
// that rank.
struct BatchedBucketize {
  BatchedBucketize() = default;  // no batch yet: assign() one
  // kjts[r] is rank r's input KJT (all of one values type): all W ranks, or any R of them.
  BatchedBucketize(const Plan& plan, const std::vector<const Kjt*>& kjts, bool with_dest_rank,
                   cudaStream_t s) {
    assign(plan, kjts, with_dest_rank, s);
  }
  // Takes another batch: the host copies, the device inputs (uploaded on s, through `staging`
  // when given, else from pageable memory), the output buffers (grown where this batch is
  // larger) and args. bag_path goes back to automatic; the one-pass workspace is kept.
  void assign(const Plan& plan, const std::vector<const Kjt*>& kjts, bool with_dest_rank,
              cudaStream_t s, PinnedStaging* staging = nullptr);
  // Host copies of the concatenated lengths and of where each rank's bags and ids begin (the
  // ids themselves are on the device only).
  std::vector<int64_t> lengths, rank_bag_off, rank_id_off;  // [L], [R+1], [R+1]
  int64_t max_rank_bags = 0;                                // bags of the largest rank
  DeviceBuffer<int64_t> d_ids, d_lengths, d_bag_offsets, d_rank_bag_off, d_feat_bag_off;
  DeviceBuffer<int64_t> d_new_lengths, d_new_offsets, d_new_values, d_perm, d_dest_rank;
  DeviceBuffer<uint64_t> d_block_sizes;
  DeviceBuffer<RouteRule> d_dist_types;
  DeviceBuffer<float> d_weights, d_new_weights;
  DeviceBuffer<char> d_scan_temp;
  DeviceBuffer<int64_t> d_tile_j0;    // the partition path's tiles (plan_tiles)
  DeviceBuffer<int64_t> d_tile_id0;   // and their first ids
  DeviceBuffer<int32_t> d_tile_feat;  // and features
  std::vector<int64_t> feat_bag_off;  // [R*(F+1)] host copy of d_feat_bag_off
  BucketizeArgs args;                 // points at the buffers above
  // The one-pass kernel's workspace: empty (three passes) until enable_one_pass().
  BucketizeOnePass one_pass;
  DeviceBuffer<char> d_one_pass_scratch;

  // Allocates and zeroes the one-pass workspace where the device can run that kernel, so that
  // launch() takes it whenever the batch fits (bucketize_choice), and the partition's one
  // launch likewise (the tiles are planned again for it). Once: a later call (another batch)
  // keeps the scratch and its epoch, which the kernels need to tell old words from new.
  void enable_one_pass(cudaStream_t s);
  // Plans the partition path's tiles for about tile_ids ids each (0: chosen from the batch,
  // all resident where the one launch can take them; the constructor plans with 0) and points
  // args at them. Only the time depends on it.
  void plan_tiles(int64_t tile_ids, cudaStream_t s);
  // The whole stage on s: bag_offsets from the lengths, then the bucketize.
  void launch(cudaStream_t s) { launch_bucketize(args, d_lengths.data(), one_pass, s); }
};

}  // namespace dynemb::cuda
