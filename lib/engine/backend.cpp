// The host side of Backend's checks: what a backend that does not compare on its device runs,
// and what a device backend's host fallback runs.
#include "engine/backend.hpp"
#include "engine/reference.hpp"

#include "common/parallel.hpp"
#include "common/trace.hpp"
#include "engine/input_dist.hpp"
#include "engine/ops.hpp"

namespace dynemb {

namespace {

// tile_diffs of `got` and a tensor made whole on the host; nullopt when it has not n elements.
std::optional<std::vector<TileDiff>> tiles_of(const float* got, const EmbTensor& want, int64_t n,
                                              const TileCompare& how) {
  if (want.numel() != n || int64_t(want.data.size()) != n) return std::nullopt;
  return tile_diffs(got, want.data.data(), n, how);
}

}  // namespace

std::optional<std::vector<TileDiff>> Backend::lookup_differences(const Plan& plan, int rank,
                                                                 const LookupKjt& kjt,
                                                                 const EmbeddingSource& source,
                                                                 const float* captured, int64_t n,
                                                                 const TileCompare& how) {
  return tiles_of(captured, lookup(plan, rank, kjt, source), n, how);
}

std::optional<std::vector<TileDiff>> Backend::reference_differences(
    const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source, int64_t batch,
    const float* replayed, int held_rank, int64_t n, const TileCompare& how) {
  if (held_rank >= 0) return std::nullopt;  // holds no outputs (hold_outputs)
  return tiles_of(replayed, reference_output(plan, rank, kjt, source, batch), n, how);
}

std::vector<BucketizedKjt> Backend::bucketize_ranks(const Plan& plan,
                                                    const std::vector<const Kjt*>& kjts) {
  std::vector<BucketizedKjt> out(kjts.size());
  parallel_for(
      hardware_threads(), int64_t(kjts.size()),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const TraceSpan span("bucketize", r);
          out[size_t(r)] = bucketize_on_host(plan, *kjts[size_t(r)]);
        }
      },
      /*grain=*/1);
  return out;
}

EmbTensor Backend::lookup_for_dist(const Plan& plan, int rank, const LookupKjt& kjt,
                                   const EmbeddingSource& source) {
  return lookup(plan, rank, kjt, source);
}

bool Backend::hold_outputs(bool /*on*/) {
  return false;
}

std::optional<std::vector<TileDiff>> Backend::held_output_differences(int /*rank*/,
                                                                      const float* /*want*/,
                                                                      int64_t /*n*/,
                                                                      const TileCompare& /*how*/) {
  return std::nullopt;
}

}  // namespace dynemb
