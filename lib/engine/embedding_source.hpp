// Where embedding rows come from: the hash64 oracle of capture-format.md, or dense weights
// (/tables/<name>/weight). Rows are addressed by the *unsharded* row g: the global row of a
// continuous table, or the raw key of a (hash_)roundrobin table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/dtype.hpp"
#include "engine/parallel.hpp"
#include "plan/plan.hpp"

namespace dynemb {

class EmbeddingSource {
 public:
  virtual ~EmbeddingSource() = default;
  // Writes row g of table t (plan order) into out[0..dim), values exact in the table dtype.
  virtual void row(int table, uint64_t g, float* out, int64_t dim) const = 0;
  // Columns [c0, c0 + n) of that row into out[0..n): what row() writes there for a dim of at
  // least c0 + n (a row's columns never depend on the dim asked for). Lets a replay work on a
  // slice of the columns without producing whole rows (replay/column_slice.hpp).
  virtual void row_columns(int table, uint64_t g, int64_t c0, int64_t n, float* out) const;
  // The oracle seed when rows come from the hash64 oracle for *every* table (lets GPU
  // backends generate rows on the device); nullopt otherwise.
  virtual std::optional<uint64_t> oracle_seed() const { return std::nullopt; }
};

class OracleSource final : public EmbeddingSource {
 public:
  explicit OracleSource(uint64_t seed, const Plan& plan);
  void row(int table, uint64_t g, float* out, int64_t dim) const override;
  void row_columns(int table, uint64_t g, int64_t c0, int64_t n, float* out) const override;
  std::optional<uint64_t> oracle_seed() const override { return seed_; }

 private:
  uint64_t seed_;
  std::vector<uint64_t> table_seed_;  // [T] oracle_table_seed(seed, t)
};

// Dense weights for some tables ([num_embeddings, D] row-major each, already rounded to the
// table's data_type); tables without weights fall back to `fallback` (the oracle), or are an
// error when there is none.
class DenseSource final : public EmbeddingSource {
 public:
  DenseSource(const Plan& plan, std::vector<std::optional<std::vector<float>>> weights,
              std::shared_ptr<const EmbeddingSource> fallback);
  void row(int table, uint64_t g, float* out, int64_t dim) const override;
  void row_columns(int table, uint64_t g, int64_t c0, int64_t n, float* out) const override;

 private:
  std::vector<int64_t> rows_, dims_;
  std::vector<std::optional<std::vector<float>>> weights_;
  std::shared_ptr<const EmbeddingSource> fallback_;
};

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

}  // namespace dynemb
