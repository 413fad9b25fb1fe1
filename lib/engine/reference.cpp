// The unsharded reference (reference.hpp).
#include "engine/reference.hpp"

#include <algorithm>
#include <string>

#include "common/error.hpp"
#include "common/parallel.hpp"
#include "engine/input_dist.hpp"
#include "engine/lookup_runs.hpp"
#include "engine/ops.hpp"

namespace dynemb {

std::vector<int64_t> reference_shape(const Plan& plan, const Kjt& kjt) {
  if (plan.module == ModuleKind::sequence) return {kjt.num_ids(), plan.seq_dim()};
  if (!kjt.is_vbe()) return {kjt.stride(), plan.sum_dim};
  int64_t n = 0;
  for (int64_t f = 0; f < plan.num_features(); ++f) n += kjt.batch_size(f) * plan.features[f].dim;
  return {n};
}

void reference_runs(const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source,
                    int64_t batch, const ReferenceEmit& emit) {
  const int64_t F = plan.num_features(), W = plan.world_size;
  // The row an original id reads: route it as the input dist does, then the lookup's
  // bounds check on the rank it lands on (so warn_zero_row agrees with the sharded path).
  auto row_of = [&](int64_t f, int64_t i) {
    const FeatureInfo& fi = plan.features[f];
    const Route rt = route_feature(fi, kjt.values[i], kjt.values_type, W);
    const RowRef ref = lookup_row(plan, f, rt.dest, rt.local);
    if (ref.oob && plan.bounds_check == BoundsCheck::error)
      throw Error("batch " + std::to_string(batch) + ": rank " + std::to_string(rank) +
                  ", feature " + fi.name + ": id " + std::to_string(kjt.values[i]) +
                  " at position " + std::to_string(i) + " is outside table " +
                  plan.tables[fi.table].name + " [0, " + std::to_string(fi.hash_size) +
                  ") (bounds_check=error)");
    return ref;
  };
  const std::vector<int64_t> off = kjt.offsets();
  const bool sequence = plan.module == ModuleKind::sequence, vbe = kjt.is_vbe();
  // Feature f's bags are [bag0[f], bag0[f+1]); VBE: its 1-D slices start at e1d[f].
  std::vector<int64_t> bag0(static_cast<size_t>(F + 1)), e1d(static_cast<size_t>(F + 1), 0);
  for (int64_t f = 0; f <= F; ++f) bag0[size_t(f)] = f < F ? kjt.bag_begin(f) : kjt.num_bags();
  for (int64_t f = 0; f < F; ++f)
    e1d[size_t(f + 1)] = e1d[size_t(f)] + kjt.batch_size(f) * plan.features[f].dim;
  // Pooled: one fp32 sum per bag in id order, rounded once to the TBE dtype (MEAN tables too:
  // this is the reference of the dist, which carries sums).
  const float* weights = kjt.weighted ? kjt.weights.data() : nullptr;
  bag_runs(
      plan, source, bag0, off, weights, !sequence && !vbe ? kjt.stride() : -1, hardware_threads(),
      /*grain=*/64, [&](int64_t f, int64_t, int64_t i) { return row_of(f, i); },
      [&](int64_t f, int64_t j) {
        const int64_t D = plan.features[f].dim, b = j - bag0[size_t(f)];
        return vbe ? e1d[size_t(f)] + b * D : b * plan.sum_dim + plan.features[f].column_offset;
      },
      emit);
}

EmbTensor reference_output(const Plan& plan, int rank, const Kjt& kjt,
                           const EmbeddingSource& source, int64_t batch) {
  check_kjt(plan, kjt, "batch " + std::to_string(batch) + " rank" + std::to_string(rank));
  EmbTensor out = EmbTensor::zeros(output_dist_dtype(plan), reference_shape(plan, kjt));
  reference_runs(plan, rank, kjt, source, batch, [&](const float* v, int64_t at, int64_t count) {
    std::copy(v, v + count, out.data.begin() + at);
  });
  return out;
}

}  // namespace dynemb
