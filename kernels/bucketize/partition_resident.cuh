// The partition (partition.cuh) in one cooperative launch, for batches whose tiles are all
// resident at once: a block per tile counts, publishes its tile's counts per bucket, waits for
// the other tiles of its rank, and places, where the two-kernel path ends one kernel and
// starts the next between the counts and the placement (and re-reads the tile's geometry).
//
// Each block, for tile (q, kt) of T = tiles_per_rank:
//   scan_tile        the tile's bag offsets from its lengths and the host's tile_id0 (writes
//                    bag_offsets), its feature's routing rule;
//   count            the (bucket, bag) cells in shared memory (as partition_count_kernel);
//                    the tile's total per bucket, published as one epoch-tagged 64-bit word
//                    each, words[(q x W + d) x T + kt] (the one-pass kernel's scratch and
//                    epoch: nothing is reset between launches); then new_lengths;
//   tile_bases       a warp per bucket row d reads the rank's T words of row d, waiting for
//                    those not yet carrying the epoch: the rank's bucket-d ids and those of
//                    its tiles before kt give run[d] = (the rank's first id) + (its ids of
//                    buckets < d) + (its bucket-d ids in tiles < kt);
//   place            each 2048-id chunk ranked and placed as partition_place_kernel does.
// W <= kSmallW with every tile of at most one chunk (the OneChunk instance) publishes first:
// the chunk's 4-bit histogram (hist_chunk) gives the tile's totals, published before the
// ranking (rank_from_dest) and the cells (from the buckets held in registers), so the ids are
// read and routed once and the rank's other tiles see the counts earlier.
// Every block publishes before it waits (empty tiles publish zeros) and all are resident, so
// every wait ends; a wait that outlives kMaxPolls polls traps instead of hanging the GPU.
#pragma once

#include <cstdint>

#include "bucketize/config.cuh"
#include "bucketize/one_pass.cuh"  // ld_word, st_word
#include "bucketize/partition.cuh"
#include "bucketize/placement.cuh"
#include "bucketize/ranking.cuh"

