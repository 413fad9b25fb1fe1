// The host side of Backend's lookup comparison: what a backend that does not compare on its
// device runs, and what a device backend's host fallback runs.
#include "engine/backend.hpp"

#include <algorithm>
#include <cstring>

#include "engine/engine.hpp"
#include "engine/parallel.hpp"

namespace dynemb {

std::vector<DifferingRange> differing_tiles(const float* want, const float* captured, int64_t n,
                                            int64_t tile) {
  tile = std::max<int64_t>(1, tile);
  const int64_t tiles = (n + tile - 1) / tile;
  std::vector<uint8_t> differs(static_cast<size_t>(tiles), 0);
  parallel_for(
      hardware_threads(), tiles,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t e0 = t * tile, len = std::min(n, e0 + tile) - e0;
          differs[size_t(t)] =
              std::memcmp(want + e0, captured + e0, sizeof(float) * size_t(len)) != 0;
        }
      },
      /*grain=*/16);
  std::vector<DifferingRange> out;
  for (const auto& [e0, e1] : differing_ranges(differs, n, tile))
    out.push_back({e0, std::vector<float>(want + e0, want + e1)});
  return out;
}

std::vector<std::pair<int64_t, int64_t>> differing_ranges(const std::vector<uint8_t>& differs,
                                                          int64_t n, int64_t tile) {
  tile = std::max<int64_t>(1, tile);
  const int64_t tiles = int64_t(differs.size());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t t = 0; t < tiles;) {
    if (!differs[size_t(t)]) {
      ++t;
      continue;
    }
    int64_t t1 = t + 1;
    while (t1 < tiles && differs[size_t(t1)]) ++t1;
    out.emplace_back(t * tile, std::min(n, t1 * tile));
    t = t1;
  }
  return out;
}

namespace {

// differing_tiles of a tensor made whole on the host; nullopt when it has not n elements.
std::optional<std::vector<DifferingRange>> tiles_of(const EmbTensor& want, const float* host,
                                                    int64_t n, int64_t tile) {
  if (want.numel() != n || int64_t(want.data.size()) != n) return std::nullopt;
  return differing_tiles(want.data.data(), host, n, tile);
}

}  // namespace

std::optional<std::vector<DifferingRange>> Backend::lookup_differences(
    const Plan& plan, int rank, const LookupKjt& kjt, const EmbeddingSource& source,
    const float* captured, int64_t n, int64_t tile) {
  return tiles_of(lookup(plan, rank, kjt, source), captured, n, tile);
}

std::optional<std::vector<DifferingRange>> Backend::reference_differences(
    const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source, int64_t batch,
    const float* replayed, int64_t n, int64_t tile) {
  return tiles_of(reference_output(plan, rank, kjt, source, batch), replayed, n, tile);
}

}  // namespace dynemb
