#include "engine/mean_pooling.hpp"

#include <string>

#include "common/error.hpp"
#include "engine/ops.hpp"

namespace dynemb {

EmbTensor mean_divided(const Plan& plan, const Kjt& kjt, const EmbTensor& dist_output) {
  if (!plan.any_mean) return dist_output;  // TorchRec registers no callback at all
  EmbTensor out = dist_output;
  out.dtype = DType::f32;  // x / float32 divisor: torch promotes fp16/bf16 to fp32
  const std::vector<float> div = mean_divisors(plan, kjt);  // [num_bags], by bag index
  const int64_t F = plan.num_features();
  if (dist_output.shape.size() == 2) {  // [B_r, sum_D]
    const int64_t B = out.rows(), C = plan.sum_dim;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t f = 0; f < F; ++f) {
        const FeatureInfo& fi = plan.features[f];
        const float q = div[kjt.bag_begin(f) + b];
        float* o = &out.data[b * C + fi.column_offset];
        for (int64_t c = 0; c < fi.dim; ++c) o[c] /= q;
      }
    return out;
  }
  int64_t e = 0;  // VBE 1-D [f][b][d]
  for (int64_t f = 0; f < F; ++f)
    for (int64_t b = 0; b < kjt.batch_size(f); ++b) {
      const float q = div[kjt.bag_begin(f) + b];
      for (int64_t c = 0; c < plan.features[f].dim; ++c) out.data[e++] /= q;
    }
  return out;
}

EmbTensor module_output(const Plan& plan, const Kjt& kjt, const EmbTensor& dist_output,
                        const std::vector<int64_t>* inverse_indices) {
  EmbTensor pooled = mean_divided(plan, kjt, dist_output);
  if (pooled.shape.size() == 2) return pooled;
  const int64_t F = plan.num_features();
  if (!inverse_indices || F == 0 || inverse_indices->size() % size_t(F) != 0)
    throw Error(
        "the module output of a variable-batch KJT needs its inverse indices [F, B_full] to "
        "expand the per-feature batches");
  const int64_t B = static_cast<int64_t>(inverse_indices->size()) / F, C = plan.sum_dim;
  EmbTensor out = EmbTensor::zeros(pooled.dtype, {B, C});
  int64_t base = 0;  // first element of feature f in the 1-D [f][b][d] layout
  for (int64_t f = 0; f < F; ++f) {
    const FeatureInfo& fi = plan.features[f];
    const int64_t Bf = kjt.batch_size(f);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t src = (*inverse_indices)[size_t(f * B + b)];
      if (src < 0 || src >= Bf)
        throw Error("inverse index " + std::to_string(src) + " of feature " + fi.name +
                    ", sample " + std::to_string(b) + " is outside its batch of " +
                    std::to_string(Bf));
      const float* in = &pooled.data[base + src * fi.dim];
      std::copy(in, in + fi.dim, &out.data[b * C + fi.column_offset]);
    }
    base += Bf * fi.dim;
  }
  return out;
}

EmbTensor per_rank_means(const Plan& plan, const LookupKjt& k, const EmbTensor& sums) {
  EmbTensor out = sums;
  const int64_t F = k.num_features, W = k.world_size;
  const bool vbe = sums.shape.size() == 1;
  // Row of source rank s's first sample in [sum_s B_s, sum_D] (non-VBE: B_s is the same for
  // every feature), and, for VBE, the first element of source s's [f][b][d] block.
  std::vector<int64_t> row0(size_t(W) + 1, 0), elem0(size_t(W) + 1, 0);
  for (int64_t s = 0; s < W; ++s) {
    row0[s + 1] = row0[s] + (F > 0 ? k.stride_per_key_per_rank[0][s] : 0);
    int64_t n = 0;
    for (int64_t f = 0; f < F; ++f) n += k.stride_per_key_per_rank[f][s] * plan.features[f].dim;
    elem0[s + 1] = elem0[s] + n;
  }
  int64_t j = 0;  // lookup bag index, (f, s, b) order
  for (int64_t f = 0; f < F; ++f) {
    const FeatureInfo& fi = plan.features[f];
    for (int64_t s = 0; s < W; ++s)
      for (int64_t b = 0; b < k.stride_per_key_per_rank[f][s]; ++b, ++j) {
        if (fi.pooling != PoolingMode::mean) continue;
        const int64_t len = k.lengths[j];
        const float scale = len > 0 ? 1.0f / static_cast<float>(len) : 0.0f;
        int64_t e = 0;
        if (vbe) {
          e = elem0[s];
          for (int64_t g = 0; g < f; ++g)
            e += k.stride_per_key_per_rank[g][s] * plan.features[g].dim;
          e += b * fi.dim;
        } else {
          e = (row0[s] + b) * plan.sum_dim + fi.column_offset;
        }
        for (int64_t c = 0; c < fi.dim; ++c) out.data[e + c] *= scale;
      }
  }
  return out;
}

}  // namespace dynemb
