// Warp- and block-level ranking primitives of the bucketize: for each id of a chunk, its
// bucket and its slot among the same-bucket ids before it (the stable order of FBGEMM's
// block_bucketize_sparse_features), and per-bucket counts of the chunk.
#pragma once

#include <cstdint>

#include "bucketize/config.cuh"
#include "bucketize/routing.cuh"

namespace dynemb::cuda::bucketize {

// The lanes of the warp whose dest equals this lane's (dest < 2^Bits, or -1: no id), from
// one ballot per bit of dest as CUB's radix ranking does: cheaper than __match_any_sync.
// Bits is a compile-time bound (4 for W <= 16, else 8): bits above W's are 0 in every valid
// dest and 1 in -1, so the extra ballots leave both groups as they are, and a fixed count
// needs no per-bit test in the ranking's inner loop.
template <int Bits>
__device__ __forceinline__ unsigned peers(int dest) {
  unsigned m = __ballot_sync(0xffffffffu, dest >= 0);
  if (dest < 0) m = ~m;
#pragma unroll
  for (int b = 0; b < Bits; ++b) {
    const unsigned bit = (static_cast<unsigned>(dest) >> b) & 1u;
    const unsigned ones = __ballot_sync(0xffffffffu, bit);
    m &= ones ^ (bit - 1u);  // bit set: the lanes with it set; else those without
  }
  return m;
}

// Id k's 16-bit key (bucket | slot << 8) into the k-th half-word of key[].
__device__ __forceinline__ void put_key(unsigned (&key)[kIdsPerLane / 2], int k, unsigned kv) {
  if (k % 2 == 0)
    key[k / 2] = kv;
  else
    key[k / 2] |= kv << 16;
}

// One tile of the warp's ids (the k-th of each lane; dest = its bucket, -1 for no id): its key
// (bucket | slot << 8, slot = same-bucket ids before it in the warp: row[bucket] from earlier
// tiles + earlier lanes of this one) goes to the k-th half of key[], and row[] advances by the
// tile's count of each bucket. row is the warp's own: __syncwarp orders its reads and writes.
template <int Bits>
__device__ __forceinline__ void rank_tile(int dest, int k, unsigned lt, int* row,
                                          unsigned (&key)[kIdsPerLane / 2]) {
  const unsigned same = peers<Bits>(dest);
  const int below = __popc(same & lt);
  const int before = dest >= 0 ? row[dest] : 0;
  __syncwarp();
  if (dest >= 0 && below == 0) row[dest] = before + __popc(same);
  __syncwarp();
  put_key(
      key, k,
      dest >= 0 ? static_cast<unsigned>(dest) | static_cast<unsigned>(before + below) << 8 : 0u);
}

// Lane l of warp w loads ids w*kWarpIds + k*32 + l (k < kIdsPerLane) of a chunk of n, issued
// together (one round trip); a full chunk needs no bounds test (one base address, immediate
// offsets). Ids past n read as 0.
__device__ __forceinline__ void load_chunk_ids(const int64_t* ids, int n,
                                               int64_t (&value)[kIdsPerLane]) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t* src = ids + w * kWarpIds + lane;
  if (n == kChunk) {
#pragma unroll
    for (int k = 0; k < kIdsPerLane; ++k) value[k] = src[k * 32];
  } else {
#pragma unroll
    for (int k = 0; k < kIdsPerLane; ++k)
      value[k] = w * kWarpIds + k * 32 + lane < n ? src[k * 32] : 0;
  }
}

// After each warp w wrote its per-bucket counts to wc[w][0..W): wc[w][d] becomes bucket d's
// ids in warps < w and chunk_tot[d] its ids in the chunk. Barriers before and after.
__device__ __forceinline__ void warp_counts_to_offsets(int (*wc)[kMaxSharedW], int* chunk_tot,
                                                       int W) {
  __syncthreads();
  for (int d = threadIdx.x; d < W; d += kThreads) {
    int run = 0;
    for (int ww = 0; ww < kWarps; ++ww) {
      const int v = wc[ww][d];
      wc[ww][d] = run;
      run += v;
    }
    chunk_tot[d] = run;
  }
  __syncthreads();
}

