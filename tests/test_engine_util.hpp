// Helpers shared by the engine tests: plans built in code, KJTs, a dense source from a
// formula, and the full sharded pipeline (input dist -> lookup -> output dist).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.hpp"
#include "engine/embedding_source.hpp"
#include "engine/engine.hpp"
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
  DerivedBatch d = derive_input_dist(plan, kp, be);
  std::vector<EmbTensor> local = derive_local_embs(plan, d, src, be, batch);
  std::vector<const EmbTensor*> lp;
  std::vector<const ShardingContext*> cp;
  for (size_t r = 0; r < local.size(); ++r) {
    lp.push_back(&local[r]);
    cp.push_back(&d.ranks[r].ctx);
  }
  std::vector<EmbTensor> out(local.size());
  OutputSink sink = [&](int r, EmbTensor&& e) { out[static_cast<size_t>(r)] = std::move(e); };
  if (plan.module == ModuleKind::sequence) {
    RwSequenceEmbeddingDist dist(plan, be);
    dist.forward(lp, cp, sink);
  } else {
    RwPooledEmbeddingDist local_dist(plan, be);
    (pooled ? *pooled : local_dist).forward(batch, lp, cp, sink);
  }
  return out;
}

}  // namespace dynemb::test
