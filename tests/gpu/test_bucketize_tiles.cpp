// The partition path's tiling (plan_partition_tiles, host code of kernels/bucketize.cu): what
// the kernels rely on, over random batches. Needs no GPU (it runs wherever the CUDA code is
// compiled, CI included): every bag in exactly one tile of one rank and one feature (the
// tile's feature in the table), the shared-memory bounds, each tile's first id (the kernels
// take it instead of a look-back over the tiles before it), and the bound on the tile count
// that keeps every tile resident for the one-launch kernel.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "bucketize.hpp"
#include "bucketize/config.cuh"

using namespace dynemb;
namespace bk = dynemb::cuda::bucketize;

namespace {

struct Batch {
  int64_t W = 0, F = 0;
  std::vector<int64_t> rank_bag_off, feat_bag_off, lengths;
  int64_t ids = 0, max_len = 0;
};

// R = W ranks; rank q holds B_q bags per feature (some ranks none), feature f's bags up to
// hot[f] ids (0 for features with only empty bags).
Batch random_batch(std::mt19937_64& rng, int64_t W, int64_t F, int64_t B) {
  auto U = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Batch b;
  b.W = W;
  b.F = F;
  std::vector<int64_t> hot(static_cast<size_t>(F));
  for (int64_t& h : hot) h = U(0, 3) == 0 ? U(0, 2) : U(1, 120);
  b.rank_bag_off.push_back(0);
  for (int64_t q = 0; q < W; ++q) {
    const int64_t Bq = U(0, 5) == 0 ? 0 : U(1, B);
    b.feat_bag_off.push_back(0);
    for (int64_t f = 0; f < F; ++f) {
      for (int64_t j = 0; j < Bq; ++j) {
        const int64_t len = U(0, hot[static_cast<size_t>(f)]);
        b.lengths.push_back(len);
        b.ids += len;
        b.max_len = std::max(b.max_len, len);
      }
      b.feat_bag_off.push_back(b.feat_bag_off.back() + Bq);
    }
    b.rank_bag_off.push_back(b.rank_bag_off.back() + F * Bq);
  }
  return b;
}

// Checks a tiling against its batch; returns the tiles that hold bags.
int64_t check_tiling(const Batch& b, const cuda::PartitionTiling& t) {
  const int64_t R = b.W, T = t.tiles_per_rank;
  REQUIRE(T > 0);
  REQUIRE(static_cast<int64_t>(t.tile_j0.size()) == R * (T + 1));
  REQUIRE(static_cast<int64_t>(t.tile_id0.size()) == R * T);
  REQUIRE(static_cast<int64_t>(t.tile_feat.size()) == R * T);
  CHECK(t.max_tile_bags <= bk::kPartMaxTileBags);
  CHECK(b.W * t.max_tile_bags <= bk::kPartMaxCells);
  std::vector<int64_t> offsets{0};  // the batch's bag offsets
  for (int64_t len : b.lengths) offsets.push_back(offsets.back() + len);
  int64_t used = 0, most = 0, most_ids = 0;
  for (int64_t q = 0; q < R; ++q) {
    const int64_t bags = b.rank_bag_off[q + 1] - b.rank_bag_off[q];
    const int64_t* tj = t.tile_j0.data() + q * (T + 1);
    const int64_t* fb = b.feat_bag_off.data() + q * (b.F + 1);
    CHECK(tj[0] == 0);
    CHECK(tj[T] == bags);
    for (int64_t kt = 0; kt < T; ++kt) {
      const int64_t j0 = tj[kt], j1 = tj[kt + 1];
      REQUIRE(j0 <= j1);  // consecutive, so every bag is in exactly one tile
      CHECK(j1 - j0 <= t.max_tile_bags);
      // The tile's first id, also for tiles past the rank's last bag (the rank's end).
      CHECK(t.tile_id0[q * T + kt] == offsets[b.rank_bag_off[q] + j0]);
      most_ids =
          std::max(most_ids, offsets[b.rank_bag_off[q] + j1] - offsets[b.rank_bag_off[q] + j0]);
      if (j1 == j0) continue;
      ++used;
      most = std::max(most, j1 - j0);
      // One feature, the table's (the kernels route the whole tile by its rule): the feature
      // of the first bag also holds the last.
      const int64_t f = std::upper_bound(fb, fb + b.F + 1, j0) - fb - 1;
      CHECK(j1 <= fb[f + 1]);
      CHECK(t.tile_feat[q * T + kt] == f);
    }
  }
  CHECK(most == t.max_tile_bags);
  CHECK(most_ids == t.max_tile_ids);  // the one launch's counts-first instance relies on it
  return used;
}

}  // namespace

