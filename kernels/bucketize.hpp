// The bucketize stage on the GPU (FBGEMM's block_bucketize_sparse_features for an RW sharded
// KJT, docs/semantics.md §2): public arguments and the one launch. Plain C++ so host code
// (backends/cuda, bench/, tests) can include it; every pointer is a device pointer, every
// size int64. All W ranks of a batch live on one GPU: "rank buffers" are row ranges of one
// concatenated buffer, described by prefix-offset arrays [R+1].
//
// Layout of the implementation (kernels/bucketize/):
//   config.cuh      launch shapes and limits
//   routing.cuh     an id's destination rank and local id (the bag's rule and block size)
//   ranking.cuh     warp and block ranking primitives (slot of an id among its bucket's ids)
//   placement.cuh   writing ranked ids at their bucketized positions
//   three_pass.cuh  counts -> scan -> placement kernels (any batch)
//   partition.cuh   large batches, W <= 256: a stable partition of each rank's ids by bucket
//                   over tiles of bags (tile counts -> scan of the tile counts -> placement)
//   one_pass.cuh    the one-pass agent and kernel (a block per bag, one cooperative launch)
//   tiles.cu        the partition's tiling, planned on the host (plan_partition_tiles)
// and kernels/bucketize.cu: the dispatch, which picks a path per launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dynemb::cuda {

// A feature's routing rule (DynamicEmb's dist_type); the values of lib/plan's DistType.
enum class RouteRule : int32_t { continuous = 0, roundrobin = 1, hash_roundrobin = 2 };

// Mean bag length from which the three-pass path takes a block per bag (BagPath::automatic).
constexpr int64_t kBlockPerBagMinAvg = 128;

// Bucketizes R KJTs (R = 1 for one rank, R = W for a whole batch). Bags are numbered
// globally, rank-major; rank q owns bags [rank_bag_off[q], rank_bag_off[q+1]).
// new_lengths of rank q start at W*rank_bag_off[q] and are laid out [d][j] (bucket major),
// so one exclusive scan over all of them gives every id's global bucketized position.
struct BucketizeArgs {
  int64_t num_ranks = 1;                  // R
  int64_t world_size = 1;                 // W (buckets)
  int64_t num_features = 0;               // F
  int64_t total_bags = 0;                 // sum over ranks of their bags
  int64_t total_ids = 0;                  // N
  const int64_t* rank_bag_off = nullptr;  // [R+1]
  const int64_t* feat_bag_off = nullptr;  // [R*(F+1)]: rank-local first bag of feature f
  int64_t* bag_offsets = nullptr;         // [total_bags+1] global id offsets (written here)
  const int64_t* ids = nullptr;           // [N]
  const float* weights = nullptr;         // [N] or null
  const uint64_t* block_sizes = nullptr;  // [F] block size of the feature's table
  const RouteRule* dist_types = nullptr;  // [F]
  bool ids_i32 = false;                   // route by u32(id) (int32 KJT values)
  // >= every bag's length (the host knows it): picks threads per bag and the one-pass
  // instance (bags of <= 2048 ids keep their ids on chip; a longer bag there traps).
  int64_t max_bag_len = 0;
  // Beyond the one-pass kernel, with W <= 256: the partition (tiles of bags), a warp per bag,
  // or a 256-thread block per bag (2048-id chunks, coalesced placement through shared memory).
  // automatic takes blocks when bags hold >= kBlockPerBagMinAvg ids on average (their chunks
  // are full) and the partition otherwise (a warp per short bag idles most of its lanes); the
  // warp per bag only when the partition's tiling does not fit (bucketize.cu). Tests force
  // each.
  enum class BagPath { automatic, warp, block, partition } bag_path = BagPath::automatic;
  // The partition's tiles, planned on the host (plan_partition_tiles): tile kt of rank q holds
  // the rank-local bags [tile_j0[q*(T+1) + kt], tile_j0[q*(T+1) + kt + 1]), T = tiles_per_rank;
  // a rank's tiles past its last bag are empty. Null: the partition path is not taken.
  const int64_t* tile_j0 = nullptr;  // [R*(T+1)]
  // tile_id0[q*T + kt]: the global index of tile kt's first id (the host sums the lengths it
  // planned from); a tile past its rank's last bag has the rank's end. Non-null with tile_j0.
  const int64_t* tile_id0 = nullptr;  // [R*T]
  // tile_feat[q*T + kt]: the feature of every bag of tile kt (0 for an empty tile): the tile's
  // one routing rule. Non-null with tile_j0.
  const int32_t* tile_feat = nullptr;  // [R*T]
  // false: the partition's two kernels even where its tiles are all resident (tests, bench).
  bool partition_one_launch = true;
  int64_t tiles_per_rank = 0;  // T
  int64_t tile_max_bags = 0;   // bags of the largest tile
  int64_t tile_max_ids = 0;    // ids of the largest tile (<= one chunk: W <= 16 counts first)
  // Outputs.
  int64_t* new_lengths = nullptr;  // [W*total_bags]
  // [W*total_bags] scratch, not an output: the three passes leave the exclusive scan of
  // new_lengths there, the partition its tile counts, the one-pass kernel nothing.
  int64_t* new_offsets = nullptr;
  int64_t* new_values = nullptr;  // [N] bucketized order (global positions)
  float* new_weights = nullptr;   // [N] when weights
  int64_t* perm = nullptr;        // [N] unbucketize_permute, rank-local positions
  int64_t* dest_rank = nullptr;   // [N] or null
  void* scan_temp = nullptr;      // cub scratch, bucketize_scan_temp_bytes()
  size_t scan_temp_bytes = 0;
};
// Scratch bytes of the three-pass path's scans over n entries.
size_t bucketize_scan_temp_bytes(int64_t n);

