// The two RW output dist modules, built like TorchRec's (docs/semantics.md §6, §7): thin
// modules over the Backend seams, holding the state the real modules hold.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/backend.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// RwSequenceEmbeddingDist (§6): forward recat permute, all-to-all, unbucketize gather.
// Stateless across batches, as the real module (its recat buffers depend only on F, W).
class RwSequenceEmbeddingDist {
 public:
  explicit RwSequenceEmbeddingDist(const Plan& plan) : plan_(plan) {}
  // local_embs[r]: [N_local_r, D]; ctx[r]: rank r's SequenceShardingContext. Throws
  // OutputDistFailure when a context cannot work.
  void forward(Backend& backend, const std::vector<TensorRef>& local_embs,
               const std::vector<const ShardingContext*>& ctx, Place place, const OutputSink& sink);

 private:
  const Plan& plan_;
};

// RwPooledEmbeddingDist (§7): creates its inner module lazily on the first batch, choosing
// PooledEmbeddingsReduceScatter or VariableBatchPooledEmbeddingsReduceScatter from
// ctx.variable_batch_per_feature, and LATCHES that choice. A later batch whose variable-batch
// mode differs is a sharding-context mismatch: forward() throws OutputDistFailure with
// field "variable_batch_per_feature" naming the batch, and runs nothing (the latch stays).
class RwPooledEmbeddingDist {
 public:
  explicit RwPooledEmbeddingDist(const Plan& plan) : plan_(plan) {}
  // A missing variable_batch_per_feature reads as false (EmbeddingShardingContext's
  // default). The outputs are the reduce-scattered sums, MEAN tables included.
  void forward(Backend& backend, int64_t batch, const std::vector<TensorRef>& local_embs,
               const std::vector<const ShardingContext*>& ctx, Place place, const OutputSink& sink);
  // What forward() does before the reduce-scatter, for a caller that runs the reduce-scatter
  // itself on column slices of local_embs (replay/column_slice.hpp): the latch (throws as
  // forward() does, else latches) and check_pooled_dist on the whole `local_embs`, of which
  // only the shapes are read. Returns the variable-batch mode to run the slices with.
  bool check(int64_t batch, const std::vector<TensorRef>& local_embs,
             const std::vector<const ShardingContext*>& ctx);
  // The latched mode: nullopt before the first batch.
  std::optional<bool> latched_variable_batch() const { return latched_; }
  // The mode an earlier batch latched, when that batch ran in another process of the replay
  // (replay/team.hpp): this module then behaves as the one that ran it.
  void preset_latch(bool variable_batch) { latched_ = variable_batch; }

 private:
  bool latch(int64_t batch, const std::vector<const ShardingContext*>& ctx);
  const Plan& plan_;
  std::optional<bool> latched_;
};

}  // namespace dynemb
