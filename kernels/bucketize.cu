// block_bucketize_sparse_features (rw-semantics.md §3.2, §3.3, §10.2), stable, in three
// passes: per-(bag, bucket) counts -> one exclusive scan over all new_lengths -> placement.
// A bag is handled by a group of threads (one warp for short bags, a whole 256-thread
// block for long ones, e.g. hstu-e2e's 2048-id bags), so long bags run in parallel while
// each id keeps its order inside its (bucket, bag) segment: within a tile of the bag, an
// id's slot is (ids of the same bucket in earlier tiles) + (in earlier warps of the tile)
// + (in earlier lanes of its warp, from __match_any_sync). W > 256 buckets fall back to
// one thread per bag (DynamicEmb's kernel2 order, also stable).
#include <cub/device/device_scan.cuh>

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
