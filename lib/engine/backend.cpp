// The host side of Backend's checks: what a backend that does not compare on its device runs,
// and what a device backend's host fallback runs.
#include "engine/backend.hpp"

#include "engine/engine.hpp"

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
