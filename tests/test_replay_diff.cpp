// diff_tensors against a plain element-by-element reference, over random tensors with a few
// differences, NaNs, signed zeros and infinities, under each kind of tolerance.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "replay/diff.hpp"

using namespace dynemb;

namespace {

// The definition: every pair, in flat order.
TensorDiff reference_diff(const EmbTensor& got, const EmbTensor& want, const Tolerance& tol,
                          int64_t max_report) {
  TensorDiff d;
  d.compared = got.numel();
  for (int64_t i = 0; i < d.compared; ++i) {
    const float g = got.data[size_t(i)], w = want.data[size_t(i)];
    if (!std::isnan(g) && !std::isnan(w)) {
      const double diff = std::fabs(double(g) - double(w));
      if (std::isfinite(diff)) {
        d.max_abs_err = std::max(d.max_abs_err, diff);
        if (w != 0) d.max_rel_err = std::max(d.max_rel_err, diff / std::fabs(double(w)));
        d.max_ulp = std::max(d.max_ulp, ulp_distance(g, w));
      }
    }
    if (tol.accepts(g, w)) continue;
    ++d.mismatches;
    if (int64_t(d.first.size()) < max_report) d.first.push_back({i, {}, g, w});
  }
  return d;
}

// Every figure of `got` is the definition's, and so are its first mismatches.
void check_same(const TensorDiff& got, const TensorDiff& want) {
  CHECK(got.compared == want.compared);
  CHECK(got.mismatches == want.mismatches);
  CHECK(got.max_abs_err == want.max_abs_err);
  CHECK(got.max_rel_err == want.max_rel_err);
  CHECK(got.max_ulp == want.max_ulp);
  REQUIRE(got.first.size() == want.first.size());
  for (size_t k = 0; k < got.first.size(); ++k) CHECK(got.first[k].flat == want.first[k].flat);
}

const Tolerance kTolerances[] = {Tolerance::exact(), Tolerance::ulp(2), Tolerance::rel(1e-3, 1e-5)};

// A random pair of up to 9,000 elements, b = a with up to 12 changes: an ulp, a larger step, a
// special value (signed zeros, infinities, NaN, a tiny one) on one side or on both.
void random_pair(std::mt19937_64& rng, EmbTensor& a, EmbTensor& b) {
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            1e-30f};
  const int64_t n = std::uniform_int_distribution<int64_t>(0, 9000)(rng);
  a = EmbTensor::zeros(DType::f32, {n});
  for (float& x : a.data) x = std::uniform_real_distribution<float>(-4, 4)(rng);
  b = a;
  const int changes = std::uniform_int_distribution<int>(0, 12)(rng);
  for (int c = 0; c < changes && n > 0; ++c) {
    const size_t i = size_t(std::uniform_int_distribution<int64_t>(0, n - 1)(rng));
    switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
      case 0:
        b.data[i] = std::nextafter(b.data[i], 10.0f);  // one ulp
        break;
      case 1:
        b.data[i] += 0.25f;
        break;
      case 2:
        b.data[i] = specials[std::uniform_int_distribution<int>(0, 5)(rng)];
        break;
      default:  // the same special value on both sides
        a.data[i] = b.data[i] = specials[std::uniform_int_distribution<int>(0, 5)(rng)];
    }
  }
}

bool same_bits(float x, float y) {
  return std::memcmp(&x, &y, sizeof x) == 0;
}

}  // namespace

TEST_CASE("diff_tensors equals the element-by-element definition") {
  std::mt19937_64 rng(7);
  int64_t cases_with_mismatches = 0;
  for (int iter = 0; iter < 200; ++iter) {
    EmbTensor a, b;
    random_pair(rng, a, b);
    for (const Tolerance& tol : kTolerances) {
      CAPTURE(iter);
      CAPTURE(tol.str());
      const TensorDiff want = reference_diff(a, b, tol, 5);
      check_same(diff_tensors(a, b, tol, TensorLayout::flat("x"), 5), want);
      cases_with_mismatches += want.mismatches > 0;
    }
  }
  CHECK(cases_with_mismatches > 100);  // the comparison saw real differences
}

