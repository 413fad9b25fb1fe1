// The three-pass path: per-(bag, bucket) counts -> one exclusive scan over all new_lengths
// (cub, in bucketize.cu) -> placement. Any W, any bag lengths; bag_offsets are an input.
#pragma once

#include <cstdint>

#include "bucketize/config.cuh"
#include "bucketize/placement.cuh"
#include "bucketize/ranking.cuh"
#include "bucketize/routing.cuh"

namespace dynemb::cuda::bucketize {

// ------------------------------------------------------- three-pass path, bags <= 64 ids
// A warp per bag, 8 bags per block; tiles of 32 ids, kPre of them loaded before the first is
// ranked. An id's slot in its (bucket, bag) segment: ids of the same bucket in earlier tiles
// + earlier lanes of its tile with the same bucket (__match_any_sync).

__global__ void __launch_bounds__(kThreads) count_warp_kernel(BucketizeArgs a, FastDivU64 wd) {
  __shared__ int hist[kBagsPerBlock][kMaxSharedW];
  const int grp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t W = a.world_size;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kBagsPerBlock + grp;
  const bool active = g < a.total_bags;
  BagInfo b{};
  if (active) b = bag_info(a, g);
  for (int64_t d = lane; d < W; d += 32) hist[grp][d] = 0;
  __syncwarp();
  const int64_t len = active ? b.id_end - b.id_begin : 0;
  // Loop bounds are uniform over the warp, so __match_any_sync sees whole warps.
  for (int64_t c0 = 0; c0 < len; c0 += 32 * kPre) {
    int64_t idv[kPre];
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int64_t off = c0 + u * 32 + lane;
      idv[u] = off < len ? a.ids[b.id_begin + off] : 0;
    }
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int64_t off = c0 + u * 32 + lane;
      int64_t dest = -1, local;
      if (off < len) route(idv[u], b, wd, a.ids_i32, &dest, &local);
      // Warp-aggregated: one shared atomic per (warp, bucket) instead of one per id.
      const unsigned same = __match_any_sync(0xffffffffu, dest);
      if (dest >= 0 && (same & ((1u << lane) - 1u)) == 0) atomicAdd(&hist[grp][dest], __popc(same));
    }
  }
  __syncwarp();
  if (active)
    for (int64_t d = lane; d < W; d += 32) a.new_lengths[b.nl0 + d * b.rank_bags] = hist[grp][d];
}

__global__ void __launch_bounds__(kThreads) place_warp_kernel(BucketizeArgs a, FastDivU64 wd) {
  __shared__ int64_t base[kBagsPerBlock][kMaxSharedW];  // next free slot per bucket for this bag
  const int grp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t W = a.world_size;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kBagsPerBlock + grp;
  const bool active = g < a.total_bags;
  BagInfo b{};
  if (active) b = bag_info(a, g);
  for (int64_t d = lane; d < W; d += 32)
    base[grp][d] = active ? a.new_offsets[b.nl0 + d * b.rank_bags] : 0;
  const int64_t len = active ? b.id_end - b.id_begin : 0;
  for (int64_t c0 = 0; c0 < len; c0 += 32 * kPre) {
    int64_t idv[kPre];
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int64_t off = c0 + u * 32 + lane;
      idv[u] = off < len ? a.ids[b.id_begin + off] : 0;
    }
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int64_t t0 = c0 + u * 32;
      if (t0 >= len) break;  // uniform over the warp
      __syncwarp();          // base of the previous tile
      const int64_t i = b.id_begin + t0 + lane;
      const bool valid = t0 + lane < len;
      int64_t dest = -1, local = 0;
      if (valid) route(idv[u], b, wd, a.ids_i32, &dest, &local);
      const unsigned same = __match_any_sync(0xffffffffu, dest);
      const int below = __popc(same & ((1u << lane) - 1u));
      if (valid) {
        const int64_t pos = base[grp][dest] + below;
        a.new_values[pos] = local;
        if (a.weights) a.new_weights[pos] = a.weights[i];
        a.perm[i] = pos - b.rank_id_base;
        if (a.dest_rank) a.dest_rank[i] = dest;
      }
      __syncwarp();
      if (valid && below == 0) base[grp][dest] += __popc(same);
    }
  }
}

// W > kMaxSharedW: one thread per bag, ids in order (counts, then cursors in new_offsets).
__global__ void count_thread_kernel(BucketizeArgs a, FastDivU64 wd) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= a.total_bags) return;
  const BagInfo b = bag_info(a, g);
  for (int64_t d = 0; d < a.world_size; ++d) a.new_lengths[b.nl0 + d * b.rank_bags] = 0;
  for (int64_t i = b.id_begin; i < b.id_end; ++i) {
    int64_t dest, local;
    route(a.ids[i], b, wd, a.ids_i32, &dest, &local);
    ++a.new_lengths[b.nl0 + dest * b.rank_bags];
  }
}