// Step 2 for one chunk of a bag: its n <= kChunk ids start at ids (n uniform over the block).
// Lane l of warp w takes ids w*kWarpIds + k*32 + l, k < kIdsPerLane: value[k] is its bucketized
// value, its 16-bit key = bucket | slot << 8 (two per word of key[]), slot = same-bucket ids before
// it among its warp's kWarpIds (< 256; W <= 256 on this path). On return, after a barrier:
// wc[w][d] = bucket d's ids in warps < w of this chunk, chunk_tot[d] = its ids in the chunk.
template <int Dist, int Bits>
__device__ __forceinline__ void rank_chunk(const BucketizeArgs& a, const FastDivU64& wd,
                                           const int64_t* ids, int n, uint64_t blk,
                                           int64_t (&value)[kIdsPerLane],
                                           unsigned (&key)[kIdsPerLane / 2], int (*wc)[kMaxSharedW],
                                           int* chunk_tot) {
  const int t = threadIdx.x, w = t / 32, lane = t % 32;
  const int W = static_cast<int>(a.world_size);
  load_chunk_ids(ids, n, value);  // replaced by their values below
  __syncthreads();                // wc of the previous chunk is no longer read
  // Each warp counts in its own row until the barrier after the loop: it zeroes that row.
  for (int d = lane; d < W; d += 32) wc[w][d] = 0;
  __syncwarp();
  BagInfo rb{};
  rb.blk = blk;
  rb.dist = Dist;  // uniform over the bag: route's branch is resolved at compile time
  const unsigned lt = (1u << lane) - 1u;
#pragma unroll
  for (int k = 0; k < kIdsPerLane; ++k) {
    const int off = w * kWarpIds + k * 32 + lane;
    int dest = -1;
    if (off < n) {
      int64_t d64;
      route(value[k], rb, wd, a.ids_i32, &d64, &value[k]);
      dest = static_cast<int>(d64);
    }
    rank_tile<Bits>(dest, k, lt, wc[w], key);
  }
  warp_counts_to_offsets(wc, chunk_tot, W);
}

template <int Bits>
__device__ __forceinline__ void rank_chunk_any(const BucketizeArgs& a, const FastDivU64& wd,
                                               int dist, const int64_t* ids, int n, uint64_t blk,
                                               int64_t (&value)[kIdsPerLane],
                                               unsigned (&key)[kIdsPerLane / 2],
                                               int (*wc)[kMaxSharedW], int* chunk_tot) {
  if (dist == 2)
    rank_chunk<2, Bits>(a, wd, ids, n, blk, value, key, wc, chunk_tot);
  else if (dist == 1)
    rank_chunk<1, Bits>(a, wd, ids, n, blk, value, key, wc, chunk_tot);
  else
    rank_chunk<0, Bits>(a, wd, ids, n, blk, value, key, wc, chunk_tot);
}

// Counts before ranks (W <= 16): a chunk's counts come from a cheap histogram, so that a
// one-chunk bag (the one-pass kernel) or tile (the partition's one launch) can publish them
// before its ranking (rank_from_dest), which then overlaps the exchange.
// Loads and routes the chunk's n ids like rank_chunk (value[k] = local value) and packs each
// id's bucket in 4 bits of dpack (bits 4k..4k+3). Each thread counts its 8 ids in 16 4-bit
// fields (<= 8 each), warps sum them as 16-bit fields (<= 256), and on return, after a
// barrier, wc[w][d] = bucket d's ids in warps < w and chunk_tot[d] = its ids in the chunk.
// The warp writes its row of wc before the first barrier: every earlier read of wc must be
// behind a barrier already.
template <int Dist>
__device__ __forceinline__ void hist_chunk(const BucketizeArgs& a, const FastDivU64& wd,
                                           const int64_t* ids, int n, uint64_t blk,
                                           int64_t (&value)[kIdsPerLane], unsigned& dpack,
                                           int (*wc)[kMaxSharedW], int* chunk_tot) {
  const int t = threadIdx.x, w = t / 32, lane = t % 32;
  const int W = static_cast<int>(a.world_size);
  load_chunk_ids(ids, n, value);
  BagInfo rb{};
  rb.blk = blk;
  rb.dist = Dist;
  unsigned long long cnt = 0;
  unsigned dp = 0;
  if (Dist != 0 && wd.magic == 0 && n == kChunk) {
    // Round-robin rules with W a power of two on a full chunk: the bucket is the
    // low bits of the (hashed) key, so no per-id bounds test, index-type select or division
    // branch (route's answer: the int32 casts of the key and of the hash keep those bits).
    // The local id stays the raw key, as route leaves it.
    const unsigned wm = static_cast<unsigned>(W - 1);
#pragma unroll
    for (int k = 0; k < kIdsPerLane; ++k) {
      const uint64_t x = static_cast<uint64_t>(value[k]);
      const unsigned d =
          static_cast<unsigned>(Dist == 2 ? fmix64(a.ids_i32 ? x & 0xffffffffull : x) : x) & wm;
      cnt += 1ull << (4 * d);
      dp |= d << (4 * k);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kIdsPerLane; ++k) {
      if (w * kWarpIds + k * 32 + lane < n) {
        int64_t d64;
        route(value[k], rb, wd, a.ids_i32, &d64, &value[k]);
        const unsigned d = static_cast<unsigned>(d64);
        cnt += 1ull << (4 * d);
        dp |= d << (4 * k);
      }
    }
  }
  dpack = dp;
  unsigned mine = 0;  // lane d < 16: bucket d's ids in this warp
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    const unsigned x = static_cast<unsigned>((cnt >> (8 * m)) & 0xfu) |
                       static_cast<unsigned>((cnt >> (8 * m + 4)) & 0xfu) << 16;
    const unsigned sum = __reduce_add_sync(0xffffffffu, x);
    if (lane / 2 == m) mine = lane % 2 ? sum >> 16 : sum & 0xffffu;
  }
  if (lane < W) wc[w][lane] = static_cast<int>(mine);
  warp_counts_to_offsets(wc, chunk_tot, W);
}

