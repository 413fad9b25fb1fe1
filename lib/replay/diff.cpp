#include "replay/diff.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <iterator>

namespace dynemb {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

TensorDiff shape_mismatch(const std::vector<int64_t>& got, const std::vector<int64_t>& want) {
  TensorDiff d;
  d.shape_ok = false;
  d.shape_note = fmt::format("shape {} vs {}", shape_str(got), shape_str(want));
  return d;
}

namespace {

bool same_shape(const EmbTensor& got, const EmbTensor& want) {
  return got.shape == want.shape && got.data.size() == want.data.size();
}

// Tiles of the elements at the first mismatches: both sides' values come back, as a backend's.
constexpr int64_t kHostTile = int64_t(1) << 16;

// A diff's counts and maxima from the statistics of its pairs.
void set_stats(TensorDiff& d, const TileStats& s) {
  d.mismatches = s.mismatches;
  d.max_abs_err = s.max_abs_err;
  d.max_rel_err = s.max_rel_err;
  d.max_ulp = s.max_ulp;
}

// The first max_report mismatches among the values a tile brought back (its n pairs), with
// their whole indices.
std::vector<ElementMismatch> first_in_tile(const TileDiff& t, const Tolerance& tol,
                                           const std::function<int64_t(int64_t)>& to_whole,
                                           int64_t max_report) {
  std::vector<ElementMismatch> first;
  TileStats unused;
  each_unequal_pair(t.got.data(), t.want.data(), 0, int64_t(t.got.size()), [&](int64_t i) {
    if (!add_pair(unused, t.got[size_t(i)], t.want[size_t(i)], tol) &&
        int64_t(first.size()) < max_report)
      first.push_back(
          ElementMismatch{to_whole(t.begin + i), {}, t.got[size_t(i)], t.want[size_t(i)]});
  });
  return first;
}

}  // namespace

// One comparison on the host, tile_diffs (engine/tile_diff.hpp), whoever asks: the diff of a
// pair is what its tiles say.
TensorDiff diff_part(const float* got, const float* want, int64_t n, const Tolerance& tol,
                     const std::function<int64_t(int64_t)>& to_whole, int64_t max_report) {
  const std::vector<TileDiff> tiles =
      tile_diffs(got, want, n, TileCompare{tol, kHostTile, max_report});
  return diff_tiles(n, tiles, tol, to_whole, max_report);
}

TensorDiff diff_tensors(const EmbTensor& got, const EmbTensor& want, const Tolerance& tol,
                        const TensorLayout& layout, int64_t max_report) {
  if (!same_shape(got, want)) return shape_mismatch(got.shape, want.shape);
  TensorDiff d = diff_part(
      got.data.data(), want.data.data(), int64_t(got.data.size()), tol, [](int64_t e) { return e; },
      max_report);
  locate_mismatches(d, layout);
  return d;
}

TensorDiff diff_part(const EmbTensor& got, const EmbTensor& want, const Tolerance& tol,
                     const std::function<int64_t(int64_t)>& to_whole, int64_t max_report) {
  if (!same_shape(got, want)) return shape_mismatch(got.shape, want.shape);
  return diff_part(got.data.data(), want.data.data(), int64_t(got.data.size()), tol, to_whole,
                   max_report);
}

void merge_diff(TensorDiff& into, TensorDiff&& part, int64_t max_report) {
  if (!part.shape_ok) {
    into = std::move(part);
    return;
  }
  into.compared += part.compared;
  into.mismatches += part.mismatches;
  into.max_abs_err = std::max(into.max_abs_err, part.max_abs_err);
  into.max_rel_err = std::max(into.max_rel_err, part.max_rel_err);
  into.max_ulp = std::max(into.max_ulp, part.max_ulp);
  std::vector<ElementMismatch> first;
  first.reserve(into.first.size() + part.first.size());
  std::merge(std::make_move_iterator(into.first.begin()), std::make_move_iterator(into.first.end()),
             std::make_move_iterator(part.first.begin()), std::make_move_iterator(part.first.end()),
             std::back_inserter(first),
             [](const ElementMismatch& a, const ElementMismatch& b) { return a.flat < b.flat; });
  if (int64_t(first.size()) > max_report) first.resize(size_t(std::max<int64_t>(0, max_report)));
  into.first = std::move(first);
}

TensorDiff diff_tiles(int64_t n, const std::vector<TileDiff>& tiles, const Tolerance& tol,
                      const std::function<int64_t(int64_t)>& to_whole, int64_t max_report) {
  TensorDiff d;
  for (const TileDiff& t : tiles) {
    TensorDiff part;
    set_stats(part, t.stats);
    if (!t.got.empty())  // a tile of the first mismatches: they come from its values
      part.first = first_in_tile(t, tol, to_whole, max_report);
    merge_diff(d, std::move(part), max_report);
  }
  d.compared = n;
  return d;
}

void locate_mismatches(TensorDiff& d, const TensorLayout& layout) {
  for (ElementMismatch& m : d.first) m.where = layout(m.flat);
}

}  // namespace dynemb
