// block_bucketize_sparse_features (rw-semantics.md §3.2, §3.3, §10.2), stable, in three
// passes: per-(bag, bucket) counts -> one exclusive scan over all new_lengths -> placement.
// A bag is handled by one warp or, when bags average >= 128 ids (e.g. hstu-e2e's 2048), by a
// whole 256-thread block in chunks of 2048 ids (bucketize_block_per_bag), so long bags run in
// parallel and short ones leave no block idle, while each id
// keeps its order inside its (bucket, bag) segment: an id's slot is (ids of the same bucket
// in earlier chunks or tiles) + (in earlier warps of its chunk) + (earlier in its warp).
// W > 256 buckets fall back to one thread per bag (DynamicEmb's kernel2 order, also stable).
//
// Batches of at most one bag per resident block have a second path (onepass_kernel below):
// one kernel for the whole stage, because at hstu-e2e's size (1 M ids, 25 MB) the three-pass
// version is dominated by its six launches (two cub scans) and their dependency chain, not
// by bandwidth.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>

#include "common/fastdiv.hpp"
#include "cuda_check.hpp"
#include "device_math.cuh"
#include "dist_kernels.hpp"

namespace dynemb::cuda {
namespace {

using dynemb::FastDivU64;

constexpr int kThreads = 256;
constexpr int kMaxSharedW = 256;

struct BagInfo {
  int64_t id_begin, id_end;  // ids of the bag
  int64_t nl0;               // new_lengths index of (bucket 0, this bag)
  int64_t L;                 // bags of this rank (new_lengths stride per bucket)
  int64_t rank_id_base;      // first global id of this rank (perm is rank-local)
  uint64_t blk;
  int32_t dist;
};

__device__ __forceinline__ BagInfo bag_info(const BucketizeArgs& a, int64_t g) {
  BagInfo b;
  const int64_t q = d_upper_bound_m1(a.rank_bag_off, a.num_ranks, g);
  const int64_t first = a.rank_bag_off[q];
  const int64_t j = g - first;
  b.L = a.rank_bag_off[q + 1] - first;
  b.nl0 = a.world_size * first + j;
  b.id_begin = a.bag_offsets[g];
  b.id_end = a.bag_offsets[g + 1];
  b.rank_id_base = a.bag_offsets[first];
  const int64_t f = d_upper_bound_m1(a.feat_bag_off + q * (a.num_features + 1), a.num_features, j);
  b.blk = a.block_sizes[f];
  b.dist = a.dist_types[f];
  return b;
}

// x / blk and x % blk. The continuous rule divides only ids below blk*W, whose quotient is
// < W: an fp32 estimate is then within one of it, and one correction step makes it exact.
// Anything the estimate cannot settle (a huge quotient or blk) takes the exact division.
__device__ __forceinline__ uint64_t div_by_block(uint64_t x, uint64_t blk, uint64_t* rem) {
  uint64_t q = static_cast<uint64_t>(__fdividef(__ull2float_rn(x), __ull2float_rn(blk)));
  uint64_t r = x - q * blk;  // mod 2^64: R + (Q - q) * blk
  if (static_cast<int64_t>(r) < 0) {
    --q;
    r += blk;
  } else if (r >= blk) {
    ++q;
    r -= blk;
  }
  if (r >= blk) {  // the estimate was off by more than one
    q = x / blk;
    r = x - q * blk;
  }
  *rem = r;
  return q;
}

// Destination rank and local id of one id (§3.2 uniform blocks; §10.2 dist types), exactly
// as route_id (lib/engine/ops.cpp). wd divides by W.
__device__ __forceinline__ void route(int64_t id, const BagInfo& b, const FastDivU64& wd, bool i32,
                                      int64_t* dest, int64_t* local) {
  const uint64_t x =
      i32 ? static_cast<uint64_t>(static_cast<uint32_t>(id)) : static_cast<uint64_t>(id);
  if (b.dist == 1) {  // roundrobin: raw key stays
    *dest = static_cast<int64_t>(wd.mod(x));
    *local = id;
  } else if (b.dist == 2) {  // hash_roundrobin: fmix64, cast to the index type, % W
    uint64_t h = d_fmix64(x);
    if (i32) h = static_cast<uint32_t>(h);
    *dest = static_cast<int64_t>(wd.mod(h));
    *local = id;
  } else {
    uint64_t G = b.blk * wd.d;  // FBGEMM computes in uindex_t: wraps for int32 ids
    if (i32) G = static_cast<uint32_t>(G);
    uint64_t loc;
    if (x < G) {
      *dest = static_cast<int64_t>(div_by_block(x, b.blk, &loc));
    } else {
      const uint64_t q = wd.div(x);
      *dest = static_cast<int64_t>(x - q * wd.d);
      loc = q;
    }
    *local = i32 ? static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(loc)))
                 : static_cast<int64_t>(loc);
  }
}

