#include "replay/replan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <unordered_map>

#include "common/error.hpp"
#include "engine/embedding_source.hpp"
#include "engine/input_dist.hpp"
#include "engine/ops.hpp"
#include "engine/output_dist.hpp"

namespace dynemb {

namespace {

std::string shards_text(const TableConfig& t) {
  if (t.shards.empty()) return "even split";
  std::string s;
  for (const ShardSpec& sh : t.shards)
    s += fmt::format("{}rank {}: rows {}+{}", s.empty() ? "" : ", ", sh.rank, sh.row_offset,
                     sh.rows);
  return "[" + s + "]";
}

template <typename T>
void differ(std::vector<std::string>& out, const std::string& key, const T& a, const T& b) {
  if (a != b) out.push_back(fmt::format("{}: {} (capture) -> {} (--plan)", key, a, b));
}

}  // namespace

std::vector<std::string> plan_differences(const Plan& a, const Plan& b) {
  std::vector<std::string> out;
  differ(out, "world_size", a.world_size, b.world_size);
  differ(out, "module", std::string(to_string(a.module)), std::string(to_string(b.module)));
  differ(out, "comm_precision", std::string(to_string(a.comm_precision)),
         std::string(to_string(b.comm_precision)));
  differ(out, "bounds_check", std::string(to_string(a.bounds_check)),
         std::string(to_string(b.bounds_check)));
  differ(out, "input_dist", std::string(to_string(a.input_dist)),
         std::string(to_string(b.input_dist)));
  for (const TableConfig& ta : a.tables) {
    const auto it = std::find_if(b.tables.begin(), b.tables.end(),
                                 [&](const TableConfig& t) { return t.name == ta.name; });
    const std::string key = fmt::format("tables[{}]", ta.name);
    if (it == b.tables.end()) {
      out.push_back(key + ": only in the capture's plan");
      continue;
    }
    const TableConfig& tb = *it;
    differ(out, key + ".num_embeddings", ta.num_embeddings, tb.num_embeddings);
    differ(out, key + ".embedding_dim", ta.embedding_dim, tb.embedding_dim);
    differ(out, key + ".data_type", std::string(to_string(ta.data_type)),
           std::string(to_string(tb.data_type)));
    differ(out, key + ".pooling", std::string(to_string(ta.pooling)),
           std::string(to_string(tb.pooling)));
    differ(out, key + ".dist_type", std::string(to_string(ta.dist_type)),
           std::string(to_string(tb.dist_type)));
    differ(out, key + ".features", fmt::format("[{}]", fmt::join(ta.features, ", ")),
           fmt::format("[{}]", fmt::join(tb.features, ", ")));
    differ(out, key + ".shards", shards_text(ta), shards_text(tb));
  }
  for (const TableConfig& tb : b.tables)
    if (std::none_of(a.tables.begin(), a.tables.end(),
                     [&](const TableConfig& t) { return t.name == tb.name; }))
      out.push_back(fmt::format("tables[{}]: only in --plan", tb.name));
  return out;
}

namespace {

// Rows by (table, unsharded row g), recovered from the capture; zeros (counted) for the rest.
class RecoveredRows final : public EmbeddingSource {
 public:
  RecoveredRows(size_t tables, int64_t dim) : index_(tables), dim_(dim) {}
  void add(int table, uint64_t g, const float* row) {
    auto& m = index_[size_t(table)];
    if (m.count(g)) return;
    m.emplace(g, rows_.size());
    rows_.insert(rows_.end(), row, row + dim_);
  }
  void row(int table, uint64_t g, float* out, int64_t dim) const override {
    const auto& m = index_[size_t(table)];
    const auto it = m.find(g);
    if (it == m.end() || dim != dim_) {
      std::fill(out, out + dim, 0.0f);
      unknown_.fetch_add(1);
      return;
    }
    std::memcpy(out, rows_.data() + it->second, sizeof(float) * size_t(dim));
  }
  int64_t unknown() const { return unknown_.load(); }

 private:
  std::vector<std::unordered_map<uint64_t, size_t>> index_;
  std::vector<float> rows_;
  int64_t dim_;
  mutable std::atomic<int64_t> unknown_{0};
};

}  // namespace

std::vector<EmbTensor> reshard_sequence_local_embs(const Plan& from, const Plan& to,
                                                   const std::vector<const Kjt*>& kjts,
                                                   const std::vector<const EmbTensor*>& local,
                                                   Backend& backend, int64_t batch,
                                                   int64_t& unknown) {
  if (from.module != ModuleKind::sequence || to.module != ModuleKind::sequence)
    throw Error("re-sharding local_embs: sequence plans only");
  const int64_t W = from.world_size, D = from.seq_dim();
  // 1. One row per id of every rank, in KJT order: the capture plan's output dist on the
  //    captured local_embs with the context derived under that plan.
  DerivedBatch der = derive_input_dist(from, kjts);
  std::vector<const ShardingContext*> ctx(static_cast<size_t>(W));
  for (int64_t r = 0; r < W; ++r) ctx[size_t(r)] = &der.ranks[size_t(r)].ctx;
  std::vector<EmbTensor> per_id(static_cast<size_t>(W));
  std::vector<TensorRef> in;
  for (const EmbTensor* e : local) in.push_back(TensorRef(*e));
  RwSequenceEmbeddingDist(from).forward(backend, in, ctx, Place::host, [&](int r, Tensor&& out) {
    per_id[size_t(r)] = std::move(out.t);
  });
  // 2. Those rows by (table, g), for the ids that read their own row under `from`.
  RecoveredRows rows(to.tables.size(), D);
  for (int64_t r = 0; r < W; ++r) {
    const Kjt& k = *kjts[size_t(r)];
    const std::vector<int64_t> off = k.offsets();
    const EmbTensor& e = per_id[size_t(r)];
    if (e.rows() != k.num_ids() || e.cols() != D)
      throw Error(fmt::format("batch {} rank {}: the output dist gave {} rows for {} ids", batch, r,
                              e.rows(), k.num_ids()));
    for (int64_t f = 0; f < k.num_features; ++f) {
      const FeatureInfo& fi = from.features[size_t(f)];
      for (int64_t j = k.bag_begin(f); j < k.bag_begin(f) + k.batch_size(f); ++j)
        for (int64_t i = off[size_t(j)]; i < off[size_t(j) + 1]; ++i) {
          const Route rt = route_feature(fi, k.values[size_t(i)], k.values_type, W);
          const RowRef ref = lookup_row(from, f, rt.dest, rt.local);
          if (ref.valid && !ref.oob)
            rows.add(to.features[size_t(f)].table, ref.g, &e.data[size_t(i * D)]);
        }
    }
  }
  per_id.clear();
  // 3. The lookup under `to`.
  DerivedBatch der_to = derive_input_dist(to, kjts);
  std::vector<EmbTensor> out = derive_local_embs(to, der_to, rows, backend, batch);
  unknown = rows.unknown();
  return out;
}

}  // namespace dynemb
