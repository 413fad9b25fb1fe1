// Column slices (replay/column_slice.hpp) and what a device backend makes their rows from
// (EmbeddingSource::table_rows): for random plans, sources (the oracle; dense weights for some
// tables with the oracle for the rest) and slices, column c of row g of every slice table, read
// the way a device reads it (the formula of cuda::DeviceRows: dense weights at
// g * stride + col0 + c, else the oracle at column col0 + c of the table's seed), is exactly
// what the slice's row() gives, which is those columns of the whole source's row.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/hash.hpp"
#include "engine/embedding_source.hpp"
#include "replay/column_slice.hpp"

using namespace dynemb;

namespace {

// Column c of row g of table t of `s` as a device reads it.
float device_value(const EmbeddingSource& s, int t, uint64_t g, int64_t c) {
  const EmbeddingSource::TableRows tr = s.table_rows(t);
  if (tr.weights) return (*tr.weights)[size_t(int64_t(g) * tr.stride + tr.col0 + c)];
  REQUIRE(tr.oracle_table_seed.has_value());
  return oracle_value(*tr.oracle_table_seed, g, uint64_t(tr.col0 + c));
}

Plan random_plan(std::mt19937_64& rng, bool sequence) {
  auto U = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Plan p;
  p.world_size = U(1, 4);
  p.module = sequence ? ModuleKind::sequence : ModuleKind::pooled;
  const int64_t D = U(1, 20);
  for (int64_t t = 0, T = U(1, 3); t < T; ++t) {
    TableConfig tc;
    tc.name = "t" + std::to_string(t);
    tc.num_embeddings = U(1, 50);
    tc.embedding_dim = sequence ? D : U(1, 20);
    for (int64_t f = 0, nf = U(1, 2); f < nf; ++f)
      tc.features.push_back(tc.name + "_f" + std::to_string(f));
    p.tables.push_back(tc);
  }
  p.finalize();
  return p;
}

std::shared_ptr<const EmbeddingSource> random_source(const Plan& p, std::mt19937_64& rng,
                                                     bool dense) {
  auto oracle = std::make_shared<OracleSource>(rng(), p);
  if (!dense) return oracle;
  std::vector<std::optional<std::vector<float>>> weights(p.tables.size());
  for (size_t t = 0; t < p.tables.size(); ++t) {
    if (rng() % 3 == 0) continue;  // this one from the oracle
    const TableConfig& tc = p.tables[t];
    std::vector<float> w(size_t(tc.num_embeddings * tc.embedding_dim));
    for (float& x : w) x = float(int(rng() % 201) - 100) / 16.0f;
    weights[t] = std::move(w);
  }
  return std::make_shared<DenseSource>(p, std::move(weights), oracle);
}

}  // namespace

TEST_CASE("a slice's rows as a device reads them == its row() == the whole rows' columns") {
  std::mt19937_64 rng(20261205);
  int64_t compared = 0;
  for (int i = 0; i < 300; ++i) {
    const bool sequence = i % 2 == 0, dense = i % 3 != 0;
    const Plan whole = random_plan(rng, sequence);
    const auto source = random_source(whole, rng, dense);
    // The whole source read the device's way is its own row().
    for (size_t t = 0; t < whole.tables.size(); ++t) {
      const TableConfig& tc = whole.tables[t];
      std::vector<float> row(size_t(tc.embedding_dim));
      for (int64_t g = 0; g < tc.num_embeddings; g += 7) {
        source->row(int(t), uint64_t(g), row.data(), tc.embedding_dim);
        for (int64_t c = 0; c < tc.embedding_dim; ++c)
          REQUIRE(device_value(*source, int(t), uint64_t(g), c) == row[size_t(c)]);
      }
    }
    const int64_t C = embedding_columns(whole);
    const int64_t c0 = int64_t(rng() % uint64_t(C)),
                  c1 = c0 + 1 + int64_t(rng() % uint64_t(C - c0));
    const ColumnSlice s = make_column_slice(whole, source, c0, c1);
    INFO("case " << i << (sequence ? " sequence" : " pooled") << (dense ? " dense" : "")
                 << " columns [" << c0 << ", " << c1 << ")");
    CHECK_FALSE(s.source->oracle_seed().has_value());  // a slice's rows are not whole oracle rows
    for (size_t f = 0; f < s.plan.features.size(); ++f) {
      const FeatureInfo& fi = s.plan.features[f];
      const int t = fi.table;
      const int wt = whole.features[f].table;
      const int64_t wdim = whole.tables[size_t(wt)].embedding_dim;
      std::vector<float> got(static_cast<size_t>(fi.dim)), full(static_cast<size_t>(wdim));
      for (int64_t g = 0; g < whole.tables[size_t(wt)].num_embeddings; g += 3) {
        s.source->row(t, uint64_t(g), got.data(), fi.dim);
        source->row(wt, uint64_t(g), full.data(), wdim);
        for (int64_t c = 0; c < fi.dim; ++c) {
          INFO("feature " << f << " row " << g << " column " << c);
          REQUIRE(got[size_t(c)] == full[size_t(s.col0[f] + c)]);
          REQUIRE(device_value(*s.source, t, uint64_t(g), c) == got[size_t(c)]);
          ++compared;
        }
      }
    }
  }
  CHECK(compared > 10000);
}