// ------------------------------------------------------- three-pass path, bags <= 64 ids
// A warp per bag, 8 bags per block; tiles of 32 ids, kPre of them loaded before the first is
// ranked. An id's slot in its (bucket, bag) segment: ids of the same bucket in earlier tiles
// + earlier lanes of its tile with the same bucket (__match_any_sync).
constexpr int kPre = 4;
constexpr int kBagsPerBlock = kThreads / 32;

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
    for (int64_t d = lane; d < W; d += 32) a.new_lengths[b.nl0 + d * b.L] = hist[grp][d];
}

__global__ void __launch_bounds__(kThreads) place_warp_kernel(BucketizeArgs a, FastDivU64 wd) {
  __shared__ int64_t base[kBagsPerBlock][kMaxSharedW];  // next free slot per bucket for this bag
  const int grp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t W = a.world_size;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kBagsPerBlock + grp;
  const bool active = g < a.total_bags;
  BagInfo b{};
  if (active) b = bag_info(a, g);
  for (int64_t d = lane; d < W; d += 32) base[grp][d] = active ? a.new_offsets[b.nl0 + d * b.L] : 0;
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
__global__ void count_serial_kernel(BucketizeArgs a, FastDivU64 wd) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= a.total_bags) return;
  const BagInfo b = bag_info(a, g);
  for (int64_t d = 0; d < a.world_size; ++d) a.new_lengths[b.nl0 + d * b.L] = 0;
  for (int64_t i = b.id_begin; i < b.id_end; ++i) {
    int64_t dest, local;
    route(a.ids[i], b, wd, a.ids_i32, &dest, &local);
    ++a.new_lengths[b.nl0 + dest * b.L];
  }
}

__global__ void place_serial_kernel(BucketizeArgs a, FastDivU64 wd) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= a.total_bags) return;
  const BagInfo b = bag_info(a, g);
  for (int64_t i = b.id_begin; i < b.id_end; ++i) {
    int64_t dest, local;
    route(a.ids[i], b, wd, a.ids_i32, &dest, &local);
    const int64_t pos = a.new_offsets[b.nl0 + dest * b.L]++;  // bag-owned cursor
    a.new_values[pos] = local;
    if (a.weights) a.new_weights[pos] = a.weights[i];
    a.perm[i] = pos - b.rank_id_base;
    if (a.dest_rank) a.dest_rank[i] = dest;
  }
}

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
constexpr int kWarps = kThreads / 32;
constexpr int kIdsPerLane = 8;              // ids per thread per chunk
constexpr int kWarpIds = 32 * kIdsPerLane;  // consecutive ids ranked by one warp
constexpr int kChunk = kWarps * kWarpIds;   // 2048 = hstu-e2e's bag length
constexpr int kLensPerThread = 4;           // lengths held per thread in step 1
constexpr int64_t kMaxOnePassBags = kLensPerThread * kThreads;  // 1024
constexpr int64_t kMaxRankEntries = 65536;                      // W x L_q words read by each block
constexpr int kWordsPerThread = 2;                              // words loaded per round in step 4
constexpr int kWordRound = kWordsPerThread * kThreads;
constexpr int64_t kMaxFeatTab = 512;      // R x (F+1) feature offsets kept in shared
constexpr unsigned kMaxPolls = 1u << 25;  // step 4 traps after this many polls of one round

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

