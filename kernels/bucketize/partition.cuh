// The large-batch path (W <= 256, any number of bags): the bucketize as a device-wide stable
// partition of each rank's ids by destination bucket, over tiles of consecutive bags.
//
// Why it is a partition: rank q's outputs are bucket-major, then bag order, then id order
// inside a bag (docs/semantics.md §3.3). A rank's bags are consecutive in the input and its
// ids are in bag order, so "bag order, then id order" is input order, and an id's global
// position is
//   (ids of ranks < q) + (rank q's ids of buckets < d) + (rank q's bucket-d ids before it),
// where d is its bucket: a stable partition of the rank's ids by d, shifted to the rank's
// first output. The bag an id belongs to matters only for its routing rule (the bag's
// feature) and for new_lengths, never for its position.
//
// Tiles: tile (q, kt), kt < tiles_per_rank, holds rank q's bags [j0, j1) from the host's
// table (tile_j0; bags of one feature, sized for similar ids per tile; tiles past a rank's
// last bag are empty and count zero), its first id (tile_id0: the host sums the lengths it
// planned the tiles from) and its feature (tile_feat: one routing rule per tile, read once
// per block). From the bag lengths:
//   partition_count_kernel  per tile: the tile's bag offsets (a block scan of its lengths,
//                           shifted to its first id): writes the bag offsets; each id's bag
//                           and bucket; the W x nb counts in shared memory become new_lengths
//                           (the tile's nb entries of each bucket row are consecutive) and the
//                           tile's total per bucket, tile_cnt[q][d][kt];
//   (cub exclusive scan     of tile_cnt in (q, d, kt) order, only when W x tiles_per_rank >
//                           kPartDirectBaseEntries: tile_base[q][d][kt] is the global position
//                           of the tile's first bucket-d id; else the place kernel sums its
//                           rank's row of tile_cnt itself, the same value);
//   partition_place_kernel  per tile, 2048-id chunks in input order, ranked as the block-per-
//                           bag path ranks a bag's chunk (ranking.cuh, stable, by the tile's
//                           rule), placed through shared memory (placement.cuh) from run[d] =
//                           tile_base, advanced by each chunk's counts.
// Ids are read twice (count, place); new_lengths written once; new_offsets is not produced:
// its buffer holds tile_cnt, then tile_base (2 x R x W x tiles_per_rank <= W x total_bags, the
// dispatch checks).
#pragma once

#include <cstdint>

#include "bucketize/config.cuh"
#include "bucketize/placement.cuh"
#include "bucketize/ranking.cuh"
#include "bucketize/routing.cuh"

