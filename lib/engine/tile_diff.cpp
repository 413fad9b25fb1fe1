#include "engine/tile_diff.hpp"

#include <algorithm>

#include "common/parallel.hpp"

namespace dynemb {

TileStats pair_stats(const float* got, const float* want, int64_t n, const Tolerance& tol) {
  TileStats s;
  each_unequal_pair(got, want, 0, n, [&](int64_t i) { add_pair(s, got[i], want[i], tol); });
  return s;
}

std::vector<int64_t> tiles_with_first(const std::vector<TileStats>& stats, int64_t max_report) {
  std::vector<int64_t> out;
  int64_t covered = 0;
  for (size_t t = 0; t < stats.size() && covered < max_report; ++t) {
    if (stats[t].mismatches == 0) continue;
    out.push_back(int64_t(t));
    covered += stats[t].mismatches;
  }
  return out;
}

std::vector<TileDiff> tiles_from_stats(const std::vector<TileStats>& stats, int64_t n,
                                       const TileCompare& how) {
  const int64_t tile = std::max<int64_t>(1, how.tile);
  const std::vector<int64_t> first = tiles_with_first(stats, how.max_report);
  std::vector<TileDiff> out;
  size_t next_first = 0;
  for (int64_t t = 0; t < int64_t(stats.size()); ++t) {
    if (stats[size_t(t)].adds_nothing()) continue;
    TileDiff d;
    d.begin = t * tile;
    d.end = std::min(n, d.begin + tile);
    d.stats = stats[size_t(t)];
    if (next_first < first.size() && first[next_first] == t) {
      d.got.resize(size_t(d.end - d.begin));
      d.want.resize(d.got.size());
      ++next_first;
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<TileDiff> tile_diffs(const float* got, const float* want, int64_t n,
                                 const TileCompare& how) {
  const int64_t tile = std::max<int64_t>(1, how.tile);
  const int64_t tiles = (n + tile - 1) / tile;
  std::vector<TileStats> stats(static_cast<size_t>(tiles));
  parallel_for(
      hardware_threads(), tiles,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t e0 = t * tile, len = std::min(n, e0 + tile) - e0;
          stats[size_t(t)] = pair_stats(got + e0, want + e0, len, how.tol);
        }
      },
      /*grain=*/16);
  std::vector<TileDiff> out = tiles_from_stats(stats, n, how);
  for (TileDiff& d : out) {
    std::copy(got + d.begin, got + d.begin + int64_t(d.got.size()), d.got.begin());
    std::copy(want + d.begin, want + d.begin + int64_t(d.want.size()), d.want.begin());
  }
  return out;
}

}  // namespace dynemb