// The lanes of the warp whose dest equals this lane's (dest < 2^Bits, or -1: no id), from
// one ballot per bit of dest as CUB's radix ranking does: cheaper than __match_any_sync.
// Bits is a compile-time bound (4 for W <= 16, else 8): bits above W's are 0 in every valid
// dest and 1 in -1, so the extra ballots leave both groups as they are, and a fixed count
// needs no per-bit test (those tests were a fifth of the ranking's instructions).
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
constexpr int kSmallW = 16;  // W <= kSmallW ranks with peers<4>

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

// Counts before ranks (W <= 16, a bag of one chunk): the block's counts come from a cheap
// histogram so they can be published before the ranking, which then overlaps the exchange.
// Loads and routes the chunk's n ids like rank_chunk (value[k] = local value) and packs each
// id's bucket in 4 bits of dpack (bits 4k..4k+3). Each thread counts its 8 ids in 16 4-bit
// fields (<= 8 each), warps sum them as 16-bit fields (<= 256), and on return, after a
// barrier, wc[w][d] = bucket d's ids in warps < w and chunk_tot[d] = its ids in the chunk.
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
    // Round-robin rules with W a power of two on a full chunk (hstu-e2e): the bucket is the
    // low bits of the (hashed) key, so no per-id bounds test, index-type select or division
    // branch (route's answer: the int32 casts of the key and of the hash keep those bits).
    // The local id stays the raw key, as route leaves it.
    const unsigned wm = static_cast<unsigned>(W - 1);
#pragma unroll
    for (int k = 0; k < kIdsPerLane; ++k) {
      const uint64_t x = static_cast<uint64_t>(value[k]);
      const unsigned d =
          static_cast<unsigned>(Dist == 2 ? d_fmix64(a.ids_i32 ? x & 0xffffffffull : x) : x) & wm;
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
// that count from the lane of its own bucket (two shuffles): ~25 instructions a tile instead
// of ~53 for peers() and a shared running row per lane (rank_tile; run 34, BENCHMARKS.md).
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
// slot i, so consecutive threads write consecutive addresses inside each bucket's run: 256-byte
// warp stores instead of ~16 scattered pairs of values (a direct scatter with W = 16; 22.7 ->
// 18.1 us on hstu-e2e, BENCHMARKS.md run 11), with one slot per thread per round and no
// per-bucket loop. perm is stored directly (indexed by the input position: already
// contiguous); weights and dest_rank only in the Extras instance (place_chunk_staged picks
// it): in one body with run-time tests the compiler predicated them into the common path (ncu:
// 46 issued instructions per warp that neither output wanted, BENCHMARKS.md run 19). Ends
// before the copy-out is complete: the caller's next barrier orders it before stage is reused.
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

// lex[d] = in[0] + ... + in[d-1] for d < W <= 256, by warp 0 (8 values per lane); the caller
// synchronizes before reading lex.
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

// ------------------------------------------- three-pass path, long bags (bucketize_block_per_bag)
// A block per bag, chunks of kChunk ids as on the one-pass path: counts, then (after the
// host's scan of new_lengths) the ranking again and the staged placement. Ids are read twice
// (the stage's only extra traffic); large batches (hstu-e2e x16: 8192 bags) take this path.
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

__global__ void __launch_bounds__(kThreads, 4) count_bag_kernel(BucketizeArgs a, FastDivU64 wd) {
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
  for (int64_t d = threadIdx.x; d < W; d += kThreads) a.new_lengths[b.nl0 + d * b.L] = hist[d];
}

template <int Bits>
__global__ void __launch_bounds__(kThreads, 4) place_bag_kernel(BucketizeArgs a, FastDivU64 wd) {
  __shared__ int wc[kWarps][kMaxSharedW];
  __shared__ int s_cnt[kMaxSharedW], s_lex[kMaxSharedW];
  __shared__ int64_t s_run[kMaxSharedW];
  __shared__ int64_t s_stage[kChunk], s_stage_pos[kChunk];
  const BagInfo b = bag_info(a, blockIdx.x);
  for (int64_t d = threadIdx.x; d < a.world_size; d += kThreads)
    s_run[d] = a.new_offsets[b.nl0 + d * b.L];  // read after rank_chunk's barriers
  place_bag_chunked<Bits, int64_t>(a, wd, b.dist, b.blk, b.id_begin, b.id_end - b.id_begin,
                                   b.rank_id_base, s_run, wc, s_cnt, s_lex, s_stage, s_stage_pos);
}

// 4 resident blocks per SM (<= 64 registers): 528 on an H200, hstu-e2e has 512 bags. Bits: see
// peers() (4 for W <= kSmallW, else 8); one instance per value (both ranking copies in one
// kernel made the register allocator spill ~100 bytes per thread).
template <int Bits, bool Long>
__global__ void __launch_bounds__(kThreads, 4) onepass_kernel(OnePassArgs p) {
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
      dv = a.dist_types[t];
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
    bag.dist = feat_shared ? s_dt[f] : a.dist_types[f];
  }
  for (int d = t; d < W; d += kThreads) s_tot[d] = 0;      // read by the same thread in step 2
  int64_t* bag_off = const_cast<int64_t*>(a.bag_offsets);  // an output on this path
  if (t == 0) {
    bag_off[g] = bag.begin;
    if (g == L - 1) bag_off[L] = static_cast<int64_t>(bag.begin) + bag.len;
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

// The instance for a ballot count (4 or 8 bits, peers()) and whether a bag may exceed kChunk.
const void* onepass_instance(int bits, bool long_bags) {
  if (bits == 4)
    return long_bags ? reinterpret_cast<const void*>(onepass_kernel<4, true>)
                     : reinterpret_cast<const void*>(onepass_kernel<4, false>);
  return long_bags ? reinterpret_cast<const void*>(onepass_kernel<8, true>)
                   : reinterpret_cast<const void*>(onepass_kernel<8, false>);
}

// Resident blocks of onepass_kernel on the current device (0: no cooperative launch).
int64_t onepass_capacity() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  static int cached_dev = -1;
  static int64_t cached = 0;
  if (cached_dev == dev) return cached;
  int coop = 0, sms = 0, per_sm = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  // Every instance: the capacity must hold for whichever a batch takes.
  per_sm = 1 << 30;
  for (const void* k : {onepass_instance(4, false), onepass_instance(4, true),
                        onepass_instance(8, false), onepass_instance(8, true)}) {
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kThreads, 0));
    per_sm = std::min(per_sm, n);
  }
  cached = coop ? std::min<int64_t>(static_cast<int64_t>(sms) * per_sm, kMaxOnePassBags) : 0;
  cached_dev = dev;
  return cached;
}

}  // namespace