namespace dynemb::cuda::bucketize {

struct PartitionArgs {
  BucketizeArgs a;
  const int64_t* lengths;    // [total_bags] bag lengths (the stage's input)
  FastDivU64 wd;             // divides by W
  const int64_t* tile_j0;    // [R][tiles_per_rank+1] rank-local first bag of each tile
                             // (BucketizeArgs::tile_j0): <= kPartMaxTileBags bags a tile,
                             // W x bags <= kPartMaxCells
  const int64_t* tile_id0;   // [R][tiles_per_rank] global index of each tile's first id
  const int32_t* tile_feat;  // [R][tiles_per_rank] the feature of each tile's bags
  int64_t tiles_per_rank;    // T
  int64_t* tile_cnt;         // [R][W][tiles_per_rank]
  int64_t* tile_base;        // [R][W][tiles_per_rank], exclusive scan of tile_cnt; nullptr:
                             // the place kernel sums tile_cnt of its rank itself
};

// The block's tile, the same in all its threads.
struct PartitionTile {
  int64_t q, kt;         // rank, tile index in the rank
  int64_t first;         // the rank's first (global) bag
  int64_t rank_bags;     // bags of the rank: new_lengths stride per bucket
  int64_t j0;            // the tile's first bag, rank-local
  int nb;                // bags in this tile (0: past the rank's last bag)
  int f;                 // the feature of its bags
  int64_t id0;           // global index of the tile's first id
  int64_t rank_id_base;  // global index of the rank's first id (perm is rank-local)
};

// The routing rule of a tile's bags (their feature's), in shared memory: read from global
// memory once per block, beside the tile's first loads, instead of once per thread where its
// first id is routed.
struct TileRule {
  uint64_t blk;  // the feature's block size
  int dist;      // its RouteRule
};

// The block's tile from the host's table: rank, index in the rank, first bag (rank-local), bag
// count (0: past the rank's last bag) and feature. Same in every thread. With bags, thread 0
// also starts the read of the rule; it is in `rule` after the caller's next barrier.
__device__ __forceinline__ void tile_span(const PartitionArgs& p, PartitionTile& ti,
                                          TileRule* rule) {
  const BucketizeArgs& a = p.a;
  ti.q = static_cast<int64_t>(blockIdx.x) / p.tiles_per_rank;
  ti.kt = static_cast<int64_t>(blockIdx.x) - ti.q * p.tiles_per_rank;
  ti.first = a.rank_bag_off[ti.q];
  ti.rank_bags = a.rank_bag_off[ti.q + 1] - ti.first;
  const int64_t* tj = p.tile_j0 + ti.q * (p.tiles_per_rank + 1) + ti.kt;
  ti.j0 = tj[0];
  ti.nb = static_cast<int>(tj[1] - tj[0]);
  ti.f = p.tile_feat[blockIdx.x];
  if (threadIdx.x == 0 && ti.nb > 0) {
    rule->blk = a.block_sizes[ti.f];
    rule->dist = static_cast<int>(a.dist_types[ti.f]);
  }
}

// Reads the tile's geometry; when it has bags, off[k] = first id of its bag k relative to id0
// (k <= nb; the host keeps nb x max_bag_len + kChunk < 2^31) and its rule. Ends with a barrier
// (off and the rule are read by every thread afterwards).
__device__ __forceinline__ PartitionTile load_tile(const PartitionArgs& p, int* off,
                                                   TileRule* rule) {
  const BucketizeArgs& a = p.a;
  PartitionTile ti;
  tile_span(p, ti, rule);
  ti.id0 = 0;
  ti.rank_id_base = 0;
  if (ti.nb > 0) {
    const int64_t g0 = ti.first + ti.j0;
    ti.id0 = a.bag_offsets[g0];
    ti.rank_id_base = a.bag_offsets[ti.first];
    for (int k = threadIdx.x; k <= ti.nb; k += kThreads)
      off[k] = static_cast<int>(a.bag_offsets[g0 + k] - ti.id0);
  }
  __syncthreads();
  return ti;
}

// The count kernel's tile: as load_tile, but the offsets come from the bag lengths (a block
// scan of the tile's nb lengths, shifted to the host's tile_id0), so no offsets scan runs
// before it and no tile waits on another. rank_id_base is not set (0). Ends with a barrier.
// wsum: kWarps ints.
__device__ __forceinline__ PartitionTile scan_tile(const PartitionArgs& p, int* off, TileRule* rule,
                                                   int* wsum) {
  const BucketizeArgs& a = p.a;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  PartitionTile ti;
  tile_span(p, ti, rule);
  ti.rank_id_base = 0;
  ti.id0 = p.tile_id0[blockIdx.x];
  const int64_t g0 = ti.first + ti.j0;
  // Bags 2t and 2t+1 of the tile (nb <= 2 x kThreads); a bag and the tile hold < 2^31 ids
  // (the host's bound on nb x max_bag_len).
  const int k0 = 2 * t;
  const int l0 = k0 < ti.nb ? static_cast<int>(p.lengths[g0 + k0]) : 0;
  const int l1 = k0 + 1 < ti.nb ? static_cast<int>(p.lengths[g0 + k0 + 1]) : 0;
  int x = l0 + l1;  // inclusive scan over the warp's threads
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) wsum[warp] = x;
  __syncthreads();  // wsum (and the rule) written
  int below = 0;
  for (int wi = 0; wi < warp; ++wi) below += wsum[wi];
  const int incl = below + x;  // ids of the tile's bags 0 .. 2t+1
  if (t == 0) off[0] = 0;
  if (k0 < ti.nb) off[k0 + 1] = incl - l1;
  if (k0 + 1 < ti.nb) off[k0 + 2] = incl;
  __syncthreads();  // off written
  // The offsets of the tile's bags, for the place kernel and the caller: bag g's end is
  // written by the tile holding g; offset 0 by block 0.
  for (int k = t; k < ti.nb; k += kThreads) a.bag_offsets[g0 + k + 1] = ti.id0 + off[k + 1];
  if (blockIdx.x == 0 && t == 0) a.bag_offsets[0] = 0;
  return ti;
}

