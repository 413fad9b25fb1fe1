// MEAN pooling under row-wise sharding, where TorchRec does it: not in the output dist.
//
// Under RW the lookup runs MEAN tables as SUM, RwPooledEmbeddingDist reduce-scatters the sums,
// and the EmbeddingBagCollection divides afterwards, in a callback on the module's awaitable
// (TorchRec's `_apply_mean_pooling`). Only when the sharding has at least one MEAN table is
// there a callback at all, and then it divides *every* column:
//
//   divisor[b, cols of f] = float32(L_f(b)) + 1e-6   L = ids in the global bag (MEAN feature),
//                                                      or the sum of its weights (weighted KJT),
//                                                      or 1 (SUM feature)
//   module_output = dist_output / divisor            float32
//
// so SUM columns of such a module are divided by float32(1 + 1e-6), and an empty MEAN bag gives
// 0 / 1e-6 = 0. For a variable-batch (VBE) KJT the module first expands the per-feature batches
// to the full batch by the KJT's inverse indices, then divides: [B_full, sum_D].
#pragma once

#include <cstdint>
#include <vector>

#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// The dist's output of one rank divided as the module divides it, in the dist's own layout
// ([B_r, sum_D], or VBE 1-D [f][b < B_f][d < D_f]); no VBE expansion. `kjt` is this rank's
// KJT before the input dist. Without MEAN tables: the values unchanged (no callback).
EmbTensor mean_divided(const Plan& plan, const Kjt& kjt, const EmbTensor& dist_output);

// The module's final pooled output of one rank: mean_divided, then for a VBE KJT the
// expansion out[b, cols of f] = pooled_f[inverse_indices[f * B_full + b]] to [B_full, sum_D].
// `inverse_indices` ([F * B_full]) is required for a VBE KJT (throws Error without it) and
// ignored otherwise.
EmbTensor module_output(const Plan& plan, const Kjt& kjt, const EmbTensor& dist_output,
                        const std::vector<int64_t>* inverse_indices);

// What a lookup that kept PoolingMode.MEAN under RW returns instead of partial sums: every
// MEAN bag of this rank's lookup KJT scaled by 1 / (its local sub-bag's length), 0 for an
// empty sub-bag; SUM bags unchanged. `sums` is this rank's local_embs as the RW lookup gives
// them ([sum_s B_s, sum_D], or VBE 1-D [s][f][b][d]). For the diagnosis of captured local_embs.
EmbTensor per_rank_means(const Plan& plan, const LookupKjt& kjt, const EmbTensor& sums);

}  // namespace dynemb
