// block_bucketize_sparse_features (rw-semantics.md §3.2, §3.3, §10.2), stable, in three
// passes: per-(bag, bucket) counts -> one exclusive scan over all new_lengths -> placement.
// A bag is handled by a group of threads (one warp for short bags, a whole 256-thread
// block for long ones, e.g. hstu-e2e's 2048-id bags), so long bags run in parallel while
// each id keeps its order inside its (bucket, bag) segment: within a tile of the bag, an
// id's slot is (ids of the same bucket in earlier tiles) + (in earlier warps of the tile)
// + (in earlier lanes of its warp, from __match_any_sync). W > 256 buckets fall back to
// one thread per bag (DynamicEmb's kernel2 order, also stable).
//
// Long bags have a second, fused path (fused_kernel below): one persistent kernel for the
// whole stage, because at hstu-e2e's size (1 M ids, 25 MB) the three-pass version is
// dominated by its six launches (two cub scans), not by bandwidth.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>

#include "cuda_check.hpp"
#include "device_math.cuh"
#include "dist_kernels.hpp"

namespace dynemb::cuda {
namespace {

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

// Destination rank and local id of one id (§3.2 uniform blocks; §10.2 dist types).
__device__ __forceinline__ void route(int64_t id, const BagInfo& b, int64_t W, bool i32,
                                      int64_t* dest, int64_t* local) {
  const uint64_t w = static_cast<uint64_t>(W);
  const uint64_t x =
      i32 ? static_cast<uint64_t>(static_cast<uint32_t>(id)) : static_cast<uint64_t>(id);
  if (b.dist == 1) {  // roundrobin: raw key stays
    *dest = static_cast<int64_t>(x % w);
    *local = id;
  } else if (b.dist == 2) {  // hash_roundrobin: fmix64, cast to the index type, % W
    uint64_t h = d_fmix64(x);
    if (i32) h = static_cast<uint32_t>(h);
    *dest = static_cast<int64_t>(h % w);
    *local = id;
  } else {
    const uint64_t G = b.blk * w;
    uint64_t loc;
    if (x < G) {
      *dest = static_cast<int64_t>(x / b.blk);
      loc = x % b.blk;
    } else {
      *dest = static_cast<int64_t>(x % w);
      loc = x / w;
    }
    *local = i32 ? static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(loc)))
                 : static_cast<int64_t>(loc);
  }
}

constexpr int kPre = 4;  // tiles whose ids are loaded before the first is processed

template <int NW>  // warps per bag
__global__ void __launch_bounds__(kThreads) count_kernel(BucketizeArgs a) {
  constexpr int kGroups = kThreads / (32 * NW);
  constexpr int kTile = 32 * NW;
  __shared__ int hist[kGroups][kMaxSharedW];
  const int grp = threadIdx.x / kTile;
  const int t = threadIdx.x % kTile;
  const int lane = t % 32;
  const int64_t W = a.world_size;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kGroups + grp;
  const bool active = g < a.total_bags;
  BagInfo b{};
  if (active) b = bag_info(a, g);
  for (int64_t d = t; d < W; d += kTile) hist[grp][d] = 0;
  if (NW == 1)
    __syncwarp();
  else
    __syncthreads();
  const int64_t len = active ? b.id_end - b.id_begin : 0;
  // Loop bounds are uniform over the group, so __match_any_sync sees whole warps.
  for (int64_t c0 = 0; c0 < len; c0 += kTile * kPre) {
    int64_t idv[kPre];
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int64_t off = c0 + u * kTile + t;
      idv[u] = off < len ? a.ids[b.id_begin + off] : 0;
    }
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int64_t off = c0 + u * kTile + t;
      int64_t dest = -1, local;
      if (off < len) route(idv[u], b, W, a.ids_i32, &dest, &local);
      // Warp-aggregated: one shared atomic per (warp, bucket) instead of one per id.
      const unsigned same = __match_any_sync(0xffffffffu, dest);
      if (dest >= 0 && (same & ((1u << lane) - 1u)) == 0) atomicAdd(&hist[grp][dest], __popc(same));
    }
  }
  if (NW == 1)
    __syncwarp();
  else
    __syncthreads();
  if (active)
    for (int64_t d = t; d < W; d += kTile) a.new_lengths[b.nl0 + d * b.L] = hist[grp][d];
}

