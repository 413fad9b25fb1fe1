// The sharding plan (docs/plan-format.md): one row-wise sharding group.
//
// Feature order = tables in file order, inside a table its `features` in list order. It
// fixes the KJT key order, the block-size vector, pooled column order and F everywhere.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "common/error.hpp"

namespace dynemb {

enum class ModuleKind : uint8_t { sequence, pooled };
enum class PoolingMode : uint8_t { sum, mean };
// docs/semantics.md §3.2 / §10.2: 0 continuous, 1 roundrobin, 2 hash_roundrobin.
enum class DistType : uint8_t { continuous = 0, roundrobin = 1, hash_roundrobin = 2 };
enum class BoundsCheck : uint8_t { error, warn_zero_row, ignore };
// Which TorchRec input dist routes continuous ids: training's (the ceil rule, whatever
// `shards` says) or inference's (InferRwSparseFeaturesDist: explicit shards' row offsets,
// block_bucketize_pos, so uneven row splits are honoured). docs/plan-format.md.
enum class InputDist : uint8_t { training, inference };

const char* to_string(ModuleKind m);
const char* to_string(PoolingMode p);
const char* to_string(DistType d);
const char* to_string(BoundsCheck b);
const char* to_string(InputDist i);

// One explicit RW shard, as TorchRec ShardMetadata (shard_offsets[0], shard_sizes[0]).
struct ShardSpec {
  int64_t rank = 0;
  int64_t row_offset = 0;
  int64_t rows = 0;
  SourceLoc loc;
};

struct TableConfig {
  std::string name;
  int64_t num_embeddings = 0;  // rows of the unsharded table (hash_size)
  int64_t embedding_dim = 0;   // D
  DType data_type = DType::f32;
  PoolingMode pooling = PoolingMode::sum;
  DistType dist_type = DistType::continuous;
  std::vector<std::string> features;
  std::vector<ShardSpec> shards;  // empty: even split by the ceil rule
  SourceLoc loc;                  // the table's mapping
};

// A feature (KJT key) in sharding order, with everything the data path needs about it.
struct FeatureInfo {
  std::string name;
  int table = 0;           // index into Plan::tables (oracle table number t)
  int64_t dim = 0;         // D_f
  int64_t hash_size = 0;   // num_embeddings of its table
  int64_t block_size = 0;  // blk_f = ceil(num_embeddings / W)
  // [o_0 = 0, o_1, ..., o_{W-1}, num_embeddings]: its shards' row offsets, the
  // block_bucketize_pos TorchRec's inference input dist routes by (docs/semantics.md §3.6),
  // when its table routes_by_shards; empty: the ceil rule (block_size) routes it.
  std::vector<int64_t> bucketize_pos;
  DistType dist_type = DistType::continuous;
  PoolingMode pooling = PoolingMode::sum;
  int64_t column_offset = 0;  // pooled: first column of this feature in [.., sum_D]
};

struct Plan {
  int format_version = 1;
  int64_t world_size = 1;  // W
  ModuleKind module = ModuleKind::sequence;
  DType comm_precision = DType::f32;
  BoundsCheck bounds_check = BoundsCheck::error;
  InputDist input_dist = InputDist::training;
  std::vector<TableConfig> tables;

  std::string path;         // where it was read from ("<capture>:/plan" for embedded plans)
  std::string source_text;  // the YAML text, verbatim

  // Derived, filled by finalize().
  std::vector<FeatureInfo> features;
  int64_t sum_dim = 0;  // pooled: sum_f D_f; sequence: the common D
  bool any_mean = false;

  int64_t num_features() const { return static_cast<int64_t>(features.size()); }
  // Sequence plans have one common D.
  int64_t seq_dim() const { return features.empty() ? 0 : features.front().dim; }
  // The lookup output dtype (all tables share one data_type; validate enforces it).
  DType data_type() const { return tables.empty() ? DType::f32 : tables.front().data_type; }
  // Computes `features`, `sum_dim`, `any_mean` from `tables` and `world_size`.
  void finalize();
};

// Even RW split of docs/semantics.md §2: blk = ceil(N/W), ranks below N/blk get blk rows.
int64_t rw_block_size(int64_t num_embeddings, int64_t world_size);
std::vector<int64_t> rw_even_shard_rows(int64_t num_embeddings, int64_t world_size);
// Rows each rank holds of table `t` ([W]): its explicit `shards` by rank, else the even split.
// For roundrobin/hash_roundrobin shards these are capacities, not key ranges.
std::vector<int64_t> shard_rows_per_rank(const TableConfig& t, int64_t world_size);
// Whether table `t` routes ids by its explicit shards rather than by the ceil rule: an
// inference plan's continuous table whose shards differ from the even split.
bool routes_by_shards(const Plan& plan, const TableConfig& t);
// Empty when the GPU backends (cuda, nccl), whose bucketize takes one block size per feature,
// can run `plan`; else one line naming the first table that routes by shards. The host engine
// (--backend cpu) routes every plan.
std::string engine_routing_gap(const Plan& plan);

// The rows of feature `f`'s table that rank `rank` holds, as a key range [first, first + rows)
// of the unsharded table: its shard's offset and size when the table routes by shards, else
// the ceil rule's (first = rank * blk, also for a rank past the table's end, which holds none).
struct RankRows {
  int64_t first = 0;
  int64_t rows = 0;
};
inline RankRows rank_rows(const FeatureInfo& f, int64_t rank) {  // inline: once per looked-up id
  RankRows r;
  if (!f.bucketize_pos.empty()) {
    r.first = f.bucketize_pos[static_cast<size_t>(rank)];
    r.rows = f.bucketize_pos[static_cast<size_t>(rank) + 1] - r.first;
    return r;
  }
  // docs/semantics.md §2.2: blk rows, the remainder, or 0.
  r.first = rank * f.block_size;
  r.rows = std::max<int64_t>(0, std::min<int64_t>(f.block_size, f.hash_size - r.first));
  return r;
}

// ---- Loading and validation (lib/plan/plan_loader.cpp) ----

enum class Severity : uint8_t { error, warning, note };

struct Diagnostic {
  Severity severity = Severity::error;
  SourceLoc loc;
  std::string path;     // dotted key path, e.g. "tables[1].embedding_dim" (may be empty)
  std::string message;  // without location prefix
  // GCC style: "plan.yaml:12:5: error: tables[1].embedding_dim: must be >= 1, got 0"
  std::string str() const;
};

struct PlanLoadResult {
  std::optional<Plan> plan;          // set when there is no error
  std::vector<Diagnostic> findings;  // errors, warnings and notes, in file order
  bool ok() const;
};

// Parses and checks a plan; never throws for bad content (findings say what and where).
// `display_name` is used in locations (the file path, or "capture.h5:/plan").
PlanLoadResult parse_plan(const std::string& yaml_text, const std::string& display_name);
// Reads the file (throws Error if unreadable) then parse_plan.
PlanLoadResult load_plan_file(const std::string& path);
// Convenience: returns the plan or throws PlanError for the first error.
Plan load_plan_or_throw(const std::string& yaml_text, const std::string& display_name);

// ---- Writing (lib/plan/plan_writer.cpp) ----

// YAML for `plan` (docs/plan-format.md) that parse_plan reads back to the same plan, with
// `comment` as leading comment lines (each input line led by "# ", control characters
// escaped, so that no input line can become YAML).
std::string plan_to_yaml(const Plan& plan, const std::string& comment);

}  // namespace dynemb
