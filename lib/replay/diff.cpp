#include "replay/diff.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <iterator>

#include "common/parallel.hpp"

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

// A diff's counts and maxima from the statistics of its pairs.
void set_stats(TensorDiff& d, const TileStats& s) {
  d.mismatches = s.mismatches;
  d.max_abs_err = s.max_abs_err;
  d.max_rel_err = s.max_rel_err;
  d.max_ulp = s.max_ulp;
}

// The diff of elements [i0, i1) of two tensors of one shape; a mismatch kept is recorded by
// `keep(i, got, want)`.
template <typename Keep>
TensorDiff diff_range(const float* gp, const float* wp, const Tolerance& tol, int64_t max_report,
                      const Keep& keep, int64_t i0, int64_t i1) {
  TensorDiff d;
  d.compared = i1 - i0;
  TileStats s;
  each_unequal_pair(gp, wp, i0, i1, [&](int64_t i) {
    if (!add_pair(s, gp[i], wp[i], tol) && int64_t(d.first.size()) < max_report)
      d.first.push_back(keep(i, gp[i], wp[i]));
  });
  set_stats(d, s);
  return d;
}

// The diff of two tensors of one shape, in contiguous parts on every core (a pass over a
// batch's lookups is gigabytes), merged in order: the same diff as one pass, first mismatches
// included (keep's flat indices increase with i).
template <typename Keep>
TensorDiff diff_elements(const float* got, const float* want, int64_t n, const Tolerance& tol,
                         int64_t max_report, const Keep& keep) {
  constexpr int64_t kPart = int64_t(1) << 20;  // elements: a part is worth a thread
  const int64_t parts = std::clamp<int64_t>(n / kPart, 1, hardware_threads());
  std::vector<TensorDiff> part(static_cast<size_t>(parts));
  parallel_for(
      int(parts), parts,
      [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
          part[size_t(p)] =
              diff_range(got, want, tol, max_report, keep, n * p / parts, n * (p + 1) / parts);
      },
      /*grain=*/1);
  TensorDiff d = std::move(part[0]);
  for (int64_t p = 1; p < parts; ++p) merge_diff(d, std::move(part[size_t(p)]), max_report);
  return d;
}

bool same_shape(const EmbTensor& got, const EmbTensor& want) {
  return got.shape == want.shape && got.data.size() == want.data.size();
}

}  // namespace

TensorDiff diff_tensors(const EmbTensor& got, const EmbTensor& want, const Tolerance& tol,
                        const TensorLayout& layout, int64_t max_report) {
  if (!same_shape(got, want)) return shape_mismatch(got.shape, want.shape);
  return diff_elements(got.data.data(), want.data.data(), int64_t(got.data.size()), tol, max_report,
                       [&](int64_t i, float g, float w) {
                         return ElementMismatch{i, layout(i), g, w};
                       });
}

TensorDiff diff_part(const EmbTensor& got, const EmbTensor& want, const Tolerance& tol,
                     const std::function<int64_t(int64_t)>& to_whole, int64_t max_report) {
  if (!same_shape(got, want)) return shape_mismatch(got.shape, want.shape);
  return diff_part(got.data.data(), want.data.data(), int64_t(got.data.size()), tol, to_whole,
                   max_report);
}

TensorDiff diff_part(const float* got, const float* want, int64_t n, const Tolerance& tol,
                     const std::function<int64_t(int64_t)>& to_whole, int64_t max_report) {
  return diff_elements(got, want, n, tol, max_report, [&](int64_t i, float g, float w) {
    return ElementMismatch{to_whole(i), {}, g, w};
  });
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
      part.first = diff_part(
                       t.got.data(), t.want.data(), int64_t(t.got.size()), tol,
                       [&](int64_t e) { return to_whole(t.begin + e); }, max_report)
                       .first;
    merge_diff(d, std::move(part), max_report);
  }
  d.compared = n;
  return d;
}

void locate_mismatches(TensorDiff& d, const TensorLayout& layout) {
  for (ElementMismatch& m : d.first) m.where = layout(m.flat);
}

}  // namespace dynemb
