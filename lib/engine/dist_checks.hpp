// Context validation of both output dists, shared by every backend so that a broken captured
// context fails the same way (same rank, same field, same words) on cpu, cuda and nccl. In a
// real job these are the crashes or hangs of one rank; here they are OutputDistFailure.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// RwSequenceEmbeddingDist, sender side of rank s (docs/semantics.md §6).
struct SequenceSendPlan {
  int64_t rows = 0;  // rows of local_embs[s]
  // The forward recat as a segment permute of local_embs rows: send segment k is input
  // segment forward_recat[k], which holds segment_lengths[forward_recat[k]] rows. Segments
  // are the (f, s') rows of lengths_after_input_dist.view(F*W, B) (equal batches), or single
  // bags (batch sizes differ). W == 1: one identity segment.
  std::vector<int64_t> forward_recat;
  std::vector<int64_t> segment_lengths;
  std::vector<int64_t> send_off;  // [W+1]: rows for destination d are [send_off[d], [d+1])
};

struct SequenceDistCheck {
  std::vector<SequenceSendPlan> senders;       // [W]
  std::vector<std::vector<int64_t>> recv_off;  // [W][W+1]: cumsum of input_splits
};

// Checks local_embs shapes, lengths_after_input_dist, sparse_features_recat, output_splits,
// input_splits (against what each sender sends) and unbucketize_permute (in range of the
// received rows); throws OutputDistFailure(rank, field) at the first problem.
SequenceDistCheck check_sequence_dist(const Plan& plan,
                                      const std::vector<const EmbTensor*>& local_embs,
                                      const std::vector<const ShardingContext*>& ctx);

// RwPooledEmbeddingDist (§7): where each destination's chunk lies in every sender's input.
struct PooledDistCheck {
  std::vector<std::vector<int64_t>> chunk_off;  // [W][W+1] element offsets in local_embs[d]
  std::vector<int64_t> chunk_len;               // [W] elements reduced into rank r
};

// Checks local_embs shapes, batch_size_per_rank (or the equal split when it is absent) /
// batch_size_per_rank_per_feature (VBE) and agreement between senders and receivers.
PooledDistCheck check_pooled_dist(const Plan& plan, bool variable_batch,
                                  const std::vector<const EmbTensor*>& local_embs,
                                  const std::vector<const ShardingContext*>& ctx);

// Stand-ins of a dist's inputs with their dtypes and shapes and no data (a bare span, with no
// shape, is an Error), and pointers to them: what the checks above, and a backend's own tables
// of the same shapes, read.
std::vector<EmbTensor> shape_stand_ins(const std::vector<TensorRef>& local_embs);
std::vector<const EmbTensor*> tensor_pointers(const std::vector<EmbTensor>& t);

// The same on the shapes of a dist's inputs as the backends take them (backend.hpp); a bare span
// (no shape) is an Error.
SequenceDistCheck check_sequence_dist(const Plan& plan, const std::vector<TensorRef>& local_embs,
                                      const std::vector<const ShardingContext*>& ctx);
PooledDistCheck check_pooled_dist(const Plan& plan, bool variable_batch,
                                  const std::vector<TensorRef>& local_embs,
                                  const std::vector<const ShardingContext*>& ctx);

}  // namespace dynemb
