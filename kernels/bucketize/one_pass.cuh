// The one-pass bucketize (docs/semantics.md §3.3): the whole stage in one cooperative launch,
// a block per bag, every block resident, so a block may wait for another. As a CUB agent: one
// TempStorage for the block's shared memory and named steps; Process() is the algorithm.
//
// Each block, for its bag j of rank q:
//   LoadTables       one round of independent loads: the lengths of bags 0..j, rank_bag_off,
//                    the feature tables (total_bags <= kMaxOnePassBags);
//   FindBag          reduces them to the bag's first id, its rank's first id, its feature's
//                    rule and block size, and writes bag_offsets[j] (an output on this path);
//   RankChunks       counts: each 2048-id chunk ranked by its warps (ranking.cuh); the slot of
//                    an id in its (bucket, bag) segment is (same-bucket ids in earlier chunks)
//                    + (in earlier warps of its chunk) + (earlier in its warp). A bag of <= 2048
//                    ids keeps its ids' values and keys in registers for Place;
//   Publish          its W counts to new_lengths and, tagged with the launch's epoch, to one
//                    64-bit scratch word each, laid out like new_lengths;
//   GatherRankCounts reads the rank's W x (bags of q) words, waiting for those not yet carrying
//                    the epoch: T[d] = the rank's ids of bucket d, P[d] = its bucket-d ids in
//                    bags before j;
//   ScanBases        base[d] = rank's first id + sum_{d' < d} T[d'] + P[d] = new_offsets(d, j);
//   Place            perm, dest_rank, new_weights directly, new_values through shared memory
//                    in bucketized order (consecutive threads store consecutive addresses).
// With 4-bit buckets and bags of <= 2048 ids (CountsFirst) the counts come from a histogram
// (HistogramCounts), are published, and only then are the ids ranked (RankFromBuckets,
// warp-local): the ranking overlaps the wait for the rank's other blocks.
//
// Nothing needs resetting between launches: a word is fresh iff it carries this launch's
// epoch, and the host bumps the epoch per launch (BucketizeOnePass::epoch). Every block
// publishes before it waits and all are resident, so every wait ends.
#pragma once

#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "bucketize.hpp"
#include "bucketize/config.cuh"
#include "bucketize/placement.cuh"
#include "bucketize/ranking.cuh"
#include "bucketize/routing.cuh"

namespace dynemb::cuda::bucketize {

struct OnePassArgs {
  BucketizeArgs a;
  const int64_t* lengths;     // [total_bags]
  unsigned long long* words;  // [W x total_bags]: epoch << 32 | count of (bucket d, bag j)
  unsigned epoch;             // != 0
  FastDivU64 wd;              // divides by W
  unsigned long long* trace;  // [kBucketizeTracePoints x total_bags], traced instances only
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

// The block's view of its bag, the same in all its threads. Everything fits 32 bits on this
// path (total_ids < 2^31, total_bags <= kMaxOnePassBags).
struct OnePassBag {
  int begin, len;           // ids [begin, begin + len)
  int rank_begin;           // first id of the bag's rank (perm is rank-local)
  int first, rank_bags, j;  // the rank's first bag, its bag count, this bag's index in it
  uint64_t blk;
  int32_t dist;
};

// Bits: 4 for W <= kSmallW, else 8 (peers()). Long: a bag may exceed kChunk ids. Trace:
// stamps %globaltimer at the end of each step (bench --diagnostics only).
template <int Bits, bool Long, bool Trace>
struct OnePassAgent {
  using BlockScanU64 = cub::BlockScan<unsigned long long, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  static constexpr bool kCountsFirst = Bits == 4 && !Long;

  // All the block's shared memory. What one step alone uses shares space (barriers separate
  // the steps): FindBag's tables, GatherRankCounts' words, Place's staged values. Less shared
  // memory per block leaves more of the SM's L1 to the id loads in flight.
  struct TempStorage {
    typename BlockScanU64::TempStorage scan;
    union {
      struct {
        int64_t rbo[kMaxSharedW + 1];  // rank_bag_off (R <= 256)
        int64_t fbo[kMaxFeatTab];      // feat_bag_off when R x (F+1) fits
        uint64_t blk[kMaxSharedW];     // block_sizes and dist_types when F fits
        int32_t dt[kMaxSharedW];
      } tab;
      int cnt[kWordRound];  // one round of the rank's counts
      struct {
        int64_t value[kChunk];  // the bag's values in its bucketized order
        int pos[kChunk];        // and their global positions
      } stage;
    } u;
    int wc[kWarps][kMaxSharedW];  // per-warp bucket counts, then offsets (ranking.cuh)
    int tot[kMaxSharedW];         // the bag's ids per bucket, then its next free slot
    int chunk[kMaxSharedW];       // one chunk's ids per bucket
    int T[kMaxSharedW], P[kMaxSharedW];
    unsigned red[2][kWarps];
    int len;               // the bag's length
    int lex[kMaxSharedW];  // the bag's ids in buckets < d (staged placement)
  };

