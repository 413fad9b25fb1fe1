// Helpers shared by the engine tests: plans built in code, KJTs, a dense source from a
// formula, and the full sharded pipeline (input dist -> lookup -> output dist).
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "engine/backend.hpp"
#include "engine/embedding_source.hpp"
#include "engine/input_dist.hpp"
#include "engine/output_dist.hpp"
#include "plan/plan.hpp"

namespace dynemb::test {

inline TableConfig table(std::string name, int64_t rows, int64_t dim,
                         std::vector<std::string> features, DistType dist = DistType::continuous,
                         PoolingMode pooling = PoolingMode::sum, DType dt = DType::f32) {
  TableConfig t;
  t.name = std::move(name);
  t.num_embeddings = rows;
  t.embedding_dim = dim;
  t.features = std::move(features);
  t.dist_type = dist;
  t.pooling = pooling;
  t.data_type = dt;
  return t;
}

inline Plan make_plan(int64_t W, ModuleKind m, std::vector<TableConfig> tables,
                      DType comm = DType::f32, BoundsCheck bc = BoundsCheck::error) {
  Plan p;
  p.world_size = W;
  p.module = m;
  p.comm_precision = comm;
  p.bounds_check = bc;
  p.tables = std::move(tables);
  p.finalize();
  return p;
}

inline Kjt make_kjt(int64_t F, std::vector<int64_t> lengths, std::vector<int64_t> values,
                    std::vector<int64_t> stride_per_feature = {}, std::vector<float> weights = {}) {
  Kjt k;
  k.num_features = F;
  k.lengths = std::move(lengths);
  k.values = std::move(values);
  k.stride_per_feature = std::move(stride_per_feature);
  k.weighted = !weights.empty();
  k.weights = std::move(weights);
  return k;
}

// Dense weights from a formula value(table, row, col), rounded to each table's dtype.
inline std::shared_ptr<DenseSource> formula_source(
    const Plan& plan, const std::function<float(int, int64_t, int64_t)>& value) {
  std::vector<std::optional<std::vector<float>>> w;
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    const TableConfig& tc = plan.tables[t];
    std::vector<float> v(static_cast<size_t>(tc.num_embeddings * tc.embedding_dim));
    for (int64_t g = 0; g < tc.num_embeddings; ++g)
      for (int64_t c = 0; c < tc.embedding_dim; ++c)
        v[g * tc.embedding_dim + c] = round_to(tc.data_type, value(static_cast<int>(t), g, c));
    w.emplace_back(std::move(v));
  }
  return std::make_shared<DenseSource>(plan, std::move(w), nullptr);
}

inline std::vector<const Kjt*> ptrs(const std::vector<Kjt>& v) {
  std::vector<const Kjt*> p;
  for (const Kjt& k : v) p.push_back(&k);
  return p;
}

// Input dist + lookup + the module's output dist; returns every rank's output.
inline std::vector<EmbTensor> run_sharded(const Plan& plan, const std::vector<Kjt>& kjts,
                                          const EmbeddingSource& src, Backend& be,
                                          int64_t batch = 0,
                                          RwPooledEmbeddingDist* pooled = nullptr) {
  const std::vector<const Kjt*> kp = ptrs(kjts);
  DerivedBatch d = derive_input_dist(plan, kp);
  std::vector<EmbTensor> local = derive_local_embs(plan, d, src, be, batch);
  std::vector<TensorRef> lp;
  std::vector<const ShardingContext*> cp;
  for (size_t r = 0; r < local.size(); ++r) {
    lp.emplace_back(local[r]);
    cp.push_back(&d.ranks[r].ctx);
  }
  std::vector<EmbTensor> out(local.size());
  // Host outputs: a backend asked for Place::host hands over the whole tensor.
  OutputSink sink = [&](int r, Tensor&& e) {
    REQUIRE_FALSE(e.kept.has_value());
    out[static_cast<size_t>(r)] = std::move(e.t);
  };
  if (plan.module == ModuleKind::sequence) {
    RwSequenceEmbeddingDist dist(plan);
    dist.forward(be, lp, cp, Place::host, sink);
  } else {
    RwPooledEmbeddingDist local_dist(plan);
    (pooled ? *pooled : local_dist).forward(be, batch, lp, cp, Place::host, sink);
  }
  return out;
}

