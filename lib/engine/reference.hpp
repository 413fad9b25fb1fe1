// The unsharded reference: what rank r's output must be, made from its own KJT and the
// embedding source with no sharding at all (docs/semantics.md §8). A replay's output checks
// compare the output dist's result with it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/embedding_source.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// The unsharded reference output of rank r, straight from its own KJT and the embedding
// source with no sharding at all: sequence [N_r, D]; pooled [B_r, sum_D] (MEAN tables summed,
// as the dist returns them);
// pooled VBE 1-D [f][b][d]. Out-of-table ids follow plan.bounds_check exactly as the sharded
// path does (warn_zero_row: local row 0 of the rank the id is routed to).
EmbTensor reference_output(const Plan& plan, int rank, const Kjt& kjt,
                           const EmbeddingSource& source, int64_t batch);
// Its shape, and the reference made run by run on every core for a caller that needs no tensor
// of it (a check comparing each run as it is made): emit(values, at, count) gets elements
// [at, at + count), a row per id (sequence) or a bag's D_f sums (pooled); every element is in
// exactly one run (pooled non-VBE: when sum_D is the sum of the features' dims). `kjt` must
// have passed check_kjt; throws reference_output's bounds_check=error.
using ReferenceEmit = std::function<void(const float* values, int64_t at, int64_t count)>;
std::vector<int64_t> reference_shape(const Plan& plan, const Kjt& kjt);
void reference_runs(const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source,
                    int64_t batch, const ReferenceEmit& emit);

}  // namespace dynemb