// The tile's bag holding tile-relative id i: the last k < nb with off[k] <= i (empty bags
// have off[k] == off[k + 1], so the last such k is the bag that holds i), searched from bag
// lo, known to have off[lo] <= i (off[0] = 0 <= i).
__device__ __forceinline__ int tile_bag_from(const int* off, int lo, int nb, int i) {
  int hi = nb;  // invariant: off[lo] <= i, answer in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (off[mid] <= i)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}
__device__ __forceinline__ int tile_bag(const int* off, int nb, int i) {
  return tile_bag_from(off, 0, nb, i);
}

// run[d] = bucket d's first global position in tile kt of its rank: (ids of ranks before it)
// + (the rank's ids of buckets < d) + (its bucket-d ids in tiles < kt). Every id has one
// bucket, so the first term is the rank's first id, rank_first. From the rank's W x T tile
// counts, count(d, k) = tile k's bucket-d ids (k < T), a warp per bucket row. tot: W int64 of
// shared scratch (the rows' totals). A barrier in the middle; ends with run[d] written by
// thread d, before any barrier.
template <typename Count>
__device__ __forceinline__ void tile_bases(int W, int64_t T, int64_t kt, int64_t rank_first,
                                           Count count, int64_t* tot, int64_t* run) {
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  for (int d = warp; d < W; d += kWarps) {
    int64_t all = 0, pre = 0;
    for (int64_t k = lane; k < T; k += 32) {
      const int64_t c = count(d, k);
      all += c;
      if (k < kt) pre += c;
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      all += __shfl_xor_sync(0xffffffffu, all, o);
      pre += __shfl_xor_sync(0xffffffffu, pre, o);
    }
    if (lane == 0) {
      tot[d] = all;
      run[d] = pre;
    }
  }
  __syncthreads();  // tot[0..W) and run[0..W) written
  for (int d = t; d < W; d += kThreads) {
    int64_t below = rank_first;
    for (int e = 0; e < d; ++e) below += tot[e];  // same e across the warp: broadcast
    run[d] += below;                              // thread d alone writes run[d]
  }
}

// The tile's cells (cells[d * nb + k] = bucket-d ids of its bag k, nb > 0) to new_lengths: rank
// q's start at W x first, entry (d, j) at d x rank_bags + j, so row d of the tile is nb
// consecutive entries.
__device__ __forceinline__ void store_new_lengths(const BucketizeArgs& a, const PartitionTile& ti,
                                                  const int* cells) {
  const int nb = ti.nb, ncells = static_cast<int>(a.world_size) * nb;
  int64_t* nl = a.new_lengths + a.world_size * ti.first + ti.j0;
  for (int e = threadIdx.x; e < ncells; e += kThreads) {
    const int d = e / nb, k = e - d * nb;
    nl[d * ti.rank_bags + k] = cells[e];
  }
}

// The tile's counts (nb > 0): cells[d * nb + k] = bucket-d ids of its bag k (the caller
// stores them as new_lengths: store_new_lengths). Counts are order-free, so thread t takes
// kIdsPerLane consecutive ids of each chunk: one bag search per thread and chunk, then a walk
// forward over the tile's offsets (short bags: about one step per bag); one shared atomic per
// id into its cell. Nothing here is warp-synchronous, so threads past the tile's ids just
// skip. Ends with a barrier (the cells complete).
__device__ __forceinline__ void count_tile(const PartitionArgs& p, const PartitionTile& ti,
                                           const int* off, const TileRule* rule, int* cells) {
  const BucketizeArgs& a = p.a;
  const int t = threadIdx.x;
  const int W = static_cast<int>(a.world_size);
  const int nb = ti.nb, ncells = W * nb;
  for (int e = t; e < ncells; e += kThreads) cells[e] = 0;
  __syncthreads();
  const int n = off[nb];
  const int64_t* ids = a.ids + ti.id0;
  BagInfo rb{};
  rb.blk = rule->blk;
  rb.dist = rule->dist;
  for (int c0 = 0; c0 < n; c0 += kChunk) {
    const int i0 = c0 + kIdsPerLane * t;
    if (i0 >= n) continue;
    int64_t x[kIdsPerLane];
#pragma unroll
    for (int k = 0; k < kIdsPerLane; ++k) x[k] = i0 + k < n ? ids[i0 + k] : 0;
    int kb = tile_bag(off, nb, i0);
#pragma unroll
    for (int k = 0; k < kIdsPerLane; ++k) {
      const int i = i0 + k;
      if (i < n) {
        // off[nb] = n > i ends the walk at the last bag; empty bags (off[kb+1] == off[kb]) are
        // stepped over.
        while (off[kb + 1] <= i) ++kb;
        int64_t d64, local;
        route(x[k], rb, p.wd, a.ids_i32, &d64, &local);
        atomicAdd(&cells[static_cast<int>(d64) * nb + kb], 1);
      }
    }
  }
  __syncthreads();
}

// The count kernel: the bag offsets (scan_tile), new_lengths of the tile's bags (count_tile,
// store_new_lengths) and tile_cnt.
__global__ void __launch_bounds__(kThreads) partition_count_kernel(PartitionArgs p) {
  __shared__ int s_off[kPartMaxTileBags + 1];
  __shared__ TileRule s_rule;
  __shared__ int s_cnt[kPartMaxCells];  // [d][k]: bucket-d ids of the tile's bag k
  __shared__ int s_wsum[kWarps];
  const BucketizeArgs& a = p.a;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int W = static_cast<int>(a.world_size);
  const PartitionTile ti = scan_tile(p, s_off, &s_rule, s_wsum);
  int64_t* tc = p.tile_cnt + ti.q * W * p.tiles_per_rank + ti.kt;  // + d * tiles_per_rank
  if (ti.nb == 0) {  // uniform: past the rank's last bag, nothing of it in the scan
    for (int d = t; d < W; d += kThreads) tc[d * p.tiles_per_rank] = 0;
    return;
  }
  count_tile(p, ti, s_off, &s_rule, s_cnt);
  const int nb = ti.nb;
  for (int d = warp; d < W; d += kWarps) {  // a warp per bucket row: the tile's total
    int64_t sum = 0;
    for (int k = lane; k < nb; k += 32) sum += s_cnt[d * nb + k];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) tc[d * p.tiles_per_rank] = sum;
  }
  store_new_lengths(a, ti, s_cnt);
}