  TempStorage& s;
  const OnePassArgs& p;
  const BucketizeArgs& a;
  const int t, warp, lane, W, g;
  const int64_t R, F, L;
  const bool fbo_shared, feat_shared;
  // Carried from step to step. (The per-id arrays are locals of Process(), passed to the
  // steps: as members of the agent they went to local memory in the Long instances.)
  int64_t q = 0;  // the bag's rank
  OnePassBag bag;
  int nl0 = 0;                 // new_lengths index of (bucket 0, this bag)
  unsigned long long tag = 0;  // this launch's epoch, in the high half of a word

  __device__ __forceinline__ OnePassAgent(TempStorage& storage, const OnePassArgs& args)
      : s(storage),
        p(args),
        a(args.a),
        t(threadIdx.x),
        warp(threadIdx.x / 32),
        lane(threadIdx.x % 32),
        W(static_cast<int>(args.a.world_size)),
        g(blockIdx.x),
        R(args.a.num_ranks),
        F(args.a.num_features),
        L(args.a.total_bags),
        fbo_shared(R * (F + 1) <= kMaxFeatTab),
        feat_shared(F <= kMaxSharedW) {}

  __device__ __forceinline__ void Process() {
    unsigned lens[kLensPerThread];  // < 2^31 each, and so are their sums (total_ids < 2^31)
    int64_t value[kIdsPerLane];     // a bag of <= kChunk ids: its ids' values
    unsigned key[kIdsPerLane / 2];  // and keys (bucket | slot << 8, ranking.cuh)
    unsigned dpack = 0;             // CountsFirst: 4-bit buckets of the thread's ids
    Mark(0);
    LoadTables(lens);
    FindBag(lens);
    Mark(1);
    if (!Long && bag.len > kChunk) __trap();  // the host's max_bag_len was wrong
    if (kCountsFirst) {
      HistogramCounts(value, dpack);
      Mark(2);
      Publish(s.chunk);
      if (bag.len > 0) rank_from_dest(bag.len, dpack, key);  // RankFromBuckets
    } else {
      RankChunks(value, key);
      Mark(2);
      Publish(s.tot);
    }
    GatherRankCounts();
    Mark(3);
    ScanBases();
    Mark(4);
    Place(value, key);
    if (Trace) {
      __syncthreads();
      Mark(5);
    }
  }

  __device__ __forceinline__ void Mark(int point) {
    if (Trace && t == 0) p.trace[g * kBucketizeTracePoints + point] = global_ns();
  }

  // Lengths of bags 0..g and every table entry this thread stores, all loaded before any is
  // stored: one round trip instead of one per table (R + 1 <= 2 x kThreads, R x (F + 1) <=
  // kMaxFeatTab = 2 x kThreads, F <= kThreads where shared).
  __device__ __forceinline__ void LoadTables(unsigned (&lens)[kLensPerThread]) {
#pragma unroll
    for (int k = 0; k < kLensPerThread; ++k) {
      const int i = t + k * kThreads;
      lens[k] = i <= g ? static_cast<unsigned>(p.lengths[i]) : 0u;
    }
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
    if (t < nr) s.u.tab.rbo[t] = r0v;
    if (t + kThreads < nr) s.u.tab.rbo[t + kThreads] = r1v;
    if (t < nf) s.u.tab.fbo[t] = f0v;
    if (t + kThreads < nf) s.u.tab.fbo[t + kThreads] = f1v;
    if (t < nt) {
      s.u.tab.blk[t] = bv;
      s.u.tab.dt[t] = dv;
    }
    __syncthreads();
  }