// The partition path's tiles of one batch (host side; the table BucketizeArgs::tile_j0 points
// at on the device). A tile holds bags of one feature of one rank, as many as make about
// `tile_ids` ids at the feature's mean bag length over all ranks (0: chosen from the batch's
// size), so that tiles of a batch whose features differ in hotness carry similar work (a tile
// is one block; with equal bag counts, one hot feature's tiles would be the kernels' tail). Only
// the time depends on the tiling, never the output. Inputs as BatchedBucketize holds them:
// rank_bag_off [R+1], feat_bag_off [R*(F+1)] (rank-local), lengths [total_bags]. max_tiles > 0
// (with tile_ids 0): where the first tiling has more than max_tiles tiles (R x tiles_per_rank),
// larger tiles are planned until it has no more (bucketize_partition_resident_capacity(): every
// tile resident, one launch), if tiles of at most four chunks can.
struct PartitionTiling {
  int64_t tiles_per_rank = 0, max_tile_bags = 0;
  int64_t max_tile_ids = 0;        // ids of the largest tile
  std::vector<int64_t> tile_j0;    // [R*(tiles_per_rank+1)]
  std::vector<int64_t> tile_id0;   // [R*tiles_per_rank]: global index of each tile's first id
  std::vector<int32_t> tile_feat;  // [R*tiles_per_rank]: the feature of its bags (empty: 0)
};
PartitionTiling plan_partition_tiles(int64_t world_size, int64_t num_features,
                                     const std::vector<int64_t>& rank_bag_off,
                                     const std::vector<int64_t>& feat_bag_off,
                                     const std::vector<int64_t>& lengths, int64_t tile_ids = 0,
                                     int64_t max_tiles = 0);