__device__ __forceinline__ void hist_chunk_any(const BucketizeArgs& a, const FastDivU64& wd,
                                               int dist, const int64_t* ids, int n, uint64_t blk,
                                               int64_t (&value)[kIdsPerLane], unsigned& dpack,
                                               int (*wc)[kMaxSharedW], int* chunk_tot) {
  if (dist == 2)
    hist_chunk<2>(a, wd, ids, n, blk, value, dpack, wc, chunk_tot);
  else if (dist == 1)
    hist_chunk<1>(a, wd, ids, n, blk, value, dpack, wc, chunk_tot);
  else
    hist_chunk<0>(a, wd, ids, n, blk, value, dpack, wc, chunk_tot);
}

// The lanes with (x & mask) != 0. Written in PTX so that the test is one predicate-setting
// LOP3 (from C++, nvcc shifts the bit down, masks it and compares: three instructions).
__device__ __forceinline__ unsigned ballot_bits(unsigned x, unsigned mask) {
  unsigned r;
  asm("{\n\t.reg .pred p;\n\t.reg .b32 t;\n\tand.b32 t, %1, %2;\n\tsetp.ne.u32 p, t, 0;\n\t"
      "vote.sync.ballot.b32 %0, p, 0xffffffff;\n\t}"
      : "=r"(r)
      : "r"(x), "r"(mask));
  return r;
}

// The ranking after hist_chunk: per warp only (no barrier, no shared memory), from the packed
// buckets. key[] as rank_chunk's: bucket | slot << 8, slot = same-bucket ids before it in its
// warp (tile k of 32 ids before tile k + 1). Per tile, five ballots (valid, and the four bits
// of the bucket) are shared by two uses: lane d (< 16) forms the tile's mask of bucket-d lanes
// M and keeps bucket d's running count over the earlier tiles, and every lane fetches M and
// that count from the lane of its own bucket (two shuffles): fewer instructions than peers()
// with a shared running row per lane (rank_tile).
__device__ __forceinline__ void rank_from_dest(int n, unsigned dpack,
                                               unsigned (&key)[kIdsPerLane / 2]) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned lt = (1u << lane) - 1u;
  // not_b: all ones where bit b of this lane's bucket index (lane % 16) is 0, so B_b ^ not_b
  // has a lane set iff that lane's bucket agrees with this lane's index on bit b.
  const unsigned not0 = (lane & 1) ? 0u : ~0u, not1 = (lane & 2) ? 0u : ~0u;
  const unsigned not2 = (lane & 4) ? 0u : ~0u, not3 = (lane & 8) ? 0u : ~0u;
  int run = 0;  // lane d < 16: bucket d's ids in the warp's earlier tiles
#pragma unroll
  for (int k = 0; k < kIdsPerLane; ++k) {
    const bool valid = w * kWarpIds + k * 32 + lane < n;
    const unsigned d = (dpack >> (4 * k)) & 0xfu;  // 0 for no id (masked out by V)
    const unsigned V = __ballot_sync(0xffffffffu, valid);
    const unsigned B0 = ballot_bits(dpack, 1u << (4 * k)), B1 = ballot_bits(dpack, 2u << (4 * k));
    const unsigned B2 = ballot_bits(dpack, 4u << (4 * k)), B3 = ballot_bits(dpack, 8u << (4 * k));
    const unsigned M = V & (B0 ^ not0) & (B1 ^ not1) & (B2 ^ not2) & (B3 ^ not3);
    const unsigned mine = __shfl_sync(0xffffffffu, M, static_cast<int>(d));
    const int before = __shfl_sync(0xffffffffu, run, static_cast<int>(d));
    run += __popc(M);
    put_key(key, k, valid ? d | static_cast<unsigned>(before + __popc(mine & lt)) << 8 : 0u);
  }
}

__device__ __forceinline__ void exclusive_scan_buckets(const int* in, int* lex, int W) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  int v[kMaxSharedW / 32], sum = 0;
#pragma unroll
  for (int k = 0; k < kMaxSharedW / 32; ++k) {
    const int d = lane * (kMaxSharedW / 32) + k;
    v[k] = d < W ? in[d] : 0;
    sum += v[k];
  }
  int incl = sum;  // inclusive scan of the lanes' sums
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  int run = incl - sum;
#pragma unroll
  for (int k = 0; k < kMaxSharedW / 32; ++k) {
    const int d = lane * (kMaxSharedW / 32) + k;
    if (d < W) lex[d] = run;
    run += v[k];
  }
}

}  // namespace dynemb::cuda::bucketize
