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
  // Where table t's rows come from, for a device backend that makes lookups itself: column c of
  // row g is column col0 + c of row g of the table's dense weights (`weights`, rows of `stride`
  // floats, exact in the table dtype; a row past them is row()'s error), else of the hash64
  // oracle row of `oracle_table_seed` (oracle_table_seed(seed, t) of the source's table); neither:
  // only row() knows. col0 > 0 for a slice of the columns (replay/column_slice.hpp).
  // `weights_owner` is the uid() of the source that owns `weights`: while it lives they are
  // the same memory with the same values (a device may keep its copy).
  struct TableRows {
    const std::vector<float>* weights = nullptr;
    uint64_t weights_owner = 0;
    int64_t stride = 0;
    std::optional<uint64_t> oracle_table_seed;
    int64_t col0 = 0;
  };
  virtual TableRows table_rows(int table) const;
  // Tells sources apart for the whole run (a device backend keeps a source's dense tables
  // uploaded under it): never the same for two sources, whatever their addresses.
  uint64_t uid() const { return uid_; }

 protected:
  EmbeddingSource();

 private:
  uint64_t uid_;
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
  TableRows table_rows(int table) const override;

 private:
  std::vector<int64_t> rows_, dims_;
  std::vector<std::optional<std::vector<float>>> weights_;
  std::shared_ptr<const EmbeddingSource> fallback_;
};

}  // namespace dynemb