// The tile's n > 0 ids ranked and placed chunk by chunk (values, perm, weights, dest_rank):
// run[d] = bucket d's next global position in the tile, advanced by each chunk. The tile's bags
// share one feature (the host plans them so), hence one routing rule: each chunk takes the
// block-per-bag ranking as is (the rule resolved at compile time, no per-id bag search).
// after_first_rank() runs once, uniformly, between the first chunk's ranking and its placement
// (the one launch waits there for its rank's counts and sets run; the ranking overlaps that
// wait); a barrier follows it before any placement. Shared arrays as partition_place_kernel's.
template <int Bits, typename AfterFirstRank>
__device__ __forceinline__ void place_tile(const PartitionArgs& p, const PartitionTile& ti,
                                           const TileRule* rule, int n, int (*wc)[kMaxSharedW],
                                           int* cnt, int* lex, int64_t* run, int64_t* stage,
                                           int64_t* stage_pos, AfterFirstRank after_first_rank) {
  const BucketizeArgs& a = p.a;
  const int W = static_cast<int>(a.world_size);
  const uint64_t blk = rule->blk;
  const int dist = rule->dist;
  int64_t value[kIdsPerLane];
  unsigned key[kIdsPerLane / 2];
  for (int c0 = 0; c0 < n; c0 += kChunk) {  // uniform over the block
    const int m = n - c0 < kChunk ? n - c0 : kChunk;
    const int64_t i0 = ti.id0 + c0;
    // Ends with a barrier. (Not the one-pass kernel's histogram and warp-local ranking for
    // W <= 16, hist_chunk and rank_from_dest: chunk after chunk, they cost more than this.)
    rank_chunk_any<Bits>(a, p.wd, dist, a.ids + i0, m, blk, value, key, wc, cnt);
    if (c0 == 0) after_first_rank();
    exclusive_scan_buckets(cnt, lex, W);
    __syncthreads();
    const ChunkOut<int64_t> o{a.weights ? a.weights + i0 : nullptr, a.perm + i0,
                              a.dest_rank ? a.dest_rank + i0 : nullptr, ti.rank_id_base};
    place_chunk_staged(a, o, m, value, key, wc, run, lex, stage, stage_pos);
    __syncthreads();  // run, lex and the stage read above
    // cnt is next written after the first barrier of the next chunk's ranking.
    for (int d = threadIdx.x; d < W; d += kThreads) run[d] += cnt[d];
  }
}