// Workspace of the cooperative launches (the one-pass kernel, the partition's one launch),
// owned by the caller: their epoch-tagged words. Without scratch every launch takes the other
// paths (the partition's two kernels, the three passes).
struct BucketizeOnePass {
  void* scratch = nullptr;  // bucketize_one_pass_scratch_bytes(), zeroed once before first use
  size_t scratch_bytes = 0;
  // max_q (rank_bag_off[q+1] - rank_bag_off[q]), host-known; also sizes the partition's
  // tiles (0: no partition path), so it is set with or without scratch.
  int64_t max_rank_bags = 0;
  uint32_t epoch = 0;  // cooperative launches so far on this scratch (its freshness tag)
};
// 0 when the device cannot launch the one-pass kernel (no cooperative launch). One scratch
// serves one stream: launches on it must not overlap.
size_t bucketize_one_pass_scratch_bytes();
// Zeroes the scratch (epoch 0 = never written); do it once, with BucketizeOnePass::epoch = 0.
void bucketize_one_pass_scratch_init(void* scratch, size_t bytes, cudaStream_t s);
// Resident blocks of the one-pass kernel on the current device, at most 1024 (0: no
// cooperative launch): the one-pass path needs total_bags <= this.
int64_t bucketize_one_pass_capacity();
// Resident blocks of the partition's one-launch kernel on the current device (0: no
// cooperative launch): the partition takes one launch when R x tiles_per_rank is no larger
// and the workspace has scratch.
int64_t bucketize_partition_resident_capacity();

// The path launch_bucketize takes for these arguments.
enum class BucketizePath {
  one_pass,
  block_per_bag,
  warp_per_bag,
  thread_per_bag,
  partition,           // two kernels (and a scan of the tile counts for many tiles)
  partition_resident,  // every tile resident: one cooperative launch
};
struct BucketizeChoice {
  BucketizePath path = BucketizePath::warp_per_bag;
  int64_t grid = 0;         // one_pass: blocks (= bags); partition*: tiles
  int64_t tile_bags = 0;    // partition*: bags of the largest tile
  int64_t capacity = 0;     // one_pass, partition_resident: resident blocks of the kernel
  bool ids_cached = false;  // one_pass: every bag <= 2048 ids, ids read once
};
BucketizeChoice bucketize_choice(const BucketizeArgs& a, const BucketizeOnePass& ws);
const char* to_string(BucketizePath p);

// The whole stage from `lengths` [total_bags]: writes a.bag_offsets, then bucketizes. A batch
// with at most one bag per resident block (W <= 256, R <= 256, W x bags of one rank <= 65536,
// fewer than 2^31 ids) and a workspace takes the one-pass kernel (cooperative launch, a block
// per bag). Every other batch (or one whose cooperative launch is refused for lack of room):
// with W <= 256, short bags take the partition over the host's tiles: one cooperative launch
// where every tile is resident and ws has scratch (counts, an exchange of tile counts between
// the blocks of a rank, placement), else two kernels (bag offsets, tile counts and new_lengths;
// a cub scan of the tile counts only for many tiles per rank; placement); long bags the bag
// offsets (a cub scan) and the three passes with a block per bag; W > 256 the bag offsets and
// the three passes with a thread per bag (per-(bag, bucket) counts, a cub scan of
// new_lengths, placement). Same outputs, bit for bit, every way (new_offsets is scratch).
// Bumps ws.epoch when it takes a cooperative launch.
void launch_bucketize(const BucketizeArgs& a, const int64_t* lengths, BucketizeOnePass& ws,
                      cudaStream_t s);

// launch_bucketize, recording in trace [kBucketizeTracePoints x blocks] the %globaltimer (ns)
// of each block at the end of each step: the traced instance of the same kernels, for `bench`'s
// step breakdown. The one-pass kernel (a block per bag): 0 start, 1 bag offsets, 2 counts
// published, 3 rank's counts seen, 4 bases, 5 placed. The partition's one launch (a block per
// tile, R x tiles_per_rank): 0 start, 1 bag offsets, 2 counts published, 3 first chunk ranked
// (W <= 16, tiles of one chunk: also the cells and new_lengths), 4 rank's counts seen, 5
// placed. Untouched when the launch takes another path.
constexpr int kBucketizeTracePoints = 6;
void launch_bucketize_traced(const BucketizeArgs& a, const int64_t* lengths, BucketizeOnePass& ws,
                             unsigned long long* trace, cudaStream_t s);

}  // namespace dynemb::cuda
