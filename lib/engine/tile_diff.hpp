// A comparison of two float tensors of one shape (n elements each, `got` against `want`) made in
// tiles where the tensors are, so that only what a diff needs travels: per tile what its pairs
// add to the diff under a Tolerance, and both sides' values of the few tiles that hold the first
// mismatches. A device backend makes it on the device (its Comparator,
// backend.hpp); tile_diffs() below is the host's, the CPU backend's and every
// fallback's. replay/diff.hpp turns the tiles into the diff of the whole pair.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/tolerance.hpp"

namespace dynemb {

// How the tiles are cut and how much of them comes back.
struct TileCompare {
  Tolerance tol;
  int64_t tile = int64_t(1) << 16;  // elements per tile (the last one may be shorter)
  int64_t max_report = 0;           // mismatches whose values the diff reports
};

// What a tile's pairs add to a diff (TensorDiff in replay/diff.hpp defines each field).
struct TileStats {
  int64_t mismatches = 0;  // pairs the tolerance rejects
  double max_abs_err = 0;  // over pairs where neither side is NaN and the error is finite
  double max_rel_err = 0;  // the same over those with want != 0
  int64_t max_ulp = 0;     // the same in float32 ulps
  bool adds_nothing() const {
    return mismatches == 0 && max_abs_err == 0 && max_rel_err == 0 && max_ulp == 0;
  }
};

// fn(i) for the pairs i of [i0, i1) that may add something to a diff: blocks of pairs equal as
// bytes are skipped at memcmp speed (a pair with the same bits has no error, and every tolerance
// accepts it, NaN matching NaN), so a passing check costs one pass over memory, not the
// per-element arithmetic.
template <class Fn>
void each_unequal_pair(const float* got, const float* want, int64_t i0, int64_t i1, Fn&& fn) {
  constexpr int64_t kBlock = 2048;
  for (int64_t b0 = i0; b0 < i1; b0 += kBlock) {
    const int64_t b1 = b0 + kBlock < i1 ? b0 + kBlock : i1;
    if (std::memcmp(got + b0, want + b0, sizeof(float) * size_t(b1 - b0)) == 0) continue;
    for (int64_t i = b0; i < b1; ++i) fn(i);
  }
}

// One pair's share of a diff, added to `s`; returns whether the tolerance accepts it. The one
// definition: the device kernel (kernels/compare.cu) follows it operation for operation, in
// double precision with no contraction, so both sides give the same bits.
inline bool add_pair(TileStats& s, float got, float want, const Tolerance& tol) {
  if (!std::isnan(got) && !std::isnan(want)) {
    const double diff = std::fabs(double(got) - double(want));
    if (std::isfinite(diff)) {
      if (diff > s.max_abs_err) s.max_abs_err = diff;
      if (want != 0) {
        const double rel = diff / std::fabs(double(want));
        if (rel > s.max_rel_err) s.max_rel_err = rel;
      }
      const int64_t u = ulp_distance(got, want);
      if (u > s.max_ulp) s.max_ulp = u;
    }
  }
  if (tol.accepts(got, want)) return true;
  ++s.mismatches;
  return false;
}

// What n pairs add (each_unequal_pair).
TileStats pair_stats(const float* got, const float* want, int64_t n, const Tolerance& tol);

// A tile whose pairs add something to the diff.
struct TileDiff {
  int64_t begin = 0, end = 0;  // its elements [begin, end)
  TileStats stats;
  // Both sides' values over [begin, end) when the tile holds one of the diff's first max_report
  // mismatches (every tile up to the one where they are all found); else empty.
  std::vector<float> got, want;
};

// The tiles of `stats` ([tiles], in order) whose values a diff needs: those with mismatches,
// in order, until max_report mismatches are covered.
std::vector<int64_t> tiles_with_first(const std::vector<TileStats>& stats, int64_t max_report);

// The TileDiff of each tile of n elements whose `stats` add something, in order; those of
// tiles_with_first have their values sized, for the caller to fill from wherever the tensors are.
std::vector<TileDiff> tiles_from_stats(const std::vector<TileStats>& stats, int64_t n,
                                       const TileCompare& how);

// The tiles of got and want (n floats each, host memory) that add something, in order, on
// every core: what a backend returns for its comparisons.
std::vector<TileDiff> tile_diffs(const float* got, const float* want, int64_t n,
                                 const TileCompare& how);

}  // namespace dynemb