template <int NW>
__global__ void __launch_bounds__(kThreads) place_kernel(BucketizeArgs a) {
  constexpr int kGroups = kThreads / (32 * NW);
  constexpr int kTile = 32 * NW;
  __shared__ int cnt[kGroups][NW][kMaxSharedW];   // ids per (warp of the tile, bucket)
  __shared__ int64_t base[kGroups][kMaxSharedW];  // next free slot per bucket for this bag
  const int grp = threadIdx.x / kTile;
  const int t = threadIdx.x % kTile;
  const int warp = t / 32, lane = t % 32;
  const int64_t W = a.world_size;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kGroups + grp;
  const bool active = g < a.total_bags;
  BagInfo b{};
  if (active) b = bag_info(a, g);
  for (int64_t d = t; d < W; d += kTile) {
    base[grp][d] = active ? a.new_offsets[b.nl0 + d * b.L] : 0;
    for (int w = 0; w < NW; ++w) cnt[grp][w][d] = 0;
  }
  const int64_t len = active ? b.id_end - b.id_begin : 0;
  // Every thread of a group runs the same tiles (NW > 1: one group per block).
  for (int64_t c0 = 0; c0 < len; c0 += kTile * kPre) {
    int64_t idv[kPre];
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int64_t off = c0 + u * kTile + t;
      idv[u] = off < len ? a.ids[b.id_begin + off] : 0;
    }
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int64_t t0 = c0 + u * kTile;
      if (t0 >= len) break;  // uniform over the group
      if (NW == 1)
        __syncwarp();
      else
        __syncthreads();
      const int64_t i = b.id_begin + t0 + t;
      const bool valid = t0 + t < len;
      int64_t dest = -1, local = 0;
      if (valid) route(idv[u], b, W, a.ids_i32, &dest, &local);
      const unsigned same = __match_any_sync(0xffffffffu, dest);
      const int rank_in_warp = __popc(same & ((1u << lane) - 1u));
      if (valid && rank_in_warp == 0) cnt[grp][warp][dest] = __popc(same);
      if (NW == 1)
        __syncwarp();
      else
        __syncthreads();
      if (valid) {
        int64_t pos = base[grp][dest] + rank_in_warp;
        for (int w = 0; w < warp; ++w) pos += cnt[grp][w][dest];
        a.new_values[pos] = local;
        if (a.weights) a.new_weights[pos] = a.weights[i];
        a.perm[i] = pos - b.rank_id_base;
        if (a.dest_rank) a.dest_rank[i] = dest;
      }
      if (NW == 1)
        __syncwarp();
      else
        __syncthreads();
      for (int64_t d = t; d < W; d += kTile) {
        int64_t tot = 0;
        for (int w = 0; w < NW; ++w) {
          tot += cnt[grp][w][d];
          cnt[grp][w][d] = 0;
        }
        base[grp][d] += tot;
      }
    }
  }
}

// W > kMaxSharedW: one thread per bag, ids in order (counts, then cursors in new_offsets).
__global__ void count_serial_kernel(BucketizeArgs a) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= a.total_bags) return;
  const BagInfo b = bag_info(a, g);
  for (int64_t d = 0; d < a.world_size; ++d) a.new_lengths[b.nl0 + d * b.L] = 0;
  for (int64_t i = b.id_begin; i < b.id_end; ++i) {
    int64_t dest, local;
    route(a.ids[i], b, a.world_size, a.ids_i32, &dest, &local);
    ++a.new_lengths[b.nl0 + dest * b.L];
  }
}

__global__ void place_serial_kernel(BucketizeArgs a) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= a.total_bags) return;
  const BagInfo b = bag_info(a, g);
  for (int64_t i = b.id_begin; i < b.id_end; ++i) {
    int64_t dest, local;
    route(a.ids[i], b, a.world_size, a.ids_i32, &dest, &local);
    const int64_t pos = a.new_offsets[b.nl0 + dest * b.L]++;  // bag-owned cursor
    a.new_values[pos] = local;
    if (a.weights) a.new_weights[pos] = a.weights[i];
    a.perm[i] = pos - b.rank_id_base;
    if (a.dest_rank) a.dest_rank[i] = dest;
  }
}