// The place kernel: the tile's ids at their global positions (values, perm, weights,
// dest_rank). Bits: 4 for W <= kSmallW, else 8 (peers()). Four blocks per SM (48 KB of shared
// memory each) need <= 64 registers: the bound keeps the summing of tile_cnt from costing one
// (78 registers without it, no spills with it).
template <int Bits>
__global__ void __launch_bounds__(kThreads, 4) partition_place_kernel(PartitionArgs p) {
  __shared__ int s_off[kPartMaxTileBags + 1];
  __shared__ TileRule s_rule;
  __shared__ int wc[kWarps][kMaxSharedW];
  __shared__ int s_cnt[kMaxSharedW], s_lex[kMaxSharedW];
  __shared__ int64_t s_run[kMaxSharedW];  // bucket d's next global position in this tile
  __shared__ int64_t s_stage[kChunk], s_stage_pos[kChunk];
  const BucketizeArgs& a = p.a;
  const int t = threadIdx.x;
  const int W = static_cast<int>(a.world_size);
  const PartitionTile ti = load_tile(p, s_off, &s_rule);
  if (ti.nb == 0) return;  // uniform
  const int n = s_off[ti.nb];
  if (n == 0) return;  // uniform: only empty bags
  if (p.tile_base) {
    const int64_t* tb = p.tile_base + ti.q * W * p.tiles_per_rank + ti.kt;
    for (int d = t; d < W; d += kThreads)
      s_run[d] = tb[d * p.tiles_per_rank];  // read after the ranking's barriers
  } else {
    // No scan: the place kernel sums its rank's row of tile counts itself (tiles past its last
    // bag count zero); the rows' totals go to s_stage (unused until the first chunk's
    // placement, which follows at least two barriers).
    const int64_t tpr = p.tiles_per_rank;
    const int64_t* rc = p.tile_cnt + ti.q * W * tpr;
    tile_bases(
        W, tpr, ti.kt, ti.rank_id_base, [&](int d, int64_t k) { return rc[d * tpr + k]; }, s_stage,
        s_run);  // s_run read after the ranking's barriers
    // s_stage is next written in place_chunk_staged, after the ranking's closing barrier: every
    // read of it above is done by then.
  }
  place_tile<Bits>(p, ti, &s_rule, n, wc, s_cnt, s_lex, s_run, s_stage, s_stage_pos, [] {});
}

}  // namespace dynemb::cuda::bucketize