  __device__ __forceinline__ void FindBag(const unsigned (&lens)[kLensPerThread]) {
    const int64_t* rbo = s.u.tab.rbo;
    // The bag's rank: the last q < R with rank_bag_off[q] <= g. With R <= 32 one ballot does
    // it (rank_bag_off is non-decreasing and starts at 0).
    if (R <= 32)
      q = __popc(__ballot_sync(0xffffffffu, lane < R && rbo[lane] <= g)) - 1;
    else
      q = d_upper_bound_m1(rbo, R, g);
    const int first = static_cast<int>(rbo[q]);
    unsigned before_bag = 0, before_rank = 0;
#pragma unroll
    for (int k = 0; k < kLensPerThread; ++k) {
      const int i = t + k * kThreads;
      if (i < g) before_bag += lens[k];
      if (i < first) before_rank += lens[k];
      if (i == g) s.len = static_cast<int>(lens[k]);
    }
    before_bag = __reduce_add_sync(0xffffffffu, before_bag);
    before_rank = __reduce_add_sync(0xffffffffu, before_rank);
    if (lane == 0) {
      s.red[0][warp] = before_bag;
      s.red[1][warp] = before_rank;
    }
    __syncthreads();
    // Every thread forms the bag's view itself (8 broadcast reads) rather than one thread and
    // another barrier.
    unsigned sb = 0, sr = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      sb += s.red[0][w];
      sr += s.red[1][w];
    }
    bag.begin = static_cast<int>(sb);
    bag.rank_begin = static_cast<int>(sr);
    bag.len = s.len;
    bag.first = first;
    bag.rank_bags = static_cast<int>(rbo[q + 1]) - first;
    bag.j = g - first;
    const int64_t* fo = fbo_shared ? s.u.tab.fbo + q * (F + 1) : a.feat_bag_off + q * (F + 1);
    const int64_t f = d_upper_bound_m1(fo, F, bag.j);
    bag.blk = feat_shared ? s.u.tab.blk[f] : a.block_sizes[f];
    bag.dist = feat_shared ? s.u.tab.dt[f] : static_cast<int32_t>(a.dist_types[f]);
    for (int d = t; d < W; d += kThreads) s.tot[d] = 0;  // read by the same thread in RankChunks
    if (t == 0) {
      a.bag_offsets[g] = bag.begin;
      if (g == L - 1) a.bag_offsets[L] = static_cast<int64_t>(bag.begin) + bag.len;
    }
    nl0 = W * bag.first + bag.j;
    tag = static_cast<unsigned long long>(p.epoch) << 32;
  }

  // CountsFirst: the chunk's counts from a 4-bit histogram (ranking.cuh, hist_chunk).
  __device__ __forceinline__ void HistogramCounts(int64_t (&value)[kIdsPerLane], unsigned& dpack) {
    if (bag.len > 0) {
      hist_chunk_any(a, p.wd, bag.dist, a.ids + bag.begin, bag.len, bag.blk, value, dpack, s.wc,
                     s.chunk);
    } else {
      for (int d = t; d < W; d += kThreads) s.chunk[d] = 0;
      // hist_chunk's barriers otherwise end FindBag's reads of the tables (u.tab) before
      // GatherRankCounts reuses that memory.
      __syncthreads();
    }
  }

  // The bag's counts, chunk by chunk, each chunk ranked (a bag of <= kChunk ids: one chunk,
  // whose values and keys stay in registers for Place).
  __device__ __forceinline__ void RankChunks(int64_t (&value)[kIdsPerLane],
                                             unsigned (&key)[kIdsPerLane / 2]) {
    for (int c0 = 0; c0 < bag.len; c0 += kChunk) {
      const int n = bag.len - c0 < kChunk ? bag.len - c0 : kChunk;
      rank_chunk_any<Bits>(a, p.wd, bag.dist, a.ids + bag.begin + c0, n, bag.blk, value, key, s.wc,
                           s.chunk);
      for (int d = t; d < W; d += kThreads) s.tot[d] += s.chunk[d];  // same thread as above
    }
    __syncthreads();
  }

  // counts[d], d < W, to new_lengths and the epoch-tagged words; GatherRankCounts' sums
  // start from zero.
  __device__ __forceinline__ void Publish(const int* counts) {
    for (int d = t; d < W; d += kThreads) {
      const int c = counts[d];
      a.new_lengths[nl0 + d * bag.rank_bags] = c;
      st_word(&p.words[nl0 + d * bag.rank_bags], tag | static_cast<unsigned long long>(c));
      s.T[d] = 0;
      s.P[d] = 0;
    }
  }