// ------------------------------------------------------------------- fused long-bag path
// One cooperative launch, every block resident, so a block may wait for another:
//   A. bag offsets: block b owns bags [g0, g1) (k = ceil(L / G) each); it publishes the sum of
//      its lengths, adds up the sums of blocks < b (spinning on their flags), and scans its
//      own lengths into bag_offsets.
//   B. counts: per owned bag, as count_kernel<8> (ids and destinations stay in registers
//      when the block owns one bag of <= kCacheIds ids); then an atomic per-rank tally. The
//      block that counts a rank's last bag scans that rank's W x L_q new_lengths into
//      new_offsets (rank region base = bag_offsets[first bag]) and publishes a rank flag.
//   C. placement: per owned bag, once its rank's flag is up, as place_kernel<8>.
// No block waits in B, and A waits only on blocks that publish before waiting, so there is
// no deadlock while all blocks are resident (the cooperative launch guarantees it). The
// scratch flags and counters are zeroed by the last block to finish, ready for the next
// launch on the same stream.
constexpr int kCacheTiles = 8;                    // ids per thread kept in registers
constexpr int64_t kCacheIds = kCacheTiles * kThreads;  // 2048: hstu-e2e's bag length
constexpr int64_t kMaxFusedRankEntries = 65536;   // W x L_q scanned by one block
constexpr int kSlots = kCacheTiles * (kThreads / 32);  // (tile, warp) slots of a cached bag
constexpr int kSlotsMaxW = 64;                         // slot counts kept for W <= 64

struct FusedScratch {
  int* chunk_flag;     // [G]  block b's length sum is published
  int* rank_cnt;       // [R]  bags of rank q counted
  int* rank_flag;      // [R]  rank q's new_offsets are published
  int* done;           // [1]  blocks finished
  int64_t* chunk_sum;  // [G]  block b's length sum
};

struct FusedArgs {
  BucketizeArgs a;
  const int64_t* lengths;  // [L]
  FusedScratch sc;
  int64_t bags_per_block;  // k
  bool cache;              // every block owns at most one bag of <= kCacheIds ids
  bool slots;              // cache and W <= kSlotsMaxW: barrier-free placement
};

size_t fused_scratch_bytes_for(int64_t grid, int64_t R) {
  const int64_t ints = grid + 2 * R + 1;
  const int64_t int_bytes = (4 * ints + 15) / 16 * 16;
  return static_cast<size_t>(int_bytes + 8 * grid);
}
FusedScratch fused_scratch_view(void* p, int64_t grid, int64_t R) {
  FusedScratch sc;
  int* ip = static_cast<int*>(p);
  sc.chunk_flag = ip;
  sc.rank_cnt = ip + grid;
  sc.rank_flag = ip + grid + R;
  sc.done = ip + grid + 2 * R;
  const int64_t int_bytes = (4 * (grid + 2 * R + 1) + 15) / 16 * 16;
  sc.chunk_sum = reinterpret_cast<int64_t*>(static_cast<char*>(p) + int_bytes);
  return sc;
}

// Release/acquire flag accesses at GPU scope (PTX memory model, sm_70+).
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Spins until *flag is set. The flags are set by resident blocks that never wait first, so
// this returns; should that ever break (a driver that does not honour the cooperative launch,
// a bug), trap after 10 s instead of hanging the GPU: the host then sees a CUDA error.
__device__ __forceinline__ void wait_flag(const int* flag, unsigned sleep_ns) {
  uint64_t t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (ld_acquire(flag) == 0) {
    __nanosleep(sleep_ns);
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - t0 > 10000000000ull) __trap();
  }
}

struct FusedBag {
  BagInfo b;      // id_begin/id_end, nl0, L (= L_q), blk, dist; rank_id_base unused here
  int64_t q;      // owning rank
  int64_t first;  // first bag of rank q
};

__device__ __forceinline__ FusedBag fused_bag(const BucketizeArgs& a, const int64_t* lengths,
                                              int64_t g) {
  FusedBag fb;
  fb.q = d_upper_bound_m1(a.rank_bag_off, a.num_ranks, g);
  fb.first = a.rank_bag_off[fb.q];
  const int64_t j = g - fb.first;
  fb.b.L = a.rank_bag_off[fb.q + 1] - fb.first;
  fb.b.nl0 = a.world_size * fb.first + j;
  fb.b.id_begin = a.bag_offsets[g];  // written by this block in phase A (visible after a barrier)
  fb.b.id_end = fb.b.id_begin + lengths[g];
  fb.b.rank_id_base = 0;
  const int64_t f =
      d_upper_bound_m1(a.feat_bag_off + fb.q * (a.num_features + 1), a.num_features, j);
  fb.b.blk = a.block_sizes[f];
  fb.b.dist = a.dist_types[f];
  return fb;
}

