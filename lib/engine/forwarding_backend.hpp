// A backend that hands every call to another one (inner()). Wrappers derive from it and
// override only what they change: the CPU reference holding its outputs as a device does
// (holding_backend.hpp), a GPU backend still starting on another thread (backends/registry.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/backend.hpp"

namespace dynemb {

class ForwardingBackend : public Backend {
 public:
  std::string name() const override { return inner().name(); }
  std::string device() const override { return inner().device(); }
  BucketizedKjt bucketize(const Plan& plan, const Kjt& kjt) override {
    return inner().bucketize(plan, kjt);
  }
  // bucketize_ranks is Backend's own (the host's, whatever the inner backend) and is not
  // forwarded: a GPU backend still starting is not waited for by the input dist.
  EmbTensor lookup(const Plan& plan, int rank, const LookupKjt& kjt,
                   const EmbeddingSource& source) override {
    return inner().lookup(plan, rank, kjt, source);
  }
  EmbTensor lookup_for_dist(const Plan& plan, int rank, const LookupKjt& kjt,
                            const EmbeddingSource& source) override {
    return inner().lookup_for_dist(plan, rank, kjt, source);
  }
  std::optional<std::vector<TileDiff>> lookup_differences(const Plan& plan, int rank,
                                                          const LookupKjt& kjt,
                                                          const EmbeddingSource& source,
                                                          const float* captured, int64_t n,
                                                          const TileCompare& how) override {
    return inner().lookup_differences(plan, rank, kjt, source, captured, n, how);
  }
  std::optional<std::vector<TileDiff>> reference_differences(
      const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source, int64_t batch,
      const float* replayed, int held_rank, int64_t n, const TileCompare& how) override {
    return inner().reference_differences(plan, rank, kjt, source, batch, replayed, held_rank, n,
                                         how);
  }
  bool hold_outputs(bool on) override { return inner().hold_outputs(on); }
  std::optional<std::vector<TileDiff>> held_output_differences(int rank, const float* want,
                                                               int64_t n,
                                                               const TileCompare& how) override {
    return inner().held_output_differences(rank, want, n, how);
  }
  void sequence_output_dist(const Plan& plan, const std::vector<const EmbTensor*>& local_embs,
                            const std::vector<const ShardingContext*>& ctx,
                            const OutputSink& sink) override {
    inner().sequence_output_dist(plan, local_embs, ctx, sink);
  }
  void pooled_output_dist(const Plan& plan, bool variable_batch,
                          const std::vector<const EmbTensor*>& local_embs,
                          const std::vector<const ShardingContext*>& ctx,
                          const OutputSink& sink) override {
    inner().pooled_output_dist(plan, variable_batch, local_embs, ctx, sink);
  }

 protected:
  // The backend the calls go to (const: name() and device() are; the calls it takes are not).
  virtual Backend& inner() const = 0;
};

}  // namespace dynemb
