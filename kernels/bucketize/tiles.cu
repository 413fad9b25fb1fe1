// The partition path's tiling, planned on the host (plan_partition_tiles, bucketize.hpp): each
// rank's bags cut into tiles of one feature and about equal ids, and each tile's first id.
#include <algorithm>
#include <vector>

#include "bucketize.hpp"
#include "bucketize/config.cuh"

namespace dynemb::cuda {

using namespace bucketize;

PartitionTiling plan_partition_tiles(int64_t world_size, int64_t num_features,
                                     const std::vector<int64_t>& rank_bag_off,
                                     const std::vector<int64_t>& feat_bag_off,
                                     const std::vector<int64_t>& lengths, int64_t tile_ids,
                                     int64_t max_tiles) {
  PartitionTiling t;
  const int64_t R = static_cast<int64_t>(rank_bag_off.size()) - 1, F = num_features;
  if (R <= 0 || F <= 0 || static_cast<int64_t>(feat_bag_off.size()) != R * (F + 1)) return t;
  // Each feature's ids and bags over all ranks, and the batch's ids.
  std::vector<int64_t> f_ids(static_cast<size_t>(F), 0), f_bags(static_cast<size_t>(F), 0);
  int64_t n = 0, max_len = 0;
  for (int64_t q = 0; q < R; ++q)
    for (int64_t f = 0; f < F; ++f) {
      const int64_t* fb = feat_bag_off.data() + q * (F + 1);
      for (int64_t j = rank_bag_off[q] + fb[f]; j < rank_bag_off[q] + fb[f + 1]; ++j) {
        f_ids[f] += lengths[j];
        max_len = std::max(max_len, lengths[j]);
      }
      f_bags[f] += fb[f + 1] - fb[f];
    }
  for (int64_t x : f_ids) n += x;
  // Ids of a tile: the batch over kPartMinTiles tiles, within [kPartMinTileIds, kPartTargetIds]
  // (partition.cuh says why). A whole number of chunks with 1/16 to spare, or under one chunk
  // by as much, so that a tile of mean-length bags does not spill a few ids into one more
  // (mostly idle) chunk.
  int64_t want = tile_ids > 0
                     ? tile_ids
                     : std::clamp<int64_t>(n / kPartMinTiles, kPartMinTileIds, kPartTargetIds);
  want = want >= kChunk ? (want / kChunk) * (kChunk - kChunk / 16)
                        : std::min<int64_t>(want, kChunk - kChunk / 16);
  // Bags of a tile at most: as planned (kPartTileBags), or the most the shared arrays hold
  // (kPartMaxTileBags, W x bags <= kPartMaxCells); and int32 tile-relative id indices (bags x
  // longest bag + a chunk < 2^31).
  const auto bag_cap = [&](int64_t bags) {
    return std::max<int64_t>(
        1, std::min<int64_t>({bags, kPartMaxCells / std::max<int64_t>(1, world_size),
                              ((int64_t{1} << 31) - 1 - kChunk) / std::max<int64_t>(1, max_len)}));
  };
  // Each rank's tiles for tiles of about `ids` ids: feature by feature, runs of nb[f] = ids /
  // (the feature's mean length) bags, the last one shorter. (With runs of equal length, each
  // tile would spill a few ids into a partly filled chunk; here only the one short tile of a
  // feature fills less than its chunks.) Returns the tiles of the largest rank.
  std::vector<std::vector<int64_t>> starts(static_cast<size_t>(R));
  std::vector<std::vector<int32_t>> feats(static_cast<size_t>(R));  // each start's feature
  const auto tile = [&](int64_t ids, int64_t cap) {
    t.max_tile_bags = 0;
    int64_t most = 0;
    for (int64_t q = 0; q < R; ++q) {
      starts[q].clear();
      feats[q].clear();
      const int64_t* fb = feat_bag_off.data() + q * (F + 1);
      for (int64_t f = 0; f < F; ++f) {
        const int64_t nb =
            f_ids[f] == 0 ? cap : std::clamp<int64_t>(ids * f_bags[f] / f_ids[f], 1, cap);
        for (int64_t j = fb[f]; j < fb[f + 1]; j += nb) {
          starts[q].push_back(j);
          feats[q].push_back(static_cast<int32_t>(f));
          t.max_tile_bags = std::max(t.max_tile_bags, std::min(nb, fb[f + 1] - j));
        }
      }
      most = std::max<int64_t>(most, static_cast<int64_t>(starts[q].size()));
    }
    return most;
  };
  const int64_t cap = bag_cap(kPartTileBags), wide_cap = bag_cap(kPartMaxTileBags);
  t.tiles_per_rank = tile(want, cap);
  if (tile_ids <= 0 && max_tiles > 0 && R * t.tiles_per_rank > max_tiles) {
    // Larger tiles, up to kPartTileIds ids, until the grid fits max_tiles (every tile resident
    // at once: one launch instead of two). Tiles then spill into partly filled chunks, which
    // the one launch pays for; without a fitting tiling, the first one stays. Past one chunk a
    // tile, tiles of short bags take up to kPartMaxTileBags bags: fewer of them leave more of
    // the grid to the long-bag features, whose tiles, the largest, set the launch's length.
    bool fits = false;
    for (int64_t ids = std::max(want + 1, (n + max_tiles - 1) / max_tiles); ids <= kPartTileIds;
         ids += ids / 16 + 1) {
      t.tiles_per_rank = tile(ids, ids > kChunk ? wide_cap : cap);
      if (R * t.tiles_per_rank <= max_tiles) {
        fits = true;
        break;
      }
    }
    if (!fits) t.tiles_per_rank = tile(want, cap);
  }
  // The table: each rank's starts, padded with its bag count (empty tiles); and each tile's
  // first id, so that no tile waits on the tiles before it for its place in the ids (the
  // kernels would otherwise chain a look-back over every earlier tile).
  const int64_t T = t.tiles_per_rank;
  t.tile_j0.reserve(static_cast<size_t>(R * (T + 1)));
  t.tile_id0.reserve(static_cast<size_t>(R * T));
  t.tile_feat.reserve(static_cast<size_t>(R * T));
  int64_t id = 0;  // global index of bag j's first id, j walking the batch's bags in order
  for (int64_t q = 0; q < R; ++q) {
    const int64_t bags = rank_bag_off[q + 1] - rank_bag_off[q];
    t.tile_j0.insert(t.tile_j0.end(), starts[q].begin(), starts[q].end());
    t.tile_j0.insert(t.tile_j0.end(), static_cast<size_t>(T + 1) - starts[q].size(), bags);
    t.tile_feat.insert(t.tile_feat.end(), feats[q].begin(), feats[q].end());
    t.tile_feat.insert(t.tile_feat.end(), static_cast<size_t>(T) - feats[q].size(), 0);
    const int64_t* tj = t.tile_j0.data() + q * (T + 1);
    for (int64_t kt = 0; kt < T; ++kt) {
      t.tile_id0.push_back(id);
      const int64_t id0 = id;
      for (int64_t j = rank_bag_off[q] + tj[kt]; j < rank_bag_off[q] + tj[kt + 1]; ++j)
        id += lengths[j];
      t.max_tile_ids = std::max(t.max_tile_ids, id - id0);
    }
  }
  return t;
}

}  // namespace dynemb::cuda