  // T[d] over all bags of the rank, P[d] over its bags before this one, from the rank's
  // W x rank_bags words, read kWordRound at a time.
  __device__ __forceinline__ void GatherRankCounts() {
    const int n = W * bag.rank_bags, r0 = W * bag.first;
    for (int c = 0; c < n; c += kWordRound) {
      unsigned long long v[kWordsPerThread];
#pragma unroll
      for (int k = 0; k < kWordsPerThread; ++k) {
        const int i = c + k * kThreads + t;
        v[k] = i < n ? ld_word(&p.words[r0 + i]) : tag;
      }
      // Re-read all of this thread's stale words together: one round trip per poll. Every
      // block of the rank publishes before it waits and all are resident, so this ends;
      // should that ever break (a driver not honouring the cooperative launch, a bug), trap
      // after kMaxPolls polls (seconds): the host sees a CUDA error instead of a hung GPU.
      // Polls are counted rather than timed: a clock read per poll costs instructions. The
      // short sleep keeps waiting warps from taking issue slots from working ones.
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
        if (c + k * kThreads + t < n)
          s.u.cnt[k * kThreads + t] = static_cast<int>(v[k] & 0xffffffffu);
      __syncthreads();
      // A warp per bucket row d of the words in this round: entries [max(c, d*rank_bags), ...).
      const int m = n - c < kWordRound ? n - c : kWordRound;
      int d_lo = 0, d_hi = W - 1;  // one round: no division
      if (m < n) {
        d_lo = c / bag.rank_bags;
        d_hi = (c + m - 1) / bag.rank_bags;
      }
      for (int d = d_lo + warp; d <= d_hi; d += kWarps) {
        const int e0 = c > d * bag.rank_bags ? c : d * bag.rank_bags;
        const int e1 = c + m < (d + 1) * bag.rank_bags ? c + m : (d + 1) * bag.rank_bags;
        unsigned sT = 0, sP = 0;
        for (int e = e0 + lane; e < e1; e += 32) {
          const unsigned x = static_cast<unsigned>(s.u.cnt[e - c]);
          sT += x;
          if (e - d * bag.rank_bags < bag.j) sP += x;
        }
        sT = __reduce_add_sync(0xffffffffu, sT);
        sP = __reduce_add_sync(0xffffffffu, sP);
        if (lane == 0) {
          s.T[d] += static_cast<int>(sT);
          s.P[d] += static_cast<int>(sP);
        }
      }
      __syncthreads();
    }
  }

  // base[d] = rank_begin + sum_{d' < d} T[d'] + P[d] (W <= kThreads: a value per thread),
  // written to new_offsets and kept as the bag's next free slot per bucket. One scan gives two
  // prefix sums over buckets: the rank's (high 32 bits) and, for the staged placement, this
  // bag's own (low 32 bits; < 2^11 in total, so no carry into the high half).
  __device__ __forceinline__ void ScanBases() {
    unsigned long long before = 0;
    const unsigned long long x =
        t < W ? static_cast<unsigned long long>(s.T[t]) << 32 |
                    static_cast<unsigned long long>(Staged() ? s.chunk[t] : 0)
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
      BlockScanU64(s.scan).ExclusiveSum(x, before);
    }
    if (t < W) {
      const int b = bag.rank_begin + static_cast<int>(before >> 32) + s.P[t];
      a.new_offsets[nl0 + t * bag.rank_bags] = b;
      s.tot[t] = b;
      s.lex[t] = static_cast<int>(before & 0xffffffffu);
    }
    __syncthreads();
  }

  // Whether the ids' values and keys are still in registers (a bag of one chunk).
  __device__ __forceinline__ bool Staged() const {
    return !Long || bag.len <= kChunk;
  }

  __device__ __forceinline__ void Place(const int64_t (&value)[kIdsPerLane],
                                        const unsigned (&key)[kIdsPerLane / 2]) {
    if (Staged()) {
      const ChunkOut<int> o{a.weights ? a.weights + bag.begin : nullptr, a.perm + bag.begin,
                            a.dest_rank ? a.dest_rank + bag.begin : nullptr, bag.rank_begin};
      if (bag.len > 0)
        place_chunk_staged(a, o, bag.len, value, key, s.wc, s.tot, s.lex, s.u.stage.value,
                           s.u.stage.pos);
    } else if constexpr (Long) {  // a long bag: rank each chunk again
      place_bag_chunked<Bits, int>(a, p.wd, bag.dist, bag.blk, bag.begin, bag.len, bag.rank_begin,
                                   s.tot, s.wc, s.chunk, s.lex, s.u.stage.value, s.u.stage.pos);
    }
  }
};

// 4 resident blocks per SM (<= 64 registers): 528 on 132 SMs. One instance per Bits (both
// ranking variants in one kernel made the register allocator spill).
template <int Bits, bool Long, bool Trace>
__global__ void __launch_bounds__(kThreads, 4) one_pass_kernel(OnePassArgs p) {
  using Agent = OnePassAgent<Bits, Long, Trace>;
  __shared__ typename Agent::TempStorage temp;
  Agent(temp, p).Process();
}

}  // namespace dynemb::cuda::bucketize