size_t bucketize_scan_temp_bytes(int64_t n) {
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const int64_t*>(nullptr),
                                           static_cast<int64_t*>(nullptr), n > 0 ? n : 1));
  return bytes;
}

void launch_offsets_from_lengths(const int64_t* lengths, int64_t n, int64_t* offsets, void* temp,
                                 size_t temp_bytes, cudaStream_t s) {
  CUDA_CHECK(cudaMemsetAsync(offsets, 0, sizeof(int64_t), s));
  if (n == 0) return;
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, temp_bytes, lengths, offsets + 1, n, s));
}

bool bucketize_block_per_bag(const BucketizeArgs& a) {
  using P = BucketizeArgs::BagPath;
  return a.world_size <= kMaxSharedW &&
         (a.bag_path == P::block ||
          (a.bag_path == P::automatic && a.total_ids >= kBlockPerBagMinAvg * a.total_bags));
}

void launch_bucketize(const BucketizeArgs& a, cudaStream_t s) {
  const int64_t nl = a.world_size * a.total_bags;
  if (a.total_bags == 0) return;
  const FastDivU64 wd = FastDivU64::make(static_cast<uint64_t>(a.world_size));
  const bool shared_path = a.world_size <= kMaxSharedW;
  const bool long_bags = bucketize_block_per_bag(a);
  if (!shared_path) {
    const unsigned blocks = static_cast<unsigned>((a.total_bags + 127) / 128);
    count_serial_kernel<<<blocks, 128, 0, s>>>(a, wd);
  } else if (long_bags) {
    count_bag_kernel<<<static_cast<unsigned>(a.total_bags), kThreads, 0, s>>>(a, wd);
  } else {
    count_warp_kernel<<<static_cast<unsigned>((a.total_bags + kBagsPerBlock - 1) / kBagsPerBlock),
                        kThreads, 0, s>>>(a, wd);
  }
  CUDA_CHECK_LAUNCH();
  size_t tb = a.scan_temp_bytes;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(a.scan_temp, tb, a.new_lengths, a.new_offsets, nl, s));
  if (a.total_ids == 0) return;
  if (!shared_path) {
    const unsigned blocks = static_cast<unsigned>((a.total_bags + 127) / 128);
    place_serial_kernel<<<blocks, 128, 0, s>>>(a, wd);
  } else if (long_bags) {
    if (a.world_size <= kSmallW)
      place_bag_kernel<4><<<static_cast<unsigned>(a.total_bags), kThreads, 0, s>>>(a, wd);
    else
      place_bag_kernel<8><<<static_cast<unsigned>(a.total_bags), kThreads, 0, s>>>(a, wd);
  } else {
    place_warp_kernel<<<static_cast<unsigned>((a.total_bags + kBagsPerBlock - 1) / kBagsPerBlock),
                        kThreads, 0, s>>>(a, wd);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace dynemb::cuda

namespace dynemb::cuda {

size_t bucketize_fused_scratch_bytes() {
  // One word per (bucket, bag) of the largest eligible batch: W <= 256, L <= capacity.
  return static_cast<size_t>(8 * kMaxSharedW * onepass_capacity());
}

void bucketize_fused_scratch_init(void* scratch, size_t bytes, cudaStream_t s) {
  if (scratch && bytes) CUDA_CHECK(cudaMemsetAsync(scratch, 0, bytes, s));
}

int64_t bucketize_fused_capacity() {
  return onepass_capacity();
}

bool bucketize_fused_eligible(const BucketizeArgs& a, const BucketizeFused& f) {
  if (!f.scratch || a.total_bags == 0 || a.world_size > kMaxSharedW || a.num_ranks > kMaxSharedW ||
      a.total_ids >= (int64_t{1} << 31) || f.max_rank_bags * a.world_size > kMaxRankEntries ||
      f.scratch_bytes < static_cast<size_t>(8 * a.world_size * a.total_bags))
    return false;
  // A block per bag, all resident (hstu-e2e: 512 bags, 528 resident blocks on an H200).
  return a.total_bags <= onepass_capacity();
}

BucketizeFusedShape bucketize_fused_shape(const BucketizeArgs& a, const BucketizeFused& f) {
  BucketizeFusedShape sh;
  if (!bucketize_fused_eligible(a, f)) return sh;
  sh.grid = a.total_bags;
  sh.capacity = onepass_capacity();
  sh.ids_cached = a.max_bag_len <= kChunk;
  return sh;
}

void launch_bucketize_from_lengths(const BucketizeArgs& a, const int64_t* lengths,
                                   BucketizeFused& f, cudaStream_t s) {
  const auto three_passes = [&] {
    launch_offsets_from_lengths(lengths, a.total_bags, const_cast<int64_t*>(a.bag_offsets),
                                a.scan_temp, a.scan_temp_bytes, s);
    launch_bucketize(a, s);
  };
  if (!bucketize_fused_eligible(a, f)) return three_passes();
  if (++f.epoch == 0) {  // 2^32 launches on this scratch: start over from zeroed words
    bucketize_fused_scratch_init(f.scratch, f.scratch_bytes, s);
    f.epoch = 1;
  }
  OnePassArgs p;
  p.a = a;
  p.lengths = lengths;
  p.words = static_cast<unsigned long long*>(f.scratch);
  p.epoch = f.epoch;
  p.wd = FastDivU64::make(static_cast<uint64_t>(a.world_size));
  p.trace = f.trace;
  void* params[] = {&p};
  const void* kernel = onepass_instance(a.world_size <= kSmallW ? 4 : 8, a.max_bag_len > kChunk);
  const cudaError_t err = cudaLaunchCooperativeKernel(
      kernel, dim3(static_cast<unsigned>(a.total_bags)), dim3(kThreads), params, 0, s);
  if (err == cudaErrorCooperativeLaunchTooLarge) {
    // Fewer blocks fit than the occupancy query promised (SMs shared under MPS or a green
    // context): the three passes need no co-residency.
    (void)cudaGetLastError();
    return three_passes();
  }
  if (err != cudaSuccess)
    throw_cuda(err, "cudaLaunchCooperativeKernel(onepass_kernel)", __FILE__, __LINE__);
}

}  // namespace dynemb::cuda
