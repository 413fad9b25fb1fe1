// How the CPU makes a lookup-like tensor run by run from an EmbeddingSource: a rank's lookup
// (cpu_backend.cpp) and the unsharded reference of a KJT (reference.cpp) are the same walk over
// bags, with their own id -> row rule and their own output places. A run is what one bag makes:
// its ids' rows (sequence) or their pooled sum (pooled), handed to `emit` as made, so that a
// check can compare runs without the tensor ever being whole.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/dtype.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "engine/embedding_source.hpp"
#include "engine/ops.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// One pooled bag as TBE makes it: out[0..D) = the fp32 sum, in id order, of weight_i * row_i
// over the bag's ids i in [i0, i1) (each product rounded before it is added: no FMA), rounded
// once to `dt`. `row_of(i)` is id i's RowRef (an invalid one adds nothing); `weights` is null
// for an unweighted bag. `acc` and `row` are scratch of at least D floats (`out` may be
// `row`). A bag with no row (empty, or every id out of range) is zeros.
template <class RowOf>
void pool_bag(const EmbeddingSource& source, int table, int64_t D, DType dt, int64_t i0, int64_t i1,
              const float* weights, RowOf&& row_of, float* acc, float* row, float* out) {
  std::fill(acc, acc + D, 0.0f);
  for (int64_t i = i0; i < i1; ++i) {
    const auto ref = row_of(i);  // a RowRef (engine/ops.hpp)
    if (!ref.valid) continue;
    source.row(table, ref.g, row, D);
    if (weights) {
      const float w = weights[i];
      for (int64_t d = 0; d < D; ++d) acc[d] += w * row[d];
    } else {
      for (int64_t d = 0; d < D; ++d) acc[d] += row[d];
    }
  }
  // The dtype switch once per bag, not once per element: a lookup bag of a row-wise shard holds
  // an id or two, so this loop is as hot as the sum.
  if (dt == DType::f32) {
    std::copy(acc, acc + D, out);
  } else {
    for (int64_t d = 0; d < D; ++d) out[d] = round_to(dt, acc[d]);
  }
}

// A pooled output that is not VBE, [rows, sum_D], made a row at a time on every core: row r
// holds bag bag0[f] + r of each feature f at f's column offset, made by make_bag(f, j, out)
// into out[0..D_f); emit(row, r * sum_D, sum_D) then gets the whole row. Row by row, not bag
// by bag, so that whoever compares the runs with a tensor reads it front to back.
template <class MakeBag, class Emit>
void pool_rows(const Plan& plan, int64_t rows, const std::vector<int64_t>& bag0, MakeBag&& make_bag,
               Emit&& emit) {
  const int64_t F = plan.num_features(), sum_D = plan.sum_dim;
  parallel_for(
      hardware_threads(), rows,
      [&](int64_t r0, int64_t r1) {
        std::vector<float> row(static_cast<size_t>(sum_D), 0.0f);  // columns of no feature: 0
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t f = 0; f < F; ++f)
            make_bag(f, bag0[size_t(f)] + r, row.data() + plan.features[f].column_offset);
          emit(row.data(), r * sum_D, sum_D);
        }
      },
      /*grain=*/16);
}

// Every run of a lookup-like tensor from `source`: feature f's bags are [bag0[f], bag0[f + 1]),
// bag j's ids [off[j], off[j + 1]), and row_of(f, j, i) is id i's RowRef (it may throw the
// bounds_check=error error). Sequence: a row of D per id at i * D (zeros where its row is not
// looked up). Pooled: a bag's D_f sums (pool_bag) at dst(f, j); when `rows` >= 0 (not VBE: the
// tensor is [rows, sum_D]) made row by row (pool_rows), so that whoever compares the runs reads
// the tensor front to back. emit(values, at, count) is called on any thread. An error thrown is
// the first bad id in bag order: after one from the row-by-row walk the bags are walked again
// in order, `threads` at a time in chunks of at least `grain` bags. With `into` (the whole
// tensor, for a caller that makes it), the runs of that walk are made in place and not emitted:
// a sequence lookup is rows of a few columns, each copied once more otherwise.
template <class RowOf, class Dst, class Emit>
void bag_runs(const Plan& plan, const EmbeddingSource& source, const std::vector<int64_t>& bag0,
              const std::vector<int64_t>& off, const float* weights, int64_t rows, int threads,
              int64_t grain, RowOf&& row_of, Dst&& dst, Emit&& emit, float* into = nullptr) {
  const bool sequence = plan.module == ModuleKind::sequence;
  const DType dt = plan.data_type();
  int64_t maxD = sequence ? plan.seq_dim() : 1;
  for (const FeatureInfo& fi : plan.features) maxD = std::max(maxD, fi.dim);
  if (!sequence && rows >= 0) {
    try {
      pool_rows(
          plan, rows, bag0,
          [&](int64_t f, int64_t j, float* out) {
            thread_local std::vector<float> row, acc;
            row.resize(size_t(maxD));
            acc.resize(size_t(maxD));
            pool_bag(
                source, plan.features[f].table, plan.features[f].dim, dt, off[size_t(j)],
                off[size_t(j + 1)], weights, [&](int64_t i) { return row_of(f, j, i); }, acc.data(),
                row.data(), out);
          },
          emit);
      return;
    } catch (const Error&) {
      // The error to give is the first bad id in bag order: the walk below throws it.
    }
  }
  parallel_for(
      threads, bag0.back(),
      [&](int64_t j0, int64_t j1) {
        std::vector<float> row(static_cast<size_t>(maxD)), acc(static_cast<size_t>(maxD));
        each_bag(bag0, j0, j1, [&](int64_t f, int64_t j) {
          const int table = plan.features[f].table;
          const auto row_of_id = [&](int64_t i) { return row_of(f, j, i); };
          if (sequence) {  // every id its own row, an exact copy of the source row
            const int64_t D = plan.seq_dim();
            for (int64_t i = off[size_t(j)]; i < off[size_t(j + 1)]; ++i) {
              const auto ref = row_of_id(i);
              float* out = into ? into + i * D : row.data();
              if (ref.valid)
                source.row(table, ref.g, out, D);
              else
                std::fill(out, out + D, 0.0f);
              if (!into) emit(out, i * D, D);
            }
            return;
          }
          const int64_t D = plan.features[f].dim;
          float* out = into ? into + dst(f, j) : row.data();
          pool_bag(source, table, D, dt, off[size_t(j)], off[size_t(j + 1)], weights, row_of_id,
                   acc.data(), row.data(), out);
          if (!into) emit(out, dst(f, j), D);
        });
      },
      grain);
}

}  // namespace dynemb
