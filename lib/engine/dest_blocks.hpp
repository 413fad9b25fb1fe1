// A batch one destination rank at a time, so that its memory is that of one rank's output,
// not of the batch: how a replay checks a capture (replay.cpp) and how synth makes one.
//
// Both output dists build destination d's output from one block of every sender's
// local_embs: the sequence dist gathers the rows rank s sends to d (its chunk of the
// all-to-all after the forward recat), the pooled reduce-scatter sums chunk d of every
// sender. Reading only those blocks from the capture, running the dist on them alone and
// checking d's output gives exactly what the whole batch gives for d; the blocks of all d
// cover every sender's rows once, so the lookup check of sender s is the merge of its blocks'
// diffs.
//
// The block of (s, d) as the lookup makes it: when the contexts are the derived ones, the
// rows s sends to d are the lookups of the bags that source rank d sent to s, so the lookup
// of those bags alone (lookup_kjt_from) yields the block in the order it is read.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "engine/backend.hpp"
#include "engine/dist_checks.hpp"
#include "model/types.hpp"

namespace dynemb {

// Where the block of (s, d) lies in local_embs[s]: `ranges` of its first dimension (rows;
// elements of a 1-D pooled VBE tensor), sorted and disjoint, concatenated in that order.
struct DestBlock {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<int64_t> shape;  // the block as a tensor: [rows, D], [B_d, sum_D] or [n]
  int64_t row_elems = 1;       // elements per unit of `ranges`
  int64_t numel() const;
  // Flat index in the block -> flat index in local_embs[s] (increasing).
  int64_t to_whole(int64_t e) const;
  // Block-local first unit of each range, [ranges + 1] (filled by the makers below).
  std::vector<int64_t> starts;
};

// Sequence: the rows sender `sp` sends to d, in send order, as ranges of its local_embs
// [rows, D]. nullopt when the send order is not increasing in local_embs (a captured
// sparse_features_recat that reorders features): the caller then replays the batch whole.
std::optional<DestBlock> sequence_block(const SequenceSendPlan& sp, int64_t d, int64_t D);
// The blocks of every destination d = 0..W-1 in one walk of the send order (O(segments + W),
// where W calls of sequence_block would walk it W times); nullopt when some block's send order
// is not increasing.
std::optional<std::vector<DestBlock>> sequence_blocks(const SequenceSendPlan& sp, int64_t D);

// Pooled: chunk d of sender s ([B_d, sum_D] rows, or the 1-D VBE chunk of n elements).
DestBlock pooled_block(const PooledDistCheck& chk, int64_t s, int64_t d, int64_t sum_D,
                       bool variable_batch);

// The bags of lookup KJT `k` (rank s's, (f, s', b) order) that source rank d sent, as a lookup
// KJT of one source rank: stride_per_key_per_rank[f] = {B_{d,f}}, the same features, weights
// and variable_batch. Its lookup is the block of (s, d) when the contexts are the derived ones.
LookupKjt lookup_kjt_from(const LookupKjt& k, int64_t d);
// The same for samples [b0, b1) of source rank d only (every feature's, a pooled non-VBE batch):
// the lookup of rows [b0, b1) of the block of (s, d).
LookupKjt lookup_kjt_from(const LookupKjt& k, int64_t d, int64_t b0, int64_t b1);
// Samples [b0, b1) of a KJT that is not VBE (every feature's): its reference is rows [b0, b1)
// of the whole KJT's pooled reference.
Kjt kjt_samples(const Kjt& kjt, int64_t b0, int64_t b1);
// Where the bags and values of each (f, s) pair of a lookup KJT start, for a caller that takes
// many pieces of one k: `bags` [F*W + 1] (bag (f, s, 0) is bags[f*W + s]), `values` [bags + 1]
// (complete_cumsum(k.lengths)).
struct LookupKjtIndex {
  std::vector<int64_t> bags, values;
};
LookupKjtIndex lookup_kjt_index(const LookupKjt& k);
// The same with k's index given: O(F + the piece), not a walk over k's (f, s) pairs, so the W
// pieces of each of W lookup KJTs cost O(W^2 F), not O(W^3 F).
LookupKjt lookup_kjt_from(const LookupKjt& k, const LookupKjtIndex& ix, int64_t d, int64_t b0,
                          int64_t b1);
// The number of ids (values) that piece holds, without making it.
int64_t lookup_kjt_from_ids(const LookupKjt& k, const LookupKjtIndex& ix, int64_t d, int64_t b0,
                            int64_t b1);

// Rows [r0, r1) of a pooled non-VBE block (pooled_block): a destination's output is the sum of
// its senders' chunks row by row, so it can be made and checked a few rows at a time.
DestBlock block_rows(const DestBlock& b, int64_t r0, int64_t r1);

// Destination d's output from its blocks alone (`blocks[s]`: what rank s sends it; a sequence
// destination's are emptied here, a pooled one's left for the caller to reuse), through the
// backend's dist, as the whole batch's dist makes it. Sequence: the blocks in rank order are what d
// receives, so a one-rank dist (no exchange) applies d's unbucketize_permute to them. Pooled: the
// reduce-scatter of W senders whose only chunk is d's, summed in the same rank order. `ctx`: the
// contexts the whole batch's dist gets. The sequence case on what d receives, already in one tensor
// (`recv`: the blocks of ranks 0..W-1 one after the other); `ctx`: d's context.
// `place`: where the output is left (backend.hpp).
Tensor sequence_destination_output(const Plan& plan, Backend& backend, const EmbTensor& recv,
                                   const ShardingContext& ctx, Place place);
Tensor destination_output(const Plan& plan, Backend& backend, int64_t d,
                          std::vector<EmbTensor>& blocks,
                          const std::vector<const ShardingContext*>& ctx, bool variable_batch,
                          Place place);

}  // namespace dynemb