__global__ void place_thread_kernel(BucketizeArgs a, FastDivU64 wd) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= a.total_bags) return;
  const BagInfo b = bag_info(a, g);
  for (int64_t i = b.id_begin; i < b.id_end; ++i) {
    int64_t dest, local;
    route(a.ids[i], b, wd, a.ids_i32, &dest, &local);
    const int64_t pos = a.new_offsets[b.nl0 + dest * b.rank_bags]++;  // bag-owned cursor
    a.new_values[pos] = local;
    if (a.weights) a.new_weights[pos] = a.weights[i];
    a.perm[i] = pos - b.rank_id_base;
    if (a.dest_rank) a.dest_rank[i] = dest;
  }
}

// ------------------------------------------- three-pass path, long bags (bucketize_block_per_bag)
// A block per bag, chunks of kChunk ids as on the one-pass path: counts, then (after the
// host's scan of new_lengths) the ranking again and the staged placement. Ids are read twice
// (the stage's only extra traffic); batches too large for the one-pass kernel take this path.
template <int Dist, int Bits>
__device__ __forceinline__ void count_chunk(const BucketizeArgs& a, const FastDivU64& wd,
                                            const int64_t* ids, int n, uint64_t blk, int* hist) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  BagInfo rb{};
  rb.blk = blk;
  rb.dist = Dist;
  int64_t id[kIdsPerLane];
#pragma unroll
  for (int k = 0; k < kIdsPerLane; ++k) {
    const int off = w * kWarpIds + k * 32 + lane;
    id[k] = off < n ? ids[off] : 0;
  }
#pragma unroll
  for (int k = 0; k < kIdsPerLane; ++k) {
    const int off = w * kWarpIds + k * 32 + lane;
    int dest = -1;
    if (off < n) {
      int64_t d64, local;
      route(id[k], rb, wd, a.ids_i32, &d64, &local);
      dest = static_cast<int>(d64);
    }
    // One shared atomic per (warp, bucket) instead of one per id.
    const unsigned same = peers<Bits>(dest);
    if (dest >= 0 && (same & ((1u << lane) - 1u)) == 0) atomicAdd(&hist[dest], __popc(same));
  }
}

__global__ void __launch_bounds__(kThreads, 4) count_block_kernel(BucketizeArgs a, FastDivU64 wd) {
  __shared__ int hist[kMaxSharedW];
  const int64_t W = a.world_size;
  const BagInfo b = bag_info(a, blockIdx.x);
  for (int64_t d = threadIdx.x; d < W; d += kThreads) hist[d] = 0;
  __syncthreads();
  const int64_t len = b.id_end - b.id_begin;
  for (int64_t c0 = 0; c0 < len; c0 += kChunk) {
    const int n = static_cast<int>(len - c0 < kChunk ? len - c0 : kChunk);
    const int64_t* ids = a.ids + b.id_begin + c0;
    const bool small = W <= kSmallW;
    if (b.dist == 2)
      small ? count_chunk<2, 4>(a, wd, ids, n, b.blk, hist)
            : count_chunk<2, 8>(a, wd, ids, n, b.blk, hist);
    else if (b.dist == 1)
      small ? count_chunk<1, 4>(a, wd, ids, n, b.blk, hist)
            : count_chunk<1, 8>(a, wd, ids, n, b.blk, hist);
    else
      small ? count_chunk<0, 4>(a, wd, ids, n, b.blk, hist)
            : count_chunk<0, 8>(a, wd, ids, n, b.blk, hist);
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < W; d += kThreads)
    a.new_lengths[b.nl0 + d * b.rank_bags] = hist[d];
}

template <int Bits>
__global__ void __launch_bounds__(kThreads, 4) place_block_kernel(BucketizeArgs a, FastDivU64 wd) {
  __shared__ int wc[kWarps][kMaxSharedW];
  __shared__ int s_cnt[kMaxSharedW], s_lex[kMaxSharedW];
  __shared__ int64_t s_run[kMaxSharedW];
  __shared__ int64_t s_stage[kChunk], s_stage_pos[kChunk];
  const BagInfo b = bag_info(a, blockIdx.x);
  for (int64_t d = threadIdx.x; d < a.world_size; d += kThreads)
    s_run[d] = a.new_offsets[b.nl0 + d * b.rank_bags];  // read after rank_chunk's barriers
  place_bag_chunked<Bits, int64_t>(a, wd, b.dist, b.blk, b.id_begin, b.id_end - b.id_begin,
                                   b.rank_id_base, s_run, wc, s_cnt, s_lex, s_stage, s_stage_pos);
}

}  // namespace dynemb::cuda::bucketize
