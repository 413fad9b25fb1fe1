#include "engine/holding_backend.hpp"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "engine/forwarding_backend.hpp"
#include "engine/input_dist.hpp"

namespace dynemb {
namespace {

class HoldingBackend final : public ForwardingBackend {
 public:
  explicit HoldingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  // What a test needs to know the held paths ran, not only that the reports agree.
  ~HoldingBackend() override {
    std::fprintf(stderr,
                 "DYNEMB_HOLD_OUTPUTS: %lld outputs held, %lld checks made on them, %lld lookups "
                 "kept for a dist\n",
                 static_cast<long long>(outputs_held_), static_cast<long long>(checks_held_),
                 static_cast<long long>(lookups_kept_));
  }
  // Kept here as rank's, handed back as a shape, as a device keeps it.
  EmbTensor lookup_for_dist(const Plan& plan, int rank, const LookupKjt& kjt,
                            const EmbeddingSource& source) override {
    EmbTensor made = inner_->lookup_for_dist(plan, rank, kjt, source);
    if (rank < 0) return made;
    if (size_t(rank) >= kept_.size()) kept_.resize(size_t(rank) + 1);
    EmbTensor shape{made.dtype, made.shape, {}};
    kept_[size_t(rank)] = std::move(made);
    ++lookups_kept_;
    return shape;
  }
  std::optional<std::vector<TileDiff>> reference_differences(
      const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source, int64_t batch,
      const float* replayed, int held_rank, int64_t n, const TileCompare& how) override {
    if (held_rank < 0)
      return inner_->reference_differences(plan, rank, kjt, source, batch, replayed, -1, n, how);
    const EmbTensor* got = held(held_rank, n);
    if (!got) return std::nullopt;
    ++checks_held_;
    return inner_->reference_differences(plan, rank, kjt, source, batch, got->data.data(), -1, n,
                                         how);
  }
  bool hold_outputs(bool on) override {
    hold_ = on;
    held_.clear();
    return true;
  }
  std::optional<std::vector<TileDiff>> held_output_differences(int rank, const float* want,
                                                               int64_t n,
                                                               const TileCompare& how) override {
    const EmbTensor* got = held(rank, n);
    if (!got) return std::nullopt;
    ++checks_held_;
    return tile_diffs(got->data.data(), want, n, how);
  }
  void sequence_output_dist(const Plan& plan, const std::vector<const EmbTensor*>& local_embs,
                            const std::vector<const ShardingContext*>& ctx,
                            const OutputSink& sink) override {
    held_.clear();  // the previous dist's outputs are dropped before this one runs
    inner_->sequence_output_dist(plan, with_kept(local_embs), ctx, holding(sink));
  }
  void pooled_output_dist(const Plan& plan, bool variable_batch,
                          const std::vector<const EmbTensor*>& local_embs,
                          const std::vector<const ShardingContext*>& ctx,
                          const OutputSink& sink) override {
    held_.clear();
    inner_->pooled_output_dist(plan, variable_batch, with_kept(local_embs), ctx, holding(sink));
  }

 protected:
  Backend& inner() const override { return *inner_; }

 private:
  // `sink` as is while not holding; else each output kept as rank r's and the sink handed its
  // dtype and shape only.
  OutputSink holding(const OutputSink& sink) {
    if (!hold_) return sink;
    return [this, &sink](int r, EmbTensor&& out) {
      if (r >= 0 && size_t(r) >= held_.size()) held_.resize(size_t(r) + 1);
      EmbTensor shape{out.dtype, out.shape, {}};
      if (r >= 0) held_[size_t(r)] = std::move(out);
      ++outputs_held_;
      sink(r, std::move(shape));
    };
  }
  // The dist's inputs with each one that has no data (and elements) replaced by the rank's kept
  // lookup, which must have its shape (Backend::lookup_for_dist).
  std::vector<const EmbTensor*> with_kept(const std::vector<const EmbTensor*>& local) const {
    std::vector<const EmbTensor*> in = local;
    for (size_t s = 0; s < in.size(); ++s) {
      const EmbTensor& t = *in[s];
      if (int64_t(t.data.size()) == t.numel()) continue;
      if (s >= kept_.size() || !kept_[s] || kept_[s]->shape != t.shape)
        throw Error("output dist: local_embs of rank " + std::to_string(s) +
                    " has no data, and no lookup of its shape is kept for it");
      in[s] = &*kept_[s];
    }
    return in;
  }
  // The held output of rank r, or nullptr when none of n elements is held for it.
  const EmbTensor* held(int r, int64_t n) const {
    if (r < 0 || size_t(r) >= held_.size() || !held_[size_t(r)]) return nullptr;
    const EmbTensor& t = *held_[size_t(r)];
    return t.numel() == n && int64_t(t.data.size()) == n ? &t : nullptr;
  }

  std::unique_ptr<Backend> inner_;
  bool hold_ = false;
  std::vector<std::optional<EmbTensor>> held_;  // [rank] of the last dist, while holding
  std::vector<std::optional<EmbTensor>> kept_;  // [rank] the last lookup_for_dist
  int64_t outputs_held_ = 0, checks_held_ = 0, lookups_kept_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_holding_backend(std::unique_ptr<Backend> inner) {
  return std::make_unique<HoldingBackend>(std::move(inner));
}

}  // namespace dynemb
