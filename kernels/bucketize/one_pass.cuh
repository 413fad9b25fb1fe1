// The one-pass path: the whole stage in one cooperative launch, a block per bag.
#pragma once

#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "bucketize/config.cuh"
#include "bucketize/placement.cuh"
#include "bucketize/ranking.cuh"
#include "bucketize/routing.cuh"
#include "probes.hpp"

namespace dynemb::cuda::bucketize {

// ------------------------------------------------------------ one-pass path (a block per bag)
// One cooperative launch, a block per bag, every block resident (so a block may wait for
// another). Each block, in order:
//   1. bag offsets: loads rank_bag_off, the feature tables and the lengths of the bags up to
//      its own (total_bags <= kMaxOnePassBags) in ONE round of independent loads (every load
//      issued before any shared-memory store: as three loops they were three round trips, and
//      the slowest block's step 1 took 5.0 us instead of 2.7), and reduces them to its bag's
//      first id and its rank's first id (bag_offsets is an output here);
//   2. counts: warp w ranks the ids [w*256, (w+1)*256) of each 2048-id chunk of the bag,
//      32 at a time (a ballot per bit of the bucket, peers()), so an id's slot in its (bucket, bag)
//      segment is (same-bucket ids in earlier chunks) + (in earlier warps of its chunk) + (earlier
//      in its warp). A bag of <= 2048 ids keeps its ids' values and slots in registers;
//   3. publish: its W counts go to new_lengths and, tagged with this launch's epoch, to one
//      64-bit scratch word each, laid out like new_lengths ([d][j] per rank);
//   With W <= 16 and bags of <= 2048 ids (hstu-e2e), 2 and 3 run the other way round: the
//   counts come from a histogram (hist_chunk: 4-bit counters per thread, one warp reduction),
//   are published, and only then are the slots ranked (rank_from_dest, warp-local), so the
//   ranking overlaps the exchange's round trip and the wait for the rank's slowest block
//   instead of preceding it (hstu-e2e 16.1 -> 14.9 us with the one-round step 1,
//   BENCHMARKS.md runs 24-28; 13.2 us with run 34's cuts in the ranking's, the histogram's
//   and step 1's instructions);
//   4. bases: it reads its rank's W x L_q words (spinning on any not yet carrying the epoch)
//      and forms base[d] = rank's first id + sum_{d'<d} T[d'] + sum_{j'<j} count[d][j'],
//      T[d] = the rank's ids of bucket d: exactly new_offsets of (d, j);
//   5. placement: perm, dest_rank and new_weights directly; new_values through shared memory
//      (the bag's values and positions in its bucketized order, then stored by consecutive
//      threads: 256-byte warp stores instead of scattered pairs; 22.7 -> 18.1 us on hstu-e2e,
//      BENCHMARKS.md run 11).
// The stage is bound by issued instructions more than by bytes (ncu: 8.5 M warp instructions
// for hstu-e2e's 1 M ids, issue slots ~37 % busy, "no instruction" the top stall), so the hot
// paths avoid per-id tests that a template parameter can settle (the ballot count, the
// optional outputs) and per-poll clock reads (6.7 M after, BENCHMARKS.md runs 17-20).
// So the chain per block is: one load round, the id loads, the counting, a store-then-load
// exchange with the other blocks of its rank, and the placement stores. The previous fused
// kernel (runs 3-4 of BENCHMARKS.md) also had a look-back for bag offsets, a scanning block
// per rank, fences, a release flag and a done counter: ~20 dependent L2 round trips. Nothing
// here needs resetting: a word is fresh iff it carries this launch's epoch, and the host
// bumps the epoch per launch (BucketizeFused::epoch). Blocks publish before they wait and all
// are resident, so every wait ends.
struct OnePassArgs {
  BucketizeArgs a;
  const int64_t* lengths;     // [L]
  unsigned long long* words;  // [W x L]: epoch << 32 | count of (bucket d, bag j)
  unsigned epoch;             // != 0
  FastDivU64 wd;              // divides by W
  unsigned long long* trace;  // BucketizeFused::trace
};

// Relaxed GPU-scope accesses: a word is read whole (count and epoch together), so no fence
// or acquire is needed; .gpu keeps the load from being served by a stale L1 line.
__device__ __forceinline__ unsigned long long ld_word(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_word(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The block's view of its bag, shared by all its threads. Everything fits 32 bits on this
// path (total_ids < 2^31, total_bags <= kMaxOnePassBags): cheaper index math.
struct OnePassBag {
  int begin, len;    // ids [begin, begin + len)
  int rank_begin;    // first id of the bag's rank (perm is rank-local)
  int first, Lq, j;  // the rank's first bag, its bag count, this bag's index in it
  uint64_t blk;
  int32_t dist;
};

// 4 resident blocks per SM (<= 64 registers): 528 on an H200, hstu-e2e has 512 bags. Bits: see
// peers() (4 for W <= kSmallW, else 8); one instance per value (both ranking copies in one
// kernel made the register allocator spill ~100 bytes per thread).
template <int Bits, bool Long>
__global__ void __launch_bounds__(kThreads, 4) one_pass_kernel(OnePassArgs p) {
  using BlockScanU64 = cub::BlockScan<unsigned long long, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ typename BlockScanU64::TempStorage scan_tmp64;
  // Shared memory used by one step only shares space: step 1's tables, step 4's counts and
  // step 5's staged values and positions (barriers separate the steps). Less shared memory
  // per block keeps more of the SM's 256 KB as L1, which holds step 2's loads in flight
  // (counting took ~1 us longer with 43 KB than with 30: BENCHMARKS.md runs 12-13).
  __shared__ union {
    struct {
      int64_t rbo[kMaxSharedW + 1];  // rank_bag_off (R <= 256)
      int64_t fbo[kMaxFeatTab];      // feat_bag_off when R x (F+1) fits
      uint64_t blk[kMaxSharedW];     // block_sizes and dist_types when F fits
      int32_t dt[kMaxSharedW];
    } tab;
    int cnt[kWordRound];  // step 4: one round of the rank's counts
    struct {
      int64_t value[kChunk];  // step 5: the bag's values in its bucketized order
      int pos[kChunk];        // and their global positions
    } stage;
  } u;
  int64_t* const s_rbo = u.tab.rbo;
  int64_t* const s_fbo = u.tab.fbo;
  uint64_t* const s_blk = u.tab.blk;
  int32_t* const s_dt = u.tab.dt;
  int* const s_cnt = u.cnt;
  int64_t* const s_stage = u.stage.value;
  int* const s_stage_pos = u.stage.pos;
  __shared__ int wc[kWarps][kMaxSharedW];  // see rank_chunk
  __shared__ int s_tot[kMaxSharedW];       // the bag's ids per bucket, then next free slot
  __shared__ int s_chunk[kMaxSharedW];     // one chunk's ids per bucket
  __shared__ int s_T[kMaxSharedW], s_P[kMaxSharedW];
  __shared__ unsigned s_red[2][kWarps];
  __shared__ int s_len;               // the bag's length
  __shared__ int s_lex[kMaxSharedW];  // the bag's ids in buckets < d (staged placement)

  const BucketizeArgs& a = p.a;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int W = static_cast<int>(a.world_size);
  const int64_t R = a.num_ranks, F = a.num_features, L = a.total_bags;
  const int g = blockIdx.x;
  const bool fbo_shared = R * (F + 1) <= kMaxFeatTab, feat_shared = F <= kMaxSharedW;
  const bool tracing = p.trace != nullptr && t == 0;  // once: not re-tested per step
  const auto mark = [&](int point) {
    if (tracing) p.trace[g * kBucketizeTracePoints + point] = global_ns();
  };
  mark(0);

  // ---- 1. one round of independent loads: lengths[0..g], rank_bag_off, feature tables
  unsigned lens[kLensPerThread];  // < 2^31 each, and so are their sums (total_ids < 2^31)
#pragma unroll
  for (int k = 0; k < kLensPerThread; ++k) {
    const int i = t + k * kThreads;
    lens[k] = i <= g ? static_cast<unsigned>(p.lengths[i]) : 0u;
  }
  {
    // Every table entry this thread stores, loaded before any is stored: one round trip
    // with the lengths instead of one per table (R + 1 <= 2 x kThreads, R x (F + 1) <=
    // kMaxFeatTab = 2 x kThreads, F <= kThreads where shared).
    const int nr = static_cast<int>(R) + 1;
    const int nf = fbo_shared ? static_cast<int>(R * (F + 1)) : 0;
    const int nt = feat_shared ? static_cast<int>(F) : 0;
    int64_t r0v = 0, r1v = 0, f0v = 0, f1v = 0;
    uint64_t bv = 0;
    int32_t dv = 0;
    if (t < nr) r0v = a.rank_bag_off[t];
    if (t + kThreads < nr) r1v = a.rank_bag_off[t + kThreads];
    if (t < nf) f0v = a.feat_bag_off[t];
    if (t + kThreads < nf) f1v = a.feat_bag_off[t + kThreads];
    if (t < nt) {
      bv = a.block_sizes[t];
      dv = static_cast<int32_t>(a.dist_types[t]);
    }
    if (t < nr) s_rbo[t] = r0v;
    if (t + kThreads < nr) s_rbo[t + kThreads] = r1v;
    if (t < nf) s_fbo[t] = f0v;
    if (t + kThreads < nf) s_fbo[t + kThreads] = f1v;
    if (t < nt) {
      s_blk[t] = bv;
      s_dt[t] = dv;
    }
  }
  __syncthreads();
  // The bag's rank q: the last q < R with rank_bag_off[q] <= g. With R <= 32 one ballot does
  // it (rank_bag_off is non-decreasing and starts at 0): ~6 instructions for the binary
  // search's ~70.
  int64_t q;
  if (R <= 32)
    q = __popc(__ballot_sync(0xffffffffu, lane < R && s_rbo[lane] <= g)) - 1;
  else
    q = d_upper_bound_m1(s_rbo, R, g);
  const int first = static_cast<int>(s_rbo[q]);
  unsigned before_bag = 0, before_rank = 0;
#pragma unroll
  for (int k = 0; k < kLensPerThread; ++k) {
    const int i = t + k * kThreads;
    if (i < g) before_bag += lens[k];
    if (i < first) before_rank += lens[k];
    if (i == g) s_len = static_cast<int>(lens[k]);
  }
  before_bag = __reduce_add_sync(0xffffffffu, before_bag);
  before_rank = __reduce_add_sync(0xffffffffu, before_rank);
  if (lane == 0) {
    s_red[0][warp] = before_bag;
    s_red[1][warp] = before_rank;
  }
  __syncthreads();
  // Every thread forms the bag's view itself (8 broadcast reads) rather than one thread and
  // another barrier.
  OnePassBag bag;
  {
    unsigned sb = 0, sr = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      sb += s_red[0][w];
      sr += s_red[1][w];
    }
    bag.begin = static_cast<int>(sb);
    bag.rank_begin = static_cast<int>(sr);
    bag.len = s_len;
    bag.first = first;
    bag.Lq = static_cast<int>(s_rbo[q + 1]) - first;
    bag.j = g - first;
    const int64_t* fo = fbo_shared ? s_fbo + q * (F + 1) : a.feat_bag_off + q * (F + 1);
    const int64_t f = d_upper_bound_m1(fo, F, bag.j);
    bag.blk = feat_shared ? s_blk[f] : a.block_sizes[f];
    bag.dist = feat_shared ? s_dt[f] : static_cast<int32_t>(a.dist_types[f]);
  }
  for (int d = t; d < W; d += kThreads) s_tot[d] = 0;  // read by the same thread in step 2
  if (t == 0) {
    a.bag_offsets[g] = bag.begin;  // an output on this path
    if (g == L - 1) a.bag_offsets[L] = static_cast<int64_t>(bag.begin) + bag.len;
  }
  mark(1);

  // ---- 2. counts (a bag of <= kChunk ids: one chunk, kept in registers for step 5)
  const int nl0 = W * bag.first + bag.j;
  int64_t value[kIdsPerLane];
  unsigned key[kIdsPerLane / 2];
  const unsigned long long tag = static_cast<unsigned long long>(p.epoch) << 32;
  // ---- 3. publish the bag's counts (counts[d], d < W): new_lengths and the epoch-tagged words;
  // step 4's sums start from zero.
  const auto publish = [&](const int* counts) {
    for (int d = t; d < W; d += kThreads) {
      const int c = counts[d];
      a.new_lengths[nl0 + d * bag.Lq] = c;
      st_word(&p.words[nl0 + d * bag.Lq], tag | static_cast<unsigned long long>(c));
      s_T[d] = 0;
      s_P[d] = 0;
    }
  };
  if (!Long && bag.len > kChunk) __trap();  // the host's max_bag_len was wrong
  if (Bits == 4 && !Long) {
    unsigned dpack = 0;
    if (bag.len > 0) {
      hist_chunk_any(a, p.wd, bag.dist, a.ids + bag.begin, bag.len, bag.blk, value, dpack, wc,
                     s_chunk);
    } else {
      for (int d = t; d < W; d += kThreads) s_chunk[d] = 0;
      // hist_chunk's barriers otherwise end step 1's reads of the tables (u.tab) before step 4
      // reuses that memory (racecheck found this one).
      __syncthreads();
    }
    mark(2);
    publish(s_chunk);  // then rank
    if (bag.len > 0) rank_from_dest(bag.len, dpack, key);
  } else {
    for (int c0 = 0; c0 < bag.len; c0 += kChunk) {
      const int n = bag.len - c0 < kChunk ? bag.len - c0 : kChunk;
      rank_chunk_any<Bits>(a, p.wd, bag.dist, a.ids + bag.begin + c0, n, bag.blk, value, key, wc,
                           s_chunk);
      for (int d = t; d < W; d += kThreads) s_tot[d] += s_chunk[d];  // same thread as above
    }
    __syncthreads();
    mark(2);
    publish(s_tot);
  }
  // ---- 4. the rank's counts: T[d] over all its bags, P[d] over its bags before this one
  const int n = W * bag.Lq, r0 = W * bag.first;
  for (int c = 0; c < n; c += kWordRound) {
    unsigned long long v[kWordsPerThread];
#pragma unroll
    for (int k = 0; k < kWordsPerThread; ++k) {
      const int i = c + k * kThreads + t;
      v[k] = i < n ? ld_word(&p.words[r0 + i]) : tag;
    }
    // Re-read all of this thread's stale words together: one round trip per poll, whichever
    // of them turns fresh last. Every block of the rank publishes before it waits and all are
    // resident, so this ends; should that ever break (a driver not honouring the cooperative
    // launch, a bug), trap after kMaxPolls polls (each a sleep and an L2 round trip, so
    // seconds): the host sees a CUDA error instead of a hung GPU. Counting polls instead of
    // reading %globaltimer per poll: the clock test was ~4 % of the kernel's instructions
    // (ncu, BENCHMARKS.md run 18). The short sleep keeps waiting warps from taking issue slots
    // from working ones.
    for (unsigned polls = 0;; ++polls) {
      bool stale = false;
#pragma unroll
      for (int k = 0; k < kWordsPerThread; ++k) stale |= (v[k] & 0xffffffff00000000ull) != tag;
      if (!stale) break;
      __nanosleep(64);
      if (polls == kMaxPolls) __trap();
#pragma unroll
      for (int k = 0; k < kWordsPerThread; ++k)
        if ((v[k] & 0xffffffff00000000ull) != tag)
          v[k] = ld_word(&p.words[r0 + c + k * kThreads + t]);
    }
#pragma unroll
    for (int k = 0; k < kWordsPerThread; ++k)
      if (c + k * kThreads + t < n) s_cnt[k * kThreads + t] = static_cast<int>(v[k] & 0xffffffffu);
    __syncthreads();
    // Warp per bucket row d of the words in this round: entries [max(c, d*Lq), ...).
    const int m = n - c < kWordRound ? n - c : kWordRound;
    int d_lo = 0, d_hi = W - 1;  // one round (hstu-e2e: 16 x 32 words): no division
    if (m < n) {
      d_lo = c / bag.Lq;
      d_hi = (c + m - 1) / bag.Lq;
    }
    for (int d = d_lo + warp; d <= d_hi; d += kWarps) {
      const int e0 = c > d * bag.Lq ? c : d * bag.Lq;
      const int e1 = c + m < (d + 1) * bag.Lq ? c + m : (d + 1) * bag.Lq;
      unsigned sT = 0, sP = 0;
      for (int e = e0 + lane; e < e1; e += 32) {
        const unsigned x = static_cast<unsigned>(s_cnt[e - c]);
        sT += x;
        if (e - d * bag.Lq < bag.j) sP += x;
      }
      sT = __reduce_add_sync(0xffffffffu, sT);
      sP = __reduce_add_sync(0xffffffffu, sP);
      if (lane == 0) {
        s_T[d] += static_cast<int>(sT);
        s_P[d] += static_cast<int>(sP);
      }
    }
    __syncthreads();
  }
  mark(3);
  // base[d] = rank_begin + sum_{d' < d} T[d'] + P[d]  (W <= kThreads: a value per thread)
  // One scan for two prefix sums over buckets: the rank's (high 32 bits) and, for the staged
  // placement, this bag's own (low 32 bits; < 2^11 in total, so no carry into the high half).
  const bool staged = !Long || bag.len <= kChunk;
  unsigned long long before = 0;
  const unsigned long long x = t < W ? static_cast<unsigned long long>(s_T[t]) << 32 |
                                           static_cast<unsigned long long>(staged ? s_chunk[t] : 0)
                                     : 0ull;
  if (Bits == 4) {  // W <= 16: warp 0 alone, no block-wide scan and its barrier
    if (warp == 0) {
      unsigned long long incl = x;
#pragma unroll
      for (int o = 1; o < 16; o *= 2) {
        const unsigned long long y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      before = incl - x;
    }
  } else {
    BlockScanU64(scan_tmp64).ExclusiveSum(x, before);
  }
  if (t < W) {
    const int b = bag.rank_begin + static_cast<int>(before >> 32) + s_P[t];
    a.new_offsets[nl0 + t * bag.Lq] = b;
    s_tot[t] = b;  // next free slot per bucket
    s_lex[t] = static_cast<int>(before & 0xffffffffu);
  }
  __syncthreads();
  mark(4);

  // ---- 5. placement
  if (staged) {  // the ids' values and keys are still in registers
    const ChunkOut<int> o{a.weights ? a.weights + bag.begin : nullptr, a.perm + bag.begin,
                          a.dest_rank ? a.dest_rank + bag.begin : nullptr, bag.rank_begin};
    if (bag.len > 0)
      place_chunk_staged(a, o, bag.len, value, key, wc, s_tot, s_lex, s_stage, s_stage_pos);
  } else if constexpr (Long) {  // a long bag: rank each chunk again
    place_bag_chunked<Bits, int>(a, p.wd, bag.dist, bag.blk, bag.begin, bag.len, bag.rank_begin,
                                 s_tot, wc, s_chunk, s_lex, s_stage, s_stage_pos);
  }
  if (p.trace) {
    __syncthreads();
    mark(5);
  }
}

}  // namespace dynemb::cuda::bucketize
