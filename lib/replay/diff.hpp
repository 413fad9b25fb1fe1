// Element-wise diff of two float tensors under a Tolerance: counts every mismatch, keeps
// the first `max_report` with coordinates, and the max absolute / relative error.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend.hpp"
#include "engine/tile_diff.hpp"
#include "engine/tolerance.hpp"
#include "model/types.hpp"
#include "replay/coords.hpp"

namespace dynemb {

struct ElementMismatch {
  int64_t flat = 0;  // row-major element index
  Coords where;
  float got = 0, want = 0;
};

struct TensorDiff {
  bool shape_ok = true;
  std::string shape_note;  // "shape [3, 2] vs [4, 2]" when !shape_ok
  int64_t compared = 0;    // elements compared
  int64_t mismatches = 0;  // elements the tolerance rejects (all of them, not only reported)
  // Over all compared pairs where neither side is NaN: max |got - want|, and
  // max |got - want| / |want| over those with want != 0. 0 when all equal.
  double max_abs_err = 0;
  double max_rel_err = 0;
  int64_t max_ulp = 0;                 // max float32 ulp distance over finite pairs
  std::vector<ElementMismatch> first;  // the first max_report mismatches, in flat order
  bool ok() const { return shape_ok && mismatches == 0; }
};

std::string shape_str(const std::vector<int64_t>& shape);

// `got` and `want` must have the same shape, else shape_ok = false and nothing is compared.
TensorDiff diff_tensors(const EmbTensor& got, const EmbTensor& want, const Tolerance& tol,
                        const TensorLayout& layout, int64_t max_report);

// What diff_tensors says of two tensors of different shapes.
TensorDiff shape_mismatch(const std::vector<int64_t>& got, const std::vector<int64_t>& want);

// Diffs of parts of one tensor pair (replay/column_slice.hpp), merged into the diff of the
// whole: diff_part compares a part, `to_whole` mapping its flat indices to the whole tensor's
// (increasing: the part's row-major order is the whole's), and keeps its first max_report
// mismatches with whole indices and no coordinates yet. merge_diff adds a part: counts add up,
// maxima are maxima, and the mismatches kept are the first max_report of both in whole order,
// whatever order the parts come in (the whole diff's first max_report are each among the first
// max_report of their own part). locate_mismatches then gives them their coordinates.
TensorDiff diff_part(const EmbTensor& got, const EmbTensor& want, const Tolerance& tol,
                     const std::function<int64_t(int64_t)>& to_whole, int64_t max_report);
// The same of `n` elements at `got` and `want` (parts of larger buffers, same shape).
TensorDiff diff_part(const float* got, const float* want, int64_t n, const Tolerance& tol,
                     const std::function<int64_t(int64_t)>& to_whole, int64_t max_report);
void merge_diff(TensorDiff& into, TensorDiff&& part, int64_t max_report);
// The diff of a pair of n elements from the tiles a backend compared (its Comparator,
// engine/backend.hpp; engine/tile_diff.hpp): tiles that add nothing are not there, the others
// bring their statistics and, up to the first max_report mismatches, both sides' values. The
// same diff as diff_part over the whole pair.
TensorDiff diff_tiles(int64_t n, const std::vector<TileDiff>& tiles, const Tolerance& tol,
                      const std::function<int64_t(int64_t)>& to_whole, int64_t max_report);
void locate_mismatches(TensorDiff& d, const TensorLayout& layout);

}  // namespace dynemb
