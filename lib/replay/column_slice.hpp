// A replay over slices of the embedding columns, so that its memory is bounded.
//
// When the lookups are derived from the embedding source rather than captured, every rank's
// output gathers rows from the lookups of all W ranks, so a whole batch needs all W lookup
// outputs at once (W x [N_local, D] floats). Both output dists act on each embedding column on
// its own: the sequence dist moves whole rows (a column of the output is the same permutation
// of the same column of the lookups) and the pooled reduce-scatter sums element by element;
// the lookup, the codec and the unsharded reference are per column too. So the batch can run
// over slices [c0, c1) of the columns, each with a plan whose tables are only those columns
// wide and an embedding source that yields those columns of each row, and the slices' diffs
// merged (replay/diff.hpp) give exactly the whole batch's diff.
//
// Columns are those of the whole output: sequence [N, D] (c in [0, D)), pooled [B, sum_D]
// (c in [0, sum_D), feature f owning [column_offset_f, column_offset_f + D_f)). A pooled slice
// may hold only part of a feature, or none of it (that feature then has D_f = 0 in the slice).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/embedding_source.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// Columns of the whole output: D (sequence) or sum_D (pooled).
int64_t embedding_columns(const Plan& plan);

struct ColumnSlice {
  int64_t c0 = 0, c1 = 0;  // [c0, c1) of embedding_columns(whole)
  // The whole plan restricted to the slice. Pooled: one table per feature (a table's features
  // may hold different columns of its rows), named and sharded as the feature's own table.
  Plan plan;
  // Feature f's columns in the slice are columns [col0[f], col0[f] + plan.features[f].dim)
  // of its table's rows.
  std::vector<int64_t> col0;
  // Rows of the slice's tables: those columns of the whole source's rows. No oracle seed (a
  // slice's rows are not whole oracle rows); its table_rows give the whole table's oracle seed or
  // dense weights with the slice's first column, from which a device backend may make them.
  std::shared_ptr<const EmbeddingSource> source;
};

ColumnSlice make_column_slice(const Plan& whole, std::shared_ptr<const EmbeddingSource> source,
                              int64_t c0, int64_t c1);

// Where the elements of rank r's output slice (or of its reference's) lie in the whole output:
// runs of rows that are each `width` contiguous elements of the slice and start at column
// `col0` of a row `stride` elements long in the whole tensor. 2-D outputs are one run;
// a pooled VBE output 1-D [f][b][d] has one run per feature.
struct SliceLayout {
  struct Run {
    int64_t slice_begin = 0, rows = 0, width = 0;
    int64_t whole_begin = 0, stride = 0, col0 = 0;
  };
  std::vector<Run> runs;
  std::vector<int64_t> whole_shape;  // the whole output's shape
  int64_t slice_numel = 0;
  // Flat index in the slice -> flat index in the whole tensor (row-major both).
  int64_t to_whole(int64_t e) const;
  // The slice's elements of `whole` (whole_shape) into `slice` (slice_numel).
  void gather(const float* whole, float* slice) const;
};

// The layout of an output (or reference) slice `t` of rank r, whose own KJT is `kjt`: 2-D
// [rows, c1 - c0] -> [rows, columns]; pooled VBE 1-D -> per feature B_{r,f} bags of D_f.
// Throws Error when `t` does not have the elements that layout implies.
SliceLayout output_slice_layout(const Plan& whole, const ColumnSlice& s, const EmbTensor& t,
                                const Kjt& kjt);

}  // namespace dynemb