// Tensors of millions of elements are diffed in parts on every core: the same diff as the
// definition, with differences in every part, across part edges, and more than max_report.
TEST_CASE("diff_tensors of large tensors, diffed in parts, equals the definition") {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 4; ++iter) {
    const int64_t n = (int64_t(1) << 22) + std::uniform_int_distribution<int64_t>(0, 99999)(rng);
    EmbTensor a = EmbTensor::zeros(DType::f32, {n});
    for (size_t i = 0; i < a.data.size(); i += 97) a.data[i] = float(i % 1000) / 7.0f;
    EmbTensor b = a;
    const int changes = iter == 0 ? 0 : 40 * iter;
    for (int c = 0; c < changes; ++c) {
      const size_t i = size_t(std::uniform_int_distribution<int64_t>(0, n - 1)(rng));
      b.data[i] += c % 3 == 0 ? 1.0f : 1e-3f;
    }
    if (iter == 3)  // around where the parts meet, whatever the number of cores
      for (int64_t q = 1; q < 16; ++q) b.data[size_t(n * q / 16)] += 2.0f;
    for (const Tolerance& tol : {Tolerance::exact(), Tolerance::rel(1e-2, 1e-5)}) {
      for (int64_t maxm : {0, 3, 1000}) {
        CAPTURE(iter);
        CAPTURE(maxm);
        check_same(diff_tensors(a, b, tol, TensorLayout::flat("x"), maxm),
                   reference_diff(a, b, tol, maxm));
      }
    }
  }
}

// Column slices of a [rows, cols] pair diffed part by part and merged (in an order other than
// the columns') give the whole diff: counts, maxima and the first mismatches, whose rows lie in
// slices later than other mismatches' (a later slice may hold an earlier row).
TEST_CASE("merge_diff of column slices equals the whole diff") {
  std::mt19937_64 rng(11);
  const Tolerance tol = Tolerance::exact();
  for (int iter = 0; iter < 100; ++iter) {
    const int64_t rows = std::uniform_int_distribution<int64_t>(0, 40)(rng);
    const int64_t cols = std::uniform_int_distribution<int64_t>(1, 17)(rng);
    const int64_t width = std::uniform_int_distribution<int64_t>(1, cols)(rng);
    const int64_t max_report = std::uniform_int_distribution<int64_t>(0, 6)(rng);
    EmbTensor a = EmbTensor::zeros(DType::f32, {rows, cols});
    for (float& x : a.data) x = std::uniform_real_distribution<float>(-4, 4)(rng);
    EmbTensor b = a;
    const int changes = std::uniform_int_distribution<int>(0, 15)(rng);
    for (int c = 0; c < changes && rows > 0; ++c)
      b.data[size_t(std::uniform_int_distribution<int64_t>(0, rows * cols - 1)(rng))] += 0.5f;
    const TensorDiff whole = diff_tensors(a, b, tol, TensorLayout::matrix("x", cols), max_report);
    std::vector<int64_t> starts;
    for (int64_t c0 = 0; c0 < cols; c0 += width) starts.push_back(c0);
    std::shuffle(starts.begin(), starts.end(), rng);
    TensorDiff merged;
    for (const int64_t c0 : starts) {
      const int64_t w = std::min(cols, c0 + width) - c0;
      EmbTensor pa = EmbTensor::zeros(DType::f32, {rows, w}), pb = pa;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t c = 0; c < w; ++c) {
          pa.data[size_t(i * w + c)] = a.data[size_t(i * cols + c0 + c)];
          pb.data[size_t(i * w + c)] = b.data[size_t(i * cols + c0 + c)];
        }
      const auto to_whole = [&](int64_t e) { return (e / w) * cols + c0 + e % w; };
      merge_diff(merged, diff_part(pa, pb, tol, to_whole, max_report), max_report);
    }
    locate_mismatches(merged, TensorLayout::matrix("x", cols));
    CAPTURE(iter);
    CHECK(merged.compared == whole.compared);
    CHECK(merged.mismatches == whole.mismatches);
    CHECK(merged.max_abs_err == whole.max_abs_err);
    CHECK(merged.max_rel_err == whole.max_rel_err);
    REQUIRE(merged.first.size() == whole.first.size());
    for (size_t k = 0; k < whole.first.size(); ++k) {
      CHECK(merged.first[k].flat == whole.first[k].flat);
      CHECK(to_string(merged.first[k].where) == to_string(whole.first[k].where));
    }
  }
}

