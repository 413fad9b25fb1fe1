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

}  // namespace dynemb