namespace dynemb::cuda::bucketize {

struct ResidentPartitionArgs {
  PartitionArgs p;            // tile_cnt and tile_base unused
  unsigned long long* words;  // [R][W][T]: epoch << 32 | the tile's ids of bucket d
  unsigned epoch;             // != 0
  unsigned long long* trace;  // [kBucketizeTracePoints x R x T], traced instances only
};

// Bits: 4 for W <= kSmallW, else 8 (peers()). 4 resident blocks per SM (<= 64 registers,
// < 48 KB of shared memory each). Trace: block b stamps %globaltimer at the end of each step
// (trace[b x 6 + point]: 0 start, 1 bag offsets, 2 counts published, 3 first chunk ranked,
// 4 rank's counts seen, 5 placed; a tile with nothing to place stamps 2 to 5 at once), with a
// barrier before each stamp so that it marks the whole block's step. Untraced instances
// compile as if the stamps were not there.
// OneChunk (Bits 4 only): every tile holds at most one chunk of ids (the host's tiling says
// so), and each takes the counts-first order below; an instance of its own, because with both
// orders in one kernel the register allocator spills.
template <int Bits, bool Trace = false, bool OneChunk = false>
__global__ void __launch_bounds__(kThreads, 4) partition_resident_kernel(ResidentPartitionArgs r) {
  static_assert(!OneChunk || Bits == 4, "counts first needs the 4-bit histogram (W <= kSmallW)");
  __shared__ int s_off[kPartMaxTileBags + 1];
  __shared__ TileRule s_rule;
  __shared__ int wc[kWarps][kMaxSharedW];
  __shared__ int s_cnt[kMaxSharedW], s_lex[kMaxSharedW];
  __shared__ int64_t s_run[kMaxSharedW];  // bucket d's next global position in this tile
  __shared__ int s_wsum[kWarps];
  // The counts' cells and the placement's stage are never live together (barriers between).
  __shared__ union {
    int cells[kPartMaxCells];  // [d][k]: bucket-d ids of the tile's bag k
    struct {
      int64_t value[kChunk], pos[kChunk];
    } stage;
  } u;
  static_assert(sizeof(int) * kPartMaxCells <= sizeof(int64_t) * kChunk,
                "the cells end before the stage's positions (tile_bases' scratch)");
  const PartitionArgs& p = r.p;
  const BucketizeArgs& a = p.a;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int W = static_cast<int>(a.world_size);
  const int64_t T = p.tiles_per_rank;
  const unsigned long long tag = static_cast<unsigned long long>(r.epoch) << 32;
  const auto mark = [&](int first, int last) {  // steps first..last ended (Trace only)
    if (!Trace) return;
    __syncthreads();
    if (t == 0)
      for (int pt = first; pt <= last; ++pt)
        r.trace[static_cast<int64_t>(blockIdx.x) * kBucketizeTracePoints + pt] = global_ns();
  };
  mark(0, 0);
  PartitionTile ti = scan_tile(p, s_off, &s_rule, s_wsum);
  mark(1, 1);
  ti.rank_id_base = p.tile_id0[ti.q * T];
  unsigned long long* row0 = r.words + ti.q * W * T;  // + d * T: bucket d's row of the rank
  const int nb = ti.nb;
  const int n = nb > 0 ? s_off[nb] : 0;  // the tile's ids

  // Count (count_tile, as partition_count_kernel) and publish the tile's total per bucket. A
  // tile past its rank's last bag publishes zeros: the rank's other tiles wait on its words.
  if (nb == 0) {  // uniform
    for (int d = t; d < W; d += kThreads) st_word(row0 + d * T + ti.kt, tag);
    mark(2, 5);
    return;
  }
  // The rank's tile counts come from its words, waiting for those not yet carrying this
  // launch's tag: every tile of the rank publishes before it waits and all are resident, so
  // each wait ends; should that ever break, trap after kMaxPolls polls (as the one-pass kernel
  // does).
  const auto count = [&](int d, int64_t k) {
    const unsigned long long* w = row0 + d * T + k;
    unsigned long long v = ld_word(w);
    for (unsigned polls = 0; (v & 0xffffffff00000000ull) != tag; ++polls) {
      __nanosleep(64);
      if (polls == kMaxPolls) __trap();
      v = ld_word(w);
    }
    return static_cast<int64_t>(v & 0xffffffffu);
  };

  if constexpr (OneChunk) {  // n <= kChunk, W <= kSmallW: counts first
    // The chunk's counts from the 4-bit histogram are the tile's totals: published at once,
    // before the ranking and the cells, which then overlap the other tiles' counting (the
    // one-pass kernel's order). The ids are read once: their values and 4-bit buckets stay
    // in registers for the ranking, the cells and the placement.
    if (n > kChunk) __trap();  // the host's tile_max_ids was wrong
    int64_t value[kIdsPerLane];
    unsigned key[kIdsPerLane / 2];
    unsigned dpack;
    const int ncells = W * nb;
    for (int e = t; e < ncells; e += kThreads) u.cells[e] = 0;  // before hist's barriers
    hist_chunk_any(a, p.wd, s_rule.dist, a.ids + ti.id0, n, s_rule.blk, value, dpack, wc, s_cnt);
    for (int d = t; d < W; d += kThreads)
      st_word(row0 + d * T + ti.kt, tag | static_cast<unsigned>(s_cnt[d]));
    mark(2, 2);
    rank_from_dest(n, dpack, key);
    // The cells from the buckets in registers: lane l of warp w holds ids w x kWarpIds +
    // k x 32 + l, increasing with k, so each search starts at the previous id's bag.
    int kb = 0;
#pragma unroll
    for (int k = 0; k < kIdsPerLane; ++k) {
      const int i = warp * kWarpIds + k * 32 + lane;
      if (i < n) {
        kb = tile_bag_from(s_off, kb, nb, i);
        atomicAdd(&u.cells[static_cast<int>((dpack >> (4 * k)) & 0xfu) * nb + kb], 1);
      }
    }
    __syncthreads();
    store_new_lengths(a, ti, u.cells);
    if (n == 0) {  // uniform: only empty bags, nothing to place
      mark(3, 5);
      return;
    }
    exclusive_scan_buckets(s_cnt, s_lex, W);  // warp 0
    mark(3, 3);
    // tile_bases' scratch (stage.pos) lies past the cells, which new_lengths still reads.
    tile_bases(W, T, ti.kt, ti.rank_id_base, count, u.stage.pos, s_run);
    mark(4, 4);
    __syncthreads();  // run, lex written; the cells' reads done before the stage is written
    const ChunkOut<int64_t> o{a.weights ? a.weights + ti.id0 : nullptr, a.perm + ti.id0,
                              a.dest_rank ? a.dest_rank + ti.id0 : nullptr, ti.rank_id_base};
    place_chunk_staged(a, o, n, value, key, wc, s_run, s_lex, u.stage.value, u.stage.pos);
    mark(5, 5);
  } else {
    count_tile(p, ti, s_off, &s_rule, u.cells);
    for (int d = warp; d < W; d += kWarps) {  // a warp per bucket row
      int sum = 0;
      for (int k = lane; k < nb; k += 32) sum += u.cells[d * nb + k];
      sum = __reduce_add_sync(0xffffffffu, sum);
      if (lane == 0) st_word(row0 + d * T + ti.kt, tag | static_cast<unsigned>(sum));
    }
    store_new_lengths(a, ti, u.cells);  // after the publish, which the rank's tiles wait on
    mark(2, 2);
    if (n == 0) {  // uniform: only empty bags, nothing to place
      mark(3, 5);
      return;
    }

    // Rank and place (place_tile). The first chunk is ranked before the wait for the rank's
    // counts (its values and keys stay in registers until its placement), so that ranking
    // overlaps the other tiles' counting, as in the one-pass kernel. The rows' totals go to the
    // stage's positions, read before the barrier that precedes the first placement.
    place_tile<Bits>(p, ti, &s_rule, n, wc, s_cnt, s_lex, s_run, u.stage.value, u.stage.pos, [&] {
      mark(3, 3);
      tile_bases(W, T, ti.kt, ti.rank_id_base, count, u.stage.pos, s_run);
      mark(4, 4);
    });
    mark(5, 5);
  }
}

}  // namespace dynemb::cuda::bucketize
