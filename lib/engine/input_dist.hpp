// The input dist derived for one batch: what every rank's bucketize, KJT all-to-all and recat
// produce from the plan and the W local KJTs, and the lookups on its output (docs/semantics.md
// §3-§5). The unsharded reference is reference.hpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend.hpp"
#include "engine/embedding_source.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// What the input dist produces for rank r.
struct DerivedRank {
  BucketizedKjt bucketized;  // this rank's bucketize output (sender side)
  LookupKjt lookup_kjt;      // what this rank looks up after the KJT all-to-all + recat
  ShardingContext ctx;       // the context TorchRec would have filled on this rank
};

struct DerivedBatch {
  bool variable_batch = false;     // pooled: any rank's KJT is VBE (the EBC ctx flag)
  std::vector<DerivedRank> ranks;  // [W]
};

// Input dist for all W ranks: bucketize, splits exchange, KJT all-to-all, recat, contexts.
// Sequence plans pad VBE KJTs to max_f B_f first, as EmbeddingCollection does (§6.2).
// Throws Error (trouble) when the KJTs are malformed for the plan (wrong F, lengths that do
// not sum to the ids, negative lengths). Stage 1 (bucketize) is `stage1`'s when given (a replay
// passes its backend once started: the CUDA backend bucketizes all ranks in one launch), else
// the host's (bucketize_ranks); the rest runs on the host, which the context checks read.
DerivedBatch derive_input_dist(const Plan& plan, const std::vector<const Kjt*>& kjts,
                               Backend* stage1 = nullptr);
// Stage 1 on the host for every rank of a batch: bucketize_on_host on every core at once, rank
// by rank (the CPU backend's bucketize, and the reference the others are tested against).
std::vector<BucketizedKjt> bucketize_ranks(const Plan& plan, const std::vector<const Kjt*>& kjts);

// Lookup for every rank; result[r] = local_embs of rank r. `batch` names the batch in
// bounds-check errors. `done(r, local_embs_r)`, when given, is called as each rank's lookup
// completes, in rank order (synth writes rank r while rank r + 1 is looked up); what it leaves
// in its argument is what result[r] holds.
std::vector<EmbTensor> derive_local_embs(const Plan& plan, const DerivedBatch& derived,
                                         const EmbeddingSource& source, Backend& backend,
                                         int64_t batch,
                                         const std::function<void(int64_t, EmbTensor&)>& done = {});
// The same lookups as the next output dist's inputs only (Place::kept): a backend that keeps
// tensors keeps them, handing back their shapes.
std::vector<Tensor> derive_dist_inputs(const Plan& plan, const DerivedBatch& derived,
                                       const EmbeddingSource& source, Backend& backend,
                                       int64_t batch);

// The message for a LookupBoundsError of `derived` (derived from `kjts`), in the user's terms:
// the id itself, its feature, rank, sample and position in its original bag, where it was
// routed, and the way out ("id 42 of feature p1 (rank 0, sample 2, position 1 in its bag) is
// outside table m1 ..."). Falls back to the error's own text when the position cannot be
// traced (a context that does not fit the KJTs).
std::string describe_lookup_bounds_error(const Plan& plan, const std::vector<const Kjt*>& kjts,
                                         const DerivedBatch& derived, const LookupBoundsError& e);

// Checks a KJT against the plan (F, lengths >= 0, sum(lengths) == len(values), weights
// length, VBE strides); throws Error naming `where` (e.g. "/batches/3/rank1") on failure.
void check_kjt(const Plan& plan, const Kjt& kjt, const std::string& where);

}  // namespace dynemb