// 4 resident blocks per SM (<= 64 registers): hstu-e2e's 512 bags get a block each.
__global__ void __launch_bounds__(kThreads, 4) fused_kernel(FusedArgs fa) {
  using BlockReduce = cub::BlockReduce<int64_t, kThreads>;
  using BlockScan = cub::BlockScan<int64_t, kThreads>;
  __shared__ union {
    typename BlockReduce::TempStorage reduce;
    typename BlockScan::TempStorage scan;
  } tmp;
  __shared__ int cnt[kThreads / 32][kMaxSharedW];  // ids per (warp, bucket); hist = cnt[0]
  __shared__ int64_t base[kMaxSharedW];             // next free slot per bucket for this bag
  __shared__ int64_t s_val;
  __shared__ int s_flag;
  // fa.slots: ids of slot s = (tile u, warp w) per bucket d at [s * W + d], turned into the
  // exclusive prefix over slots in id order, so placement needs no barrier per tile.
  __shared__ int slot_cnt[kSlots * kSlotsMaxW];

  const BucketizeArgs& a = fa.a;
  const FusedScratch& sc = fa.sc;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t W = a.world_size, L = a.total_bags;
  const int64_t bid = blockIdx.x;
  const int64_t g0 = bid * fa.bags_per_block;
  const int64_t g1 = std::min<int64_t>(g0 + fa.bags_per_block, L);

  int64_t* bag_off = const_cast<int64_t*>(a.bag_offsets);  // an output on this path
  // The cached bag's ids (fa.cache), read once: phase C re-routes them (a few ALU ops per id
  // instead of a second pass over memory).
  int64_t cid[kCacheTiles];

  if (g0 < L) {
    // ---- A. bag offsets
    int64_t part = 0;
    for (int64_t g = g0 + t; g < g1; g += kThreads) part += fa.lengths[g];
    const int64_t own = BlockReduce(tmp.reduce).Sum(part);
    if (t == 0) {
      sc.chunk_sum[bid] = own;
      __threadfence();
      st_release(&sc.chunk_flag[bid], 1);
    }
    part = 0;
    for (int64_t bb = t; bb < bid; bb += kThreads) {
      wait_flag(&sc.chunk_flag[bb], 32);
      part += __ldcg(&sc.chunk_sum[bb]);
    }
    __syncthreads();  // tmp reused
    const int64_t prefix = BlockReduce(tmp.reduce).Sum(part);
    if (t == 0) s_val = prefix;
    __syncthreads();
    int64_t carry = s_val;
    for (int64_t c = g0; c < g1; c += kThreads) {
      const int64_t g = c + t;
      const int64_t len = g < g1 ? fa.lengths[g] : 0;
      int64_t excl, tile_sum;
      BlockScan(tmp.scan).ExclusiveSum(len, excl, tile_sum);
      if (g < g1) bag_off[g] = carry + excl;
      // Only the owner of bag L-1 writes the total (a thread past g1 of an earlier block has
      // g == L-1 too, with len 0: it must not race the owner).
      if (g < g1 && g == L - 1) bag_off[L] = carry + excl + len;
      carry += tile_sum;
      __syncthreads();
    }

    // ---- B. counts per owned bag; the last counter of a rank scans it
    for (int64_t g = g0; g < g1; ++g) {
      const FusedBag fb = fused_bag(a, fa.lengths, g);
      const int64_t len = fb.b.id_end - fb.b.id_begin;
      if (fa.slots)
        for (int64_t i = t; i < kSlots * W; i += kThreads) slot_cnt[i] = 0;
      else
        for (int64_t d = t; d < W; d += kThreads) cnt[0][d] = 0;
      __syncthreads();
      for (int64_t c0 = 0; c0 < len; c0 += kCacheIds) {
        int64_t idv[kCacheTiles];
#pragma unroll
        for (int u = 0; u < kCacheTiles; ++u) {
          const int64_t off = c0 + u * kThreads + t;
          idv[u] = off < len ? a.ids[fb.b.id_begin + off] : 0;
        }
#pragma unroll
        for (int u = 0; u < kCacheTiles; ++u) {
          const int64_t off = c0 + u * kThreads + t;
          int64_t dest = -1, local = 0;
          if (off < len) route(idv[u], fb.b, W, a.ids_i32, &dest, &local);
          if (fa.cache) cid[u] = idv[u];
          const unsigned same = __match_any_sync(0xffffffffu, dest);
          if (dest >= 0 && (same & ((1u << lane) - 1u)) == 0) {
            if (fa.slots)  // one leader per (slot, bucket): a plain store
              slot_cnt[(u * (kThreads / 32) + warp) * W + dest] = __popc(same);
            else
              atomicAdd(&cnt[0][dest], __popc(same));
          }
        }
      }
      __syncthreads();
      if (fa.slots) {
        for (int64_t d = t; d < W; d += kThreads) {
          int run = 0;
          for (int sl = 0; sl < kSlots; ++sl) {
            const int v = slot_cnt[sl * W + d];
            slot_cnt[sl * W + d] = run;
            run += v;
          }
          a.new_lengths[fb.b.nl0 + d * fb.b.L] = run;
        }
      } else {
        for (int64_t d = t; d < W; d += kThreads) a.new_lengths[fb.b.nl0 + d * fb.b.L] = cnt[0][d];
      }
      // Every thread's writes (bag offsets, new_lengths) before the tally that publishes them.
      __threadfence();
      __syncthreads();
      if (t == 0) {
        const int old = atomicAdd(&sc.rank_cnt[fb.q], 1);
        s_flag = old == fb.b.L - 1;
        if (s_flag) __threadfence();
      }
      __syncthreads();
      if (s_flag) {
        // This block counted rank q's last bag: scan its [d][j] new_lengths into new_offsets.
        const int64_t n = W * fb.b.L, r0 = W * fb.first;
        int64_t rc = __ldcg(&a.bag_offsets[fb.first]);  // rank region base
        for (int64_t c = 0; c < n; c += kThreads) {
          const int64_t i = c + t;
          const int64_t v = i < n ? __ldcg(&a.new_lengths[r0 + i]) : 0;
          int64_t excl, tile_sum;
          BlockScan(tmp.scan).ExclusiveSum(v, excl, tile_sum);
          if (i < n) a.new_offsets[r0 + i] = rc + excl;
          rc += tile_sum;
          __syncthreads();
        }
        __threadfence();
        __syncthreads();
        if (t == 0) st_release(&sc.rank_flag[fb.q], 1);
      }
      __syncthreads();  // cnt and s_flag reused
    }

    // ---- C. placement per owned bag, stable (as place_kernel<8>)
    for (int64_t g = g0; g < g1; ++g) {
      const FusedBag fb = fused_bag(a, fa.lengths, g);
      const int64_t len = fb.b.id_end - fb.b.id_begin;
      if (t == 0)
        wait_flag(&sc.rank_flag[fb.q], 64);
      __syncthreads();
      for (int64_t d = t; d < W; d += kThreads) {
        base[d] = __ldcg(&a.new_offsets[fb.b.nl0 + d * fb.b.L]);
        for (int w = 0; w < kThreads / 32; ++w) cnt[w][d] = 0;
      }
      const int64_t rank_base = __ldcg(&a.bag_offsets[fb.first]);
      if (fa.slots) {
        // Positions straight from the slot prefixes of phase B: no barrier per tile.
        __syncthreads();
#pragma unroll
        for (int u = 0; u < kCacheTiles; ++u) {
          const int64_t t0 = u * kThreads;
          if (t0 >= len) break;
          const bool valid = t0 + t < len;
          int64_t dest64 = -1, local = 0;
          if (valid) route(cid[u], fb.b, W, a.ids_i32, &dest64, &local);
          const int dest = static_cast<int>(dest64);
          const unsigned same = __match_any_sync(0xffffffffu, dest);
          const int rank_in_warp = __popc(same & ((1u << lane) - 1u));
          if (valid) {
            const int64_t i = fb.b.id_begin + t0 + t;
            const int64_t pos =
                base[dest] + slot_cnt[(u * (kThreads / 32) + warp) * W + dest] + rank_in_warp;
            a.new_values[pos] = local;
            if (a.weights) a.new_weights[pos] = a.weights[i];
            a.perm[i] = pos - rank_base;
            if (a.dest_rank) a.dest_rank[i] = dest;
          }
        }
      }
      for (int64_t c0 = 0; !fa.slots && c0 < len; c0 += kCacheIds) {
        int64_t idv[kCacheTiles];
#pragma unroll
        for (int u = 0; u < kCacheTiles; ++u) {
          const int64_t off = c0 + u * kThreads + t;
          idv[u] = fa.cache ? cid[u] : off < len ? a.ids[fb.b.id_begin + off] : 0;
        }
#pragma unroll
        for (int u = 0; u < kCacheTiles; ++u) {
          const int64_t t0 = c0 + u * kThreads;
          if (t0 >= len) break;  // uniform over the block
          __syncthreads();
          const bool valid = t0 + t < len;
          int64_t dest64 = -1, local = 0;
          if (valid) route(idv[u], fb.b, W, a.ids_i32, &dest64, &local);
          const int dest = static_cast<int>(dest64);
          const unsigned same = __match_any_sync(0xffffffffu, dest);
          const int rank_in_warp = __popc(same & ((1u << lane) - 1u));
          if (valid && rank_in_warp == 0) cnt[warp][dest] = __popc(same);
          __syncthreads();
          if (valid) {
            const int64_t i = fb.b.id_begin + t0 + t;
            int64_t pos = base[dest] + rank_in_warp;
            for (int w = 0; w < warp; ++w) pos += cnt[w][dest];
            a.new_values[pos] = local;
            if (a.weights) a.new_weights[pos] = a.weights[i];
            a.perm[i] = pos - rank_base;
            if (a.dest_rank) a.dest_rank[i] = dest;
          }
          __syncthreads();
          for (int64_t d = t; d < W; d += kThreads) {
            int64_t tot = 0;
            for (int w = 0; w < kThreads / 32; ++w) {
              tot += cnt[w][d];
              cnt[w][d] = 0;
            }
            base[d] += tot;
          }
        }
      }
      __syncthreads();  // base/cnt reused by the next bag
    }
  }

  // ---- the last block to finish leaves the scratch zeroed for the next launch
  __threadfence();
  __syncthreads();
  if (t == 0) {
    s_flag = atomicAdd(sc.done, 1) == static_cast<int>(gridDim.x) - 1;
    if (s_flag) __threadfence();
  }
  __syncthreads();
  if (s_flag) {
    for (int64_t i = t; i < static_cast<int64_t>(gridDim.x); i += kThreads) sc.chunk_flag[i] = 0;
    for (int64_t q = t; q < a.num_ranks; q += kThreads) {
      sc.rank_cnt[q] = 0;
      sc.rank_flag[q] = 0;
    }
    if (t == 0) *sc.done = 0;
  }
}

