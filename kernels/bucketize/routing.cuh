// Where one id goes: the bag's routing parameters and the destination rank and local id of
// an id, exactly as route_id (lib/engine/ops.cpp) computes them (docs/semantics.md §3).
#pragma once

#include <cstdint>

#include "bucketize.hpp"
#include "common/fastdiv.hpp"
#include "common/hash.hpp"
#include "device_math.cuh"

namespace dynemb::cuda::bucketize {

using dynemb::FastDivU64;

struct BagInfo {
  int64_t id_begin, id_end;  // ids of the bag
  int64_t nl0;               // new_lengths index of (bucket 0, this bag)
  int64_t rank_bags;         // bags of this rank (new_lengths stride per bucket)
  int64_t rank_id_base;      // first global id of this rank (perm is rank-local)
  uint64_t blk;
  int32_t dist;
};

__device__ __forceinline__ BagInfo bag_info(const BucketizeArgs& a, int64_t g) {
  BagInfo b;
  const int64_t q = d_upper_bound_m1(a.rank_bag_off, a.num_ranks, g);
  const int64_t first = a.rank_bag_off[q];
  const int64_t j = g - first;
  b.rank_bags = a.rank_bag_off[q + 1] - first;
  b.nl0 = a.world_size * first + j;
  b.id_begin = a.bag_offsets[g];
  b.id_end = a.bag_offsets[g + 1];
  b.rank_id_base = a.bag_offsets[first];
  const int64_t f = d_upper_bound_m1(a.feat_bag_off + q * (a.num_features + 1), a.num_features, j);
  b.blk = a.block_sizes[f];
  b.dist = static_cast<int32_t>(a.dist_types[f]);
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

// Destination rank and local id of one id (docs/semantics.md §3.2 uniform blocks, §10.2 dist
// types), exactly as route_id (lib/engine/ops.cpp). wd divides by W.
__device__ __forceinline__ void route(int64_t id, const BagInfo& b, const FastDivU64& wd, bool i32,
                                      int64_t* dest, int64_t* local) {
  const uint64_t x =
      i32 ? static_cast<uint64_t>(static_cast<uint32_t>(id)) : static_cast<uint64_t>(id);
  if (b.dist == 1) {  // roundrobin: raw key stays
    *dest = static_cast<int64_t>(wd.mod(x));
    *local = id;
  } else if (b.dist == 2) {  // hash_roundrobin: fmix64, cast to the index type, % W
    uint64_t h = fmix64(x);
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

}  // namespace dynemb::cuda::bucketize
