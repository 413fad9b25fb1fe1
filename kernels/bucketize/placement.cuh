// Placement of ranked ids: values, unbucketize_permute, weights and dest_rank written at
// their bucketized positions. Shared by the one-pass kernel and the three-pass block-per-bag
// kernel.
#pragma once

#include <cstdint>

#include "bucketize/config.cuh"
#include "bucketize/ranking.cuh"

namespace dynemb::cuda::bucketize {

// Where one chunk's outputs go: `off` below is an id's index inside the chunk.
template <typename Pos>  // int on the one-pass path (< 2^31 ids), int64_t elsewhere
struct ChunkOut {
  const float* weights;  // the chunk's input weights, or null
  int64_t* perm;         // the chunk's unbucketize_permute entries
  int64_t* dest_rank;    // or null
  Pos rank_begin;        // the rank's first global id: perm is rank-local
};

// Step 5 for one chunk ranked by rank_chunk (n ids), through shared memory. run[d] = global
// position of bucket d's first slot for this chunk, lex[d] = the chunk's ids in buckets < d.
// Each id's value and global position go to its slot in the chunk's own bucketized order
// (stage[lex[d] + offset in its segment], stage_pos likewise); then thread i stores staged
// slot i, so consecutive threads write consecutive addresses inside each bucket's run: whole
// warp stores instead of scattered pairs, one slot per thread per round, no per-bucket loop.
// perm is stored directly (indexed by the input position: already contiguous); weights and
// dest_rank only in the Extras instance (place_chunk_staged picks it), because with run-time
// tests in one body the compiler predicates them into the common path. Ends before the
// copy-out is complete: the caller's next barrier orders it before stage is reused.
template <bool Extras, typename Pos>
__device__ __forceinline__ void place_chunk_staged_t(const BucketizeArgs& a, const ChunkOut<Pos>& o,
                                                     int n, const int64_t (&value)[kIdsPerLane],
                                                     const unsigned (&key)[kIdsPerLane / 2],
                                                     int (*wc)[kMaxSharedW], const Pos* run,
                                                     const int* lex, int64_t* stage,
                                                     Pos* stage_pos) {
  const int t = threadIdx.x, w = t / 32, lane = t % 32;
#pragma unroll
  for (int k = 0; k < kIdsPerLane; ++k) {
    const int off = w * kWarpIds + k * 32 + lane;
    if (off >= n) continue;
    const unsigned kv = (key[k / 2] >> (16 * (k % 2))) & 0xffffu;
    const int d = static_cast<int>(kv & 0xffu);
    const int in_seg = wc[w][d] + static_cast<int>(kv >> 8);
    const Pos pos = run[d] + in_seg;
    stage[lex[d] + in_seg] = value[k];
    stage_pos[lex[d] + in_seg] = pos;
    o.perm[off] = pos - o.rank_begin;
    if (Extras) {  // compile-time: absent from the common instance
      if (o.weights) a.new_weights[pos] = o.weights[off];
      if (o.dest_rank) o.dest_rank[off] = d;
    }
  }
  __syncthreads();
  if (n == kChunk) {
#pragma unroll
    for (int r = 0; r < kChunk / kThreads; ++r)
      a.new_values[stage_pos[r * kThreads + t]] = stage[r * kThreads + t];
  } else {
    for (int i = t; i < n; i += kThreads) a.new_values[stage_pos[i]] = stage[i];
  }
}
template <typename Pos>
__device__ __forceinline__ void place_chunk_staged(const BucketizeArgs& a, const ChunkOut<Pos>& o,
                                                   int n, const int64_t (&value)[kIdsPerLane],
                                                   const unsigned (&key)[kIdsPerLane / 2],
                                                   int (*wc)[kMaxSharedW], const Pos* run,
                                                   const int* lex, int64_t* stage, Pos* stage_pos) {
  if (o.weights || o.dest_rank)
    place_chunk_staged_t<true>(a, o, n, value, key, wc, run, lex, stage, stage_pos);
  else
    place_chunk_staged_t<false>(a, o, n, value, key, wc, run, lex, stage, stage_pos);
}

// Placement of a whole bag, chunk by chunk (each ranked again from its ids): run[d] holds
// bucket d's next free global position for the bag on entry and is advanced. Used for bags
// longer than a chunk on the one-pass path and for every long bag on the three-pass path.
template <int Bits, typename Pos>
__device__ __forceinline__ void place_bag_chunked(const BucketizeArgs& a, const FastDivU64& wd,
                                                  int dist, uint64_t blk, int64_t begin,
                                                  int64_t len, Pos rank_begin, Pos* run,
                                                  int (*wc)[kMaxSharedW], int* chunk_cnt, int* lex,
                                                  int64_t* stage, Pos* stage_pos) {
  const int W = static_cast<int>(a.world_size);
  int64_t value[kIdsPerLane];
  unsigned key[kIdsPerLane / 2];
  for (int64_t c0 = 0; c0 < len; c0 += kChunk) {  // uniform over the block
    const int n = static_cast<int>(len - c0 < kChunk ? len - c0 : kChunk);
    const int64_t i0 = begin + c0;
    rank_chunk_any<Bits>(a, wd, dist, a.ids + i0, n, blk, value, key, wc, chunk_cnt);  // synced
    exclusive_scan_buckets(chunk_cnt, lex, W);
    __syncthreads();
    const ChunkOut<Pos> o{a.weights ? a.weights + i0 : nullptr, a.perm + i0,
                          a.dest_rank ? a.dest_rank + i0 : nullptr, rank_begin};
    place_chunk_staged(a, o, n, value, key, wc, run, lex, stage, stage_pos);
    __syncthreads();  // run, lex and stage read above
    for (int d = threadIdx.x; d < W; d += kThreads) run[d] += chunk_cnt[d];
  }
}

}  // namespace dynemb::cuda::bucketize
