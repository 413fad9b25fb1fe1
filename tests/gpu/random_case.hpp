// Random plans and batches for the NCCL tests (one process, and across processes): W ranks, a
// sequence or pooled module, codecs, fp16/bf16 data, weights, unequal batches per rank, VBE, MEAN,
// ids out of their table, over the edge cases of plans/README.md (as the CUDA test's).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb::test {

struct Case {
  Plan plan;
  std::vector<Kjt> kjts;
  std::string desc;
};

// One case; `force_w` > 0 fixes W (else 1 in 8 cases W = 1, the rest W in 2..8). Every draw
// comes from `rng`, so processes seeded alike make the same cases.
inline Case random_case(std::mt19937_64& rng, int idx, int64_t force_w = 0) {
  auto U = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Case c;
  Plan& p = c.plan;
  p.world_size = force_w ? force_w : U(0, 7) == 0 ? 1 : U(2, 8);
  p.module = U(0, 1) ? ModuleKind::sequence : ModuleKind::pooled;
  const int prec = static_cast<int>(U(0, 5));
  p.comm_precision = prec == 4 ? DType::f16 : prec == 5 ? DType::bf16 : DType::f32;
  const int dprec = static_cast<int>(U(0, 7));
  const DType data = dprec == 6 ? DType::f16 : dprec == 7 ? DType::bf16 : DType::f32;
  p.bounds_check = U(0, 1) ? BoundsCheck::warn_zero_row : BoundsCheck::ignore;
  const int64_t T = U(1, 3);
  const int64_t seqD = std::vector<int64_t>{1, 4, 15, 16, 33, 128}[U(0, 5)];
  for (int64_t t = 0; t < T; ++t) {
    TableConfig tc;
    tc.name = "t" + std::to_string(t);
    tc.num_embeddings = U(0, 3) == 0 ? U(1, 7) : U(10, 5000);
    tc.embedding_dim = p.module == ModuleKind::sequence ? seqD : U(1, 40);
    tc.data_type = data;
    tc.dist_type = static_cast<DistType>(U(0, 2));
    tc.pooling =
        p.module == ModuleKind::pooled && U(0, 2) == 0 ? PoolingMode::mean : PoolingMode::sum;
    const int64_t nf = U(1, 2);
    for (int64_t f = 0; f < nf; ++f) tc.features.push_back(tc.name + "_f" + std::to_string(f));
    p.tables.push_back(tc);
  }
  p.finalize();
  const int64_t F = p.num_features(), W = p.world_size;
  const bool weighted = U(0, 3) == 0;
  const bool vbe = U(0, 3) == 0;
  const int64_t Bcommon = U(0, 6);
  for (int64_t r = 0; r < W; ++r) {
    Kjt k;
    k.num_features = F;
    k.weighted = weighted;
    const int64_t B = U(0, 3) == 0 ? U(0, 6) : Bcommon;  // unequal batch per rank
    for (int64_t f = 0; f < F; ++f) {
      const int64_t Bf = vbe ? U(0, 5) : B;
      if (vbe) k.stride_per_feature.push_back(Bf);
      const FeatureInfo& fi = p.features[f];
      for (int64_t b = 0; b < Bf; ++b) {
        const int64_t len = U(0, 6);
        k.lengths.push_back(len);
        for (int64_t i = 0; i < len; ++i) {
          const int64_t kind = U(0, 19);
          const int64_t id = kind == 0   ? -U(1, 5)
                             : kind == 1 ? fi.hash_size + U(0, 3 * W)
                                         : U(0, fi.hash_size - 1);
          k.values.push_back(id);
          if (weighted) k.weights.push_back(static_cast<float>(U(-8, 8)) / 4.0f);
        }
      }
    }
    c.kjts.push_back(std::move(k));
  }
  c.desc = "case " + std::to_string(idx) + ": W=" + std::to_string(W) + " F=" + std::to_string(F) +
           " " + to_string(p.module) + " codec=" + to_string(p.comm_precision) +
           " data=" + to_string(data) + (weighted ? " weighted" : "") + (vbe ? " vbe" : "") +
           (p.any_mean ? " mean" : "");
  return c;
}

}  // namespace dynemb::test