// Same shape and the same bits in every element.
inline bool bit_equal(const EmbTensor& a, const EmbTensor& b) {
  if (a.shape != b.shape || a.data.size() != b.data.size()) return false;
  for (size_t i = 0; i < a.data.size(); ++i)
    if (f32_bits(a.data[i]) != f32_bits(b.data[i])) return false;
  return true;
}

struct Case {
  Plan plan;
  std::vector<Kjt> kjts;
};

// A random plan (W 1..8, sequence or pooled, 1-3 tables, mixed dist_types, MEAN, ids out of
// range under bounds_check ignore) and a batch for it (equal or unequal B, VBE, weighted,
// int32/int64, empty bags and features).
inline Case random_case(std::mt19937_64& rng) {
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const int64_t W = uni(1, 8);
  const ModuleKind m = uni(0, 1) ? ModuleKind::pooled : ModuleKind::sequence;
  const bool oob = uni(0, 4) == 0;  // ids outside tables, bounds_check = ignore
  std::vector<TableConfig> tables;
  const int64_t T = uni(1, 3), seqD = uni(1, 4);
  int nf = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::string> feats;
    for (int64_t k = uni(1, 2); k > 0; --k) feats.push_back("f" + std::to_string(nf++));
    const DistType dist = static_cast<DistType>(uni(0, 3) < 2 ? 0 : uni(1, 2));
    const PoolingMode pool =
        m == ModuleKind::pooled && uni(0, 2) == 0 ? PoolingMode::mean : PoolingMode::sum;
    tables.push_back(table("t" + std::to_string(t), uni(1, 40),
                           m == ModuleKind::sequence ? seqD : uni(1, 4), feats, dist, pool));
  }
  Case c{make_plan(W, m, tables, DType::f32, oob ? BoundsCheck::ignore : BoundsCheck::error), {}};
  const int64_t F = c.plan.num_features();
  const bool equal_b = uni(0, 1), vbe = uni(0, 3) == 0, weighted = uni(0, 2) == 0;
  const IndexType vt = uni(0, 1) ? IndexType::i32 : IndexType::i64;
  const IndexType lt = uni(0, 1) ? IndexType::i32 : IndexType::i64;
  const int64_t B0 = uni(0, 4);
  for (int64_t r = 0; r < W; ++r) {
    Kjt k;
    k.num_features = F;
    k.values_type = vt;
    k.lengths_type = lt;
    k.weighted = weighted;
    const int64_t B = equal_b ? B0 : uni(0, 4);
    const bool zero_feature = uni(0, 3) == 0;  // one feature with only empty bags
    const int64_t zf = uni(0, F - 1);
    for (int64_t f = 0; f < F; ++f) {
      const int64_t Bf = vbe ? uni(0, 3) : B;
      if (vbe) k.stride_per_feature.push_back(Bf);
      const FeatureInfo& fi = c.plan.features[f];
      for (int64_t b = 0; b < Bf; ++b) {
        const int64_t len = zero_feature && f == zf ? 0 : uni(0, 3);
        k.lengths.push_back(len);
        for (int64_t i = 0; i < len; ++i) {
          int64_t id;
          if (fi.dist_type != DistType::continuous)
            id = uni(-50, 1000);
          else if (oob && uni(0, 3) == 0)
            id = uni(0, 1) ? uni(-3, -1) : uni(fi.hash_size, fi.block_size * W + 3);
          else
            id = uni(0, fi.hash_size - 1);
          k.values.push_back(id);
          if (weighted) k.weights.push_back(static_cast<float>(uni(-8, 8)) / 4.0f);
        }
      }
    }
    c.kjts.push_back(std::move(k));
  }
  return c;
}

// Every field of two contexts (a captured one read back, a derived one made another way).
inline void check_same_context(const ShardingContext& c, const ShardingContext& d) {
  CHECK(c.input_splits == d.input_splits);
  CHECK(c.output_splits == d.output_splits);
  CHECK(c.batch_size_per_rank == d.batch_size_per_rank);
  CHECK(c.batch_size_per_rank_per_feature == d.batch_size_per_rank_per_feature);
  CHECK(c.sparse_features_recat == d.sparse_features_recat);
  CHECK(c.unbucketize_permute == d.unbucketize_permute);
  CHECK(c.lengths_after_input_dist == d.lengths_after_input_dist);
  if (c.lengths_after_input_dist)
    CHECK(c.lengths_after_input_dist_cols == d.lengths_after_input_dist_cols);
  CHECK(c.variable_batch_per_feature == d.variable_batch_per_feature);
}

}  // namespace dynemb::test
