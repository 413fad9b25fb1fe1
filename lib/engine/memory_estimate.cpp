#include "engine/memory_estimate.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "common/memory.hpp"

namespace dynemb {

MemoryEstimate estimate_batch_memory(const Plan& plan, int64_t batch_size, double L) {
  MemoryEstimate m;
  m.batch_size = batch_size;
  m.mean_bag_length = L;
  const double W = double(plan.world_size), F = double(plan.num_features()), B = double(batch_size);
  const double N = W * F * B * L;  // ids of the batch, all ranks
  const bool sequence = plan.module == ModuleKind::sequence;
  // KJT (lengths + values), bucketize (values, permute, dest rank, W x bags lengths), lookup
  // KJT (lengths + values): int64 each.
  m.ids = 8.0 * (W * F * B + N) + 8.0 * (3 * N + W * W * F * B) + 8.0 * (W * F * B + N);
  // Per rank: input/output splits and batch_size_per_rank [W], recat [F*W] (int32),
  // batch_size_per_rank_per_feature [W*F] and lengths_after_input_dist [F * W*B] (int64),
  // unbucketize_permute [N_r]; W ranks.
  m.context_w2 = W * (8.0 * 3 * W + 4.0 * F * W + 8.0 * W * F + 8.0 * F * W * B);
  m.context = m.context_w2 + 8.0 * N;
  // Float tensors are held as float32 whatever the dtype.
  if (sequence) {
    m.lookup = 4.0 * N * double(plan.seq_dim());
    m.output = 4.0 * N * double(plan.seq_dim());
  } else {
    m.lookup = 4.0 * W * (W * B) * double(plan.sum_dim);  // every rank: [sum_s B_s, sum_D]
    m.output = 4.0 * W * B * double(plan.sum_dim);
  }
  m.synth = m.ids + m.context + m.lookup + m.output;
  m.synth_one_lookup = m.lookup / W;
  const double one_output = m.output / W;
  const double blocks = sequence ? 2 * one_output : std::min(64.0 * (1 << 20), W * one_output);
  m.synth_by_destination = m.ids + m.context + std::min(2.0, W) * m.synth_one_lookup +
                           std::min(4.0, W) * one_output + blocks;
  // Replay of a capture holding every part: captured and derived contexts, lookups and
  // outputs (the golden one and the replayed one).
  m.replay = m.ids + 2 * m.context + 2 * m.lookup + 2 * m.output;
  return m;
}

std::string MemoryEstimate::summary() const {
  return fmt::format(
      "replay ~{}, synth ~{} per batch (B = {} per rank, {:g} ids per bag: context {} of which "
      "{} in W^2 terms, ids {}, lookup output {}, output {})",
      human_bytes(replay), human_bytes(synth_by_destination), batch_size, mean_bag_length,
      human_bytes(context), human_bytes(context_w2), human_bytes(ids), human_bytes(lookup),
      human_bytes(output));
}

}  // namespace dynemb
