// Helpers for the capture tests: temp dirs, hand-built plans, and batches whose every part
// has the shape capture-format.md asks for (values are arbitrary but exact in every dtype).
#pragma once

#include <fmt/format.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "capture/capture.hpp"

namespace dynemb::testcap {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/dynemb-capture-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

inline bool file_exists(const std::string& p) {
  return std::filesystem::exists(p);
}

struct TableSpec {
  std::string name;
  int64_t rows, dim;
  DType dtype;
};

// A plan built in code (no YAML loader involved), with matching source_text.
inline Plan make_plan(ModuleKind module, int64_t W, const std::vector<TableSpec>& tables,
                      DType comm = DType::f32) {
  Plan p;
  p.world_size = W;
  p.module = module;
  p.comm_precision = comm;
  std::string y = fmt::format(
      "format_version: 1\nworld_size: {}\nmodule: {}\ncomm_precision: {}\n"
      "tables:\n",
      W, to_string(module), to_string(comm));
  for (const TableSpec& t : tables) {
    TableConfig tc;
    tc.name = t.name;
    tc.num_embeddings = t.rows;
    tc.embedding_dim = t.dim;
    tc.data_type = t.dtype;
    tc.features = {"f_" + t.name};
    p.tables.push_back(tc);
    y += fmt::format(
        "  - name: {}\n    num_embeddings: {}\n    embedding_dim: {}\n    data_type: "
        "{}\n    features: [f_{}]\n",
        t.name, t.rows, t.dim, to_string(t.dtype), t.name);
  }
  p.source_text = y;
  p.path = "test-plan";
  p.finalize();
  return p;
}

struct Lcg {
  uint64_t s;
  uint64_t next() { return (s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; }
};

inline std::vector<float> dyadic(Lcg& g, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(static_cast<int>(g.next() % 256) - 128) / 64.0f;
  return v;
}

// Batch k with batch sizes B[r]; rank `vbe_rank` (or none: -1) is VBE. Every optional part
// is present with the spec's shape; values are arbitrary (the reader checks shapes only).
inline Batch make_batch(const Plan& plan, int64_t k, const std::vector<int64_t>& B,
                        int64_t vbe_rank, IndexType it, bool weighted, uint64_t seed) {
  Lcg g{seed * 7919 + 1};
  const int64_t W = plan.world_size, F = plan.num_features();
  Batch batch;
  batch.index = k;
  batch.ranks.resize(static_cast<size_t>(W));
  for (int64_t r = 0; r < W; ++r) {
    Kjt& kjt = batch.ranks[r].kjt;
    kjt.num_features = F;
    kjt.lengths_type = it;
    kjt.values_type = (r % 2 == 0) ? it : IndexType::i64;  // mixed dtypes across ranks
    kjt.weighted = weighted;
    std::vector<int64_t> bf(static_cast<size_t>(F), B[r]);
    if (r == vbe_rank) {
      for (int64_t f = 0; f < F; ++f) bf[f] = B[r] == 0 ? 0 : 1 + (f + k) % B[r];
      kjt.stride_per_feature = bf;
    }
    for (int64_t f = 0; f < F; ++f)
      for (int64_t b = 0; b < bf[f]; ++b) {
        const int64_t len = static_cast<int64_t>(g.next() % 4);
        kjt.lengths.push_back(len);
        for (int64_t i = 0; i < len; ++i) {
          // mostly in range, sometimes past the table or negative (routing edge cases)
          int64_t id = static_cast<int64_t>(g.next() % (plan.features[f].hash_size + 3));
          if (g.next() % 17 == 0) id = -1 - static_cast<int64_t>(g.next() % 5);
          if (kjt.values_type == IndexType::i32) id = static_cast<int32_t>(id);
          kjt.values.push_back(id);
          if (weighted) kjt.weights.push_back(static_cast<float>(g.next() % 9) / 4.0f);
        }
      }
  }
  // Batch-wide sizes for the shapes.
  bool any_vbe = false;
  int64_t sum_b = 0, vbe_local = 0;
  std::vector<int64_t> routed(static_cast<size_t>(W), 0);
  for (const RankBatch& rb : batch.ranks) {
    const Kjt& kj = rb.kjt;
    any_vbe |= kj.is_vbe();
    int64_t stride = 0;
    for (int64_t f = 0; f < F; ++f) {
      const int64_t bf = kj.is_vbe() ? kj.stride_per_feature[f] : kj.num_bags() / F;
      stride = std::max(stride, bf);
      vbe_local += bf * plan.features[f].dim;
    }
    sum_b += stride;
    auto c = routed_id_counts(plan, kj);
    for (int64_t d = 0; d < W; ++d) routed[d] += c[d];
  }
  const bool seq = plan.module == ModuleKind::sequence;
  const DType dt = plan.data_type();
  const DType ot = plan.comm_precision == DType::f32 ? dt : DType::f32;
  for (int64_t r = 0; r < W; ++r) {
    RankBatch& rb = batch.ranks[r];
    const Kjt& kj = rb.kjt;
    ShardingContext c;
    auto ints = [&](int64_t n) {
      std::vector<int64_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = static_cast<int64_t>(g.next() % 1000);
      return v;
    };
    c.input_splits = ints(W);
    c.output_splits = ints(W);
    if (!any_vbe) c.batch_size_per_rank = ints(W);
    std::vector<std::vector<int64_t>> m;
    for (int64_t s = 0; s < W; ++s) m.push_back(ints(F));
    c.batch_size_per_rank_per_feature = m;
    std::vector<int32_t> recat(static_cast<size_t>(F * W));
    for (size_t i = 0; i < recat.size(); ++i) recat[i] = static_cast<int32_t>(g.next() % 100);
    c.sparse_features_recat = recat;
    if (seq) {
      c.unbucketize_permute = ints(kj.num_ids());
      c.lengths_after_input_dist = ints(F * sum_b);
      c.lengths_after_input_dist_cols = sum_b;
    }
    c.variable_batch_per_feature = any_vbe;
    rb.ctx = c;
    auto tensor = [&](DType t, std::vector<int64_t> shape) {
      EmbTensor e;
      e.dtype = t;
      e.shape = shape;
      e.data = dyadic(g, e.numel());
      return e;
    };
    int64_t out_vbe = 0, stride = 0;
    for (int64_t f = 0; f < F; ++f) {
      const int64_t bf = kj.is_vbe() ? kj.stride_per_feature[f] : kj.num_bags() / F;
      out_vbe += bf * plan.features[f].dim;
      stride = std::max(stride, bf);
    }
    if (seq) {
      rb.local_embs = tensor(dt, {routed[r], plan.seq_dim()});
      rb.output = tensor(ot, {kj.num_ids(), plan.seq_dim()});
    } else if (any_vbe) {
      rb.local_embs = tensor(dt, {vbe_local});
      rb.output = tensor(ot, {out_vbe});
    } else {
      rb.local_embs = tensor(dt, {sum_b, plan.sum_dim});
      rb.output = tensor(ot, {stride, plan.sum_dim});
    }
  }
  return batch;
}

}  // namespace dynemb::testcap
