// Plan model helpers that need no YAML: names, the RW block-size rule, derived features.
#include "plan/plan.hpp"

namespace dynemb {

const char* to_string(ModuleKind m) {
  return m == ModuleKind::sequence ? "sequence" : "pooled";
}
const char* to_string(PoolingMode p) {
  return p == PoolingMode::sum ? "sum" : "mean";
}
const char* to_string(DistType d) {
  switch (d) {
    case DistType::continuous:
      return "continuous";
    case DistType::roundrobin:
      return "roundrobin";
    case DistType::hash_roundrobin:
      return "hash_roundrobin";
  }
  return "?";
}
const char* to_string(BoundsCheck b) {
  switch (b) {
    case BoundsCheck::error:
      return "error";
    case BoundsCheck::warn_zero_row:
      return "warn_zero_row";
    case BoundsCheck::ignore:
      return "ignore";
  }
  return "?";
}

const char* to_string(InputDist i) {
  return i == InputDist::training ? "training" : "inference";
}

int64_t rw_block_size(int64_t num_embeddings, int64_t world_size) {
  return (num_embeddings + world_size - 1) / world_size;
}

std::vector<int64_t> rw_even_shard_rows(int64_t num_embeddings, int64_t world_size) {
  // docs/semantics.md §2: ranks below last_rank get blk rows, last_rank the remainder.
  std::vector<int64_t> rows(static_cast<size_t>(world_size), 0);
  const int64_t blk = rw_block_size(num_embeddings, world_size);
  if (blk == 0) return rows;
  const int64_t last_rank = num_embeddings / blk;
  for (int64_t i = 0; i < world_size; ++i) {
    if (i < last_rank)
      rows[i] = blk;
    else if (i == last_rank)
      rows[i] = num_embeddings - blk * last_rank;
  }
  return rows;
}

std::vector<int64_t> shard_rows_per_rank(const TableConfig& t, int64_t world_size) {
  if (t.shards.empty()) return rw_even_shard_rows(t.num_embeddings, world_size);
  std::vector<int64_t> rows(static_cast<size_t>(world_size), 0);
  for (const ShardSpec& s : t.shards)
    if (s.rank >= 0 && s.rank < world_size) rows[static_cast<size_t>(s.rank)] = s.rows;
  return rows;
}

bool routes_by_shards(const Plan& plan, const TableConfig& t) {
  if (plan.input_dist != InputDist::inference || t.dist_type != DistType::continuous ||
      t.shards.empty())
    return false;
  return shard_rows_per_rank(t, plan.world_size) !=
         rw_even_shard_rows(t.num_embeddings, plan.world_size);
}

std::string engine_routing_gap(const Plan& plan) {
  for (const TableConfig& t : plan.tables)
    if (routes_by_shards(plan, t))
      return "table '" + t.name +
             "' has uneven explicit shards under input_dist inference, which the GPU "
             "bucketize (one block size per feature, docs/semantics.md §2) cannot route";
  return "";
}

void Plan::finalize() {
  features.clear();
  sum_dim = 0;
  any_mean = false;
  for (size_t t = 0; t < tables.size(); ++t) {
    const TableConfig& tc = tables[t];
    if (tc.pooling == PoolingMode::mean) any_mean = true;
    for (const std::string& name : tc.features) {
      FeatureInfo f;
      f.name = name;
      f.table = static_cast<int>(t);
      f.dim = tc.embedding_dim;
      f.hash_size = tc.num_embeddings;
      f.block_size = rw_block_size(tc.num_embeddings, world_size);
      if (routes_by_shards(*this, tc)) {
        f.bucketize_pos.push_back(0);
        for (const int64_t rows : shard_rows_per_rank(tc, world_size))
          f.bucketize_pos.push_back(f.bucketize_pos.back() + rows);
      }
      f.dist_type = tc.dist_type;
      f.pooling = tc.pooling;
      f.column_offset = sum_dim;
      features.push_back(f);
      if (module == ModuleKind::pooled) sum_dim += tc.embedding_dim;
    }
  }
  if (module == ModuleKind::sequence) sum_dim = seq_dim();
}

}  // namespace dynemb