// Resident blocks of fused_kernel on the current device (0: no cooperative launch).
int64_t fused_capacity() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  static int cached_dev = -1;
  static int64_t cached = 0;
  if (cached_dev == dev) return cached;
  int coop = 0, sms = 0, per_sm = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fused_kernel, kThreads, 0));
  cached = coop ? static_cast<int64_t>(sms) * per_sm : 0;
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

void launch_bucketize(const BucketizeArgs& a, cudaStream_t s) {
  const int64_t nl = a.world_size * a.total_bags;
  if (a.total_bags == 0) return;
  const bool shared_path = a.world_size <= kMaxSharedW;
  const bool long_bags = a.max_bag_len > 64;
  if (!shared_path) {
    const unsigned blocks = static_cast<unsigned>((a.total_bags + 127) / 128);
    count_serial_kernel<<<blocks, 128, 0, s>>>(a);
  } else if (long_bags) {
    count_kernel<8><<<static_cast<unsigned>(a.total_bags), kThreads, 0, s>>>(a);
  } else {
    count_kernel<1><<<static_cast<unsigned>((a.total_bags + 7) / 8), kThreads, 0, s>>>(a);
  }
  CUDA_CHECK_LAUNCH();
  size_t tb = a.scan_temp_bytes;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(a.scan_temp, tb, a.new_lengths, a.new_offsets, nl, s));
  if (a.total_ids == 0) return;
  if (!shared_path) {
    const unsigned blocks = static_cast<unsigned>((a.total_bags + 127) / 128);
    place_serial_kernel<<<blocks, 128, 0, s>>>(a);
  } else if (long_bags) {
    place_kernel<8><<<static_cast<unsigned>(a.total_bags), kThreads, 0, s>>>(a);
  } else {
    place_kernel<1><<<static_cast<unsigned>((a.total_bags + 7) / 8), kThreads, 0, s>>>(a);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace dynemb::cuda

namespace dynemb::cuda {

size_t bucketize_fused_scratch_bytes(int64_t num_ranks) {
  const int64_t cap = fused_capacity();
  return cap > 0 ? fused_scratch_bytes_for(cap, num_ranks) : 0;
}

void bucketize_fused_scratch_init(void* scratch, size_t bytes, cudaStream_t s) {
  if (scratch && bytes) CUDA_CHECK(cudaMemsetAsync(scratch, 0, bytes, s));
}

bool bucketize_fused_eligible(const BucketizeArgs& a, const BucketizeFused& f) {
  if (!f.scratch || a.total_bags == 0 || a.world_size > kMaxSharedW || a.max_bag_len <= 64 ||
      f.max_rank_bags * a.world_size > kMaxFusedRankEntries)
    return false;
  const int64_t cap = fused_capacity();
  if (cap <= 0 || f.scratch_bytes < fused_scratch_bytes_for(cap, a.num_ranks)) return false;
  // One kernel wins when every block owns one bag (hstu-e2e: 37.8 us vs 53 us for the three
  // passes). With several bags per block it is slower than the three passes (hstu-e2e x16:
  // 503 us vs 397 us, BENCHMARKS.md), so that shape is taken only when a test forces it.
  return f.max_grid > 0 || a.total_bags <= cap;
}

int64_t bucketize_fused_capacity() {
  return fused_capacity();
}

BucketizeFusedShape bucketize_fused_shape(const BucketizeArgs& a, const BucketizeFused& f) {
  BucketizeFusedShape sh;
  if (!bucketize_fused_eligible(a, f)) return sh;
  int64_t grid = std::min(a.total_bags, fused_capacity());
  if (f.max_grid > 0) grid = std::min<int64_t>(grid, f.max_grid);
  sh.bags_per_block = (a.total_bags + grid - 1) / grid;
  sh.grid = (a.total_bags + sh.bags_per_block - 1) / sh.bags_per_block;  // no empty blocks
  sh.capacity = fused_capacity();
  sh.ids_cached = sh.bags_per_block == 1 && a.max_bag_len <= kCacheIds;
  return sh;
}

void launch_bucketize_from_lengths(const BucketizeArgs& a, const int64_t* lengths,
                                   const BucketizeFused& f, cudaStream_t s) {
  if (!bucketize_fused_eligible(a, f)) {
    launch_offsets_from_lengths(lengths, a.total_bags, const_cast<int64_t*>(a.bag_offsets),
                                a.scan_temp, a.scan_temp_bytes, s);
    launch_bucketize(a, s);
    return;
  }
  const BucketizeFusedShape sh = bucketize_fused_shape(a, f);
  const int64_t grid = sh.grid;
  FusedArgs fa;
  fa.a = a;
  fa.lengths = lengths;
  fa.bags_per_block = sh.bags_per_block;
  fa.cache = sh.ids_cached;
  fa.slots = sh.ids_cached && a.world_size <= kSlotsMaxW;
  // The view is laid out for the capacity the scratch was sized for; a smaller grid uses a
  // prefix of chunk_flag/chunk_sum.
  fa.sc = fused_scratch_view(f.scratch, fused_capacity(), a.num_ranks);
  void* params[] = {&fa};
  const cudaError_t err = cudaLaunchCooperativeKernel(reinterpret_cast<void*>(fused_kernel),
                                                      dim3(static_cast<unsigned>(grid)),
                                                      dim3(kThreads), params, 0, s);
  if (err == cudaErrorCooperativeLaunchTooLarge) {
    // Fewer blocks fit than the occupancy query promised (e.g. SMs shared under MPS or a
    // green context): the three passes need no co-residency.
    (void)cudaGetLastError();
    launch_offsets_from_lengths(lengths, a.total_bags, const_cast<int64_t*>(a.bag_offsets),
                                a.scan_temp, a.scan_temp_bytes, s);
    launch_bucketize(a, s);
    return;
  }
  if (err != cudaSuccess)
    throw_cuda(err, "cudaLaunchCooperativeKernel(fused_kernel)", __FILE__, __LINE__);
}

}  // namespace dynemb::cuda