// A check from the tiles a backend compared (Comparator::compare_lookup and the others): the
// tiles listed are exactly those whose pairs add something, each with its own statistics, and
// both sides' values exactly on the tiles up to the first max_report mismatches; the diff made
// from them alone is the definition's, whatever the tile size.
TEST_CASE("tile_diffs and diff_tiles: the whole diff from the tiles that add to it") {
  std::mt19937_64 rng(13);
  int64_t tiles_seen = 0, with_values = 0;
  for (int iter = 0; iter < 200; ++iter) {
    EmbTensor got, want;  // e.g. the captured lookup and the derived one
    random_pair(rng, got, want);
    const int64_t n = got.numel();
    for (const int64_t tile : {int64_t(1), int64_t(3), int64_t(64), int64_t(1000), n + 5})
      for (const Tolerance& tol : kTolerances)
        for (const int64_t maxm : {0, 2, 50}) {
          CAPTURE(iter);
          CAPTURE(tile);
          CAPTURE(maxm);
          const TileCompare how{tol, tile, maxm};
          const std::vector<TileDiff> tiles = tile_diffs(got.data.data(), want.data.data(), n, how);
          std::vector<int> listed(size_t((n + tile - 1) / tile), 0);
          int64_t end_before = -1, mismatches_before = 0;
          for (const TileDiff& t : tiles) {
            REQUIRE(t.begin % tile == 0);
            CHECK(t.end == std::min(n, t.begin + tile));
            CHECK(t.begin >= end_before);  // in order
            end_before = t.end;
            listed[size_t(t.begin / tile)] = 1;
            const TileStats s = pair_stats(got.data.data() + t.begin, want.data.data() + t.begin,
                                           t.end - t.begin, tol);
            CHECK_FALSE(s.adds_nothing());
            CHECK(t.stats.mismatches == s.mismatches);
            CHECK(t.stats.max_abs_err == s.max_abs_err);
            CHECK(t.stats.max_rel_err == s.max_rel_err);
            CHECK(t.stats.max_ulp == s.max_ulp);
            // Values exactly where a first mismatch may be: a tile with mismatches while fewer
            // than maxm were found before it.
            const bool needed = s.mismatches > 0 && mismatches_before < maxm;
            mismatches_before += s.mismatches;
            CHECK(t.got.empty() == !needed);
            if (t.got.empty()) continue;
            ++with_values;
            REQUIRE(int64_t(t.got.size()) == t.end - t.begin);
            REQUIRE(int64_t(t.want.size()) == t.end - t.begin);
            for (int64_t e = t.begin; e < t.end; ++e) {
              CHECK(same_bits(t.got[size_t(e - t.begin)], got.data[size_t(e)]));
              CHECK(same_bits(t.want[size_t(e - t.begin)], want.data[size_t(e)]));
            }
          }
          for (size_t i = 0; i < listed.size(); ++i) {
            if (listed[i]) continue;
            const int64_t e0 = int64_t(i) * tile, len = std::min(n, e0 + tile) - e0;
            CHECK(pair_stats(got.data.data() + e0, want.data.data() + e0, len, tol).adds_nothing());
          }
          tiles_seen += int64_t(tiles.size());
          check_same(diff_tiles(
                         n, tiles, tol, [](int64_t e) { return e; }, maxm),
                     reference_diff(got, want, tol, maxm));
        }
  }
  CHECK(tiles_seen > 500);  // the tiles met real differences
  CHECK(with_values > 100);
}
