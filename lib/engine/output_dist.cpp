#include "engine/output_dist.hpp"

#include <string>

#include "engine/dist_checks.hpp"

namespace dynemb {

void RwSequenceEmbeddingDist::forward(Backend& backend, const std::vector<TensorRef>& local_embs,
                                      const std::vector<const ShardingContext*>& ctx, Place place,
                                      const OutputSink& sink) {
  backend.sequence_output_dist(plan_, local_embs, ctx, place, sink);
}

bool RwPooledEmbeddingDist::latch(int64_t batch, const std::vector<const ShardingContext*>& ctx) {
  // Every rank builds its module from its own ctx; ranks that disagree cannot run one
  // collective together, which is a context mismatch as well.
  std::vector<bool> mode(ctx.size());
  for (size_t r = 0; r < ctx.size(); ++r)
    mode[r] = ctx[r]->variable_batch_per_feature.value_or(false);
  for (size_t r = 0; r < ctx.size(); ++r) {
    const bool want = latched_ ? *latched_ : mode[0];
    if (mode[r] != want) {
      const std::string why =
          latched_
              ? "the module was created for variable_batch_per_feature=" +
                    std::string(want ? "true" : "false") + " on its first batch"
              : "rank 0 has variable_batch_per_feature=" + std::string(want ? "true" : "false");
      throw OutputDistFailure(static_cast<int>(r), "variable_batch_per_feature",
                              "batch " + std::to_string(batch) + ": rank " + std::to_string(r) +
                                  ": variable_batch_per_feature=" + (mode[r] ? "true" : "false") +
                                  " but " + why);
    }
  }
  if (!latched_ && !ctx.empty()) latched_ = mode[0];
  return latched_.value_or(false);
}

void RwPooledEmbeddingDist::forward(Backend& backend, int64_t batch,
                                    const std::vector<TensorRef>& local_embs,
                                    const std::vector<const ShardingContext*>& ctx, Place place,
                                    const OutputSink& sink) {
  const bool variable_batch = latch(batch, ctx);
  backend.pooled_output_dist(plan_, variable_batch, local_embs, ctx, place, sink);
}

bool RwPooledEmbeddingDist::check(int64_t batch, const std::vector<TensorRef>& local_embs,
                                  const std::vector<const ShardingContext*>& ctx) {
  const bool variable_batch = latch(batch, ctx);
  check_pooled_dist(plan_, variable_batch, local_embs, ctx);
  return variable_batch;
}

}  // namespace dynemb