TEST_CASE("partition tiles: bags, features, bounds and first ids over random batches") {
  std::mt19937_64 rng(2026);
  for (int it = 0; it < 300; ++it) {
    const int64_t W = std::vector<int64_t>{1, 2, 5, 8, 16, 64, 256}[it % 7];
    const int64_t F = 1 + it % 5;
    const Batch b = random_batch(rng, W, F, W > 16 ? 40 : 3000);
    if (b.lengths.empty()) continue;
    const int64_t tile_ids = it % 3 == 0 ? 0 : std::vector<int64_t>{100, 700, 1920, 5000}[it % 4];
    INFO("it " << it << " W=" << W << " F=" << F << " bags " << b.lengths.size() << " ids " << b.ids
               << " tile_ids " << tile_ids);
    const cuda::PartitionTiling t =
        cuda::plan_partition_tiles(W, F, b.rank_bag_off, b.feat_bag_off, b.lengths, tile_ids);
    check_tiling(b, t);
    CHECK(t.max_tile_bags <= bk::kPartTileBags);  // no bound on the tile count: the planned cap
  }
}

TEST_CASE("partition tiles: a bound on the tile count (the one-launch kernel's residency)") {
  std::mt19937_64 rng(27);
  int coarser = 0, wide = 0;
  for (int it = 0; it < 200; ++it) {
    const int64_t W = std::vector<int64_t>{4, 8, 16}[it % 3];
    const Batch b = random_batch(rng, W, 4, 2500);
    if (b.lengths.empty()) continue;
    const cuda::PartitionTiling free =
        cuda::plan_partition_tiles(W, 4, b.rank_bag_off, b.feat_bag_off, b.lengths);
    const int64_t max_tiles = std::vector<int64_t>{132, 528, 1056}[it % 3];
    const cuda::PartitionTiling bound =
        cuda::plan_partition_tiles(W, 4, b.rank_bag_off, b.feat_bag_off, b.lengths, 0, max_tiles);
    INFO("it " << it << " W=" << W << " ids " << b.ids << " tiles " << W * free.tiles_per_rank
               << " -> " << W * bound.tiles_per_rank << " for at most " << max_tiles);
    check_tiling(b, bound);
    if (W * free.tiles_per_rank <= max_tiles) {
      // Already within the bound: the tiling is the unbounded one.
      CHECK(bound.tile_j0 == free.tile_j0);
    } else if (W * bound.tiles_per_rank <= max_tiles) {
      ++coarser;  // fewer, larger tiles
      CHECK(bound.tiles_per_rank < free.tiles_per_rank);
      // Tiles of more than the planned bags only where the tiles grew (past one chunk).
      if (bound.max_tile_bags > bk::kPartTileBags) ++wide;
    } else {
      // No tiling of at most kPartTileIds ids a tile fits: the unbounded one stays. That
      // needs more ids than max_tiles such tiles hold (or the bag caps bind).
      CHECK(bound.tile_j0 == free.tile_j0);
    }
  }
  CHECK(coarser > 20);  // the bound did take effect, and many times
  CHECK(wide > 0);      // and short-bag tiles took the wider cap
}
