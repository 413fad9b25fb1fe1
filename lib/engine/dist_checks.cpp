#include "engine/dist_checks.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "common/error.hpp"
#include "engine/backend.hpp"
#include "engine/ops.hpp"

namespace dynemb {
namespace {

std::string vec_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size() && i < 16; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  if (v.size() > 16) s += ",...";
  return s + "]";
}

int64_t sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

[[noreturn]] void fail(int64_t rank, const std::string& field, const std::string& msg) {
  throw OutputDistFailure(static_cast<int>(rank), field,
                          "rank " + std::to_string(rank) + ": " + field + ": " + msg);
}

SequenceSendPlan check_sender(const Plan& plan, int64_t s, const EmbTensor& E,
                              const ShardingContext& c) {
  const int64_t W = plan.world_size, F = plan.num_features(), D = plan.seq_dim();
  SequenceSendPlan p;
  if (E.shape.size() != 2 || E.cols() != D)
    fail(s, "local_embs", "shape must be [N_local, " + std::to_string(D) + "]");
  p.rows = E.rows();
  if (W == 1) {  // alltoall_sequence returns the input untouched: no permutes, no splits
    p.forward_recat = {0};
    p.segment_lengths = {p.rows};
    p.send_off = {0, p.rows};
    return p;
  }
  if (!c.lengths_after_input_dist) fail(s, "lengths_after_input_dist", "missing");
  const std::vector<int64_t>& lens = *c.lengths_after_input_dist;
  const int64_t cols = c.lengths_after_input_dist_cols;
  if (static_cast<int64_t>(lens.size()) != F * cols)
    fail(s, "lengths_after_input_dist",
         "has " + std::to_string(lens.size()) + " entries, want F*" + std::to_string(cols));
  if (sum(lens) != p.rows)
    fail(s, "lengths_after_input_dist",
         "sums to " + std::to_string(sum(lens)) + " ids but local_embs has " +
             std::to_string(p.rows) + " rows");
  // variable_batch = batch_size_per_rank given and not all equal (RwSequenceEmbeddingDist).
  bool variable = false;
  if (c.batch_size_per_rank) {
    const auto& b = *c.batch_size_per_rank;
    variable = std::any_of(b.begin(), b.end(), [&](int64_t x) { return x != b.front(); });
  }
  std::vector<int64_t> recat;
  if (c.sparse_features_recat)
    recat = to_i64(*c.sparse_features_recat);
  else if (!variable)
    recat = to_i64(get_recat(F, W));  // the module's precomputed backward_recat
  else
    fail(s, "sparse_features_recat", "missing with unequal batch_size_per_rank");
  const int64_t want = variable ? F * cols : F * W;
  if (static_cast<int64_t>(recat.size()) != want)
    fail(s, "sparse_features_recat",
         "has " + std::to_string(recat.size()) + " entries, want " + std::to_string(want));
  try {
    p.forward_recat = invert_permute(recat);
  } catch (const Error& e) {
    fail(s, "sparse_features_recat", e.what());
  }
  if (!variable && cols % W != 0)
    fail(s, "lengths_after_input_dist",
         std::to_string(cols) + " columns cannot be viewed as [F*W, B] rows");
  // Equal batches: permute_2D over rows of lens.view(F*W, B); else permute_1D over bags.
  const int64_t per = variable ? 1 : cols / W;
  const int64_t nseg = static_cast<int64_t>(p.forward_recat.size());
  p.segment_lengths.assign(static_cast<size_t>(nseg), 0);
  for (int64_t t = 0; t < nseg; ++t)
    for (int64_t b = 0; b < per; ++b) p.segment_lengths[t] += lens[t * per + b];
  if (!c.output_splits || static_cast<int64_t>(c.output_splits->size()) != W)
    fail(s, "output_splits", "missing or not of length W");
  const std::vector<int64_t>& os = *c.output_splits;
  if (sum(os) != p.rows || std::any_of(os.begin(), os.end(), [](int64_t x) { return x < 0; }))
    fail(s, "output_splits",
         vec_str(os) + " (send splits / D) does not split the " + std::to_string(p.rows) +
             " rows of local_embs");
  p.send_off = complete_cumsum(os);
  return p;
}

}  // namespace

SequenceDistCheck check_sequence_dist(const Plan& plan,
                                      const std::vector<const EmbTensor*>& local_embs,
                                      const std::vector<const ShardingContext*>& ctx) {
  const int64_t W = plan.world_size;
  SequenceDistCheck out;
  for (int64_t s = 0; s < W; ++s)
    out.senders.push_back(check_sender(plan, s, *local_embs[s], *ctx[s]));
  // Every receiver is checked before any output is produced.
  out.recv_off.resize(static_cast<size_t>(W));
  for (int64_t d = 0; d < W; ++d) {
    const ShardingContext& c = *ctx[d];
    if (!c.unbucketize_permute) fail(d, "unbucketize_permute", "missing");
    if (W == 1) {
      out.recv_off[d] = out.senders[d].send_off;
    } else {
      if (!c.input_splits || static_cast<int64_t>(c.input_splits->size()) != W)
        fail(d, "input_splits", "missing or not of length W");
      const std::vector<int64_t>& is = *c.input_splits;
      for (int64_t s = 0; s < W; ++s) {
        const std::vector<int64_t>& so = out.senders[s].send_off;
        const int64_t sent = so[d + 1] - so[d];
        if (is[s] != sent)
          fail(d, "input_splits",
               "expects " + std::to_string(is[s]) + " rows from rank " + std::to_string(s) +
                   " but rank " + std::to_string(s) + " sends " + std::to_string(sent) +
                   " (its output_splits[" + std::to_string(d) + "])");
      }
      out.recv_off[d] = complete_cumsum(is);
    }
    const int64_t R = out.recv_off[d].back();
    const std::vector<int64_t>& perm = *c.unbucketize_permute;
    for (size_t i = 0; i < perm.size(); ++i)
      if (perm[i] < 0 || perm[i] >= R)
        fail(d, "unbucketize_permute",
             "entry " + std::to_string(i) + " = " + std::to_string(perm[i]) + " outside the " +
                 std::to_string(R) + " received rows");
  }
  return out;
}

PooledDistCheck check_pooled_dist(const Plan& plan, bool variable_batch,
                                  const std::vector<const EmbTensor*>& local_embs,
                                  const std::vector<const ShardingContext*>& ctx) {
  const int64_t W = plan.world_size, F = plan.num_features();
  PooledDistCheck out;
  std::vector<std::vector<int64_t>>& chunk_off = out.chunk_off;
  std::vector<int64_t>& chunk_len = out.chunk_len;
  chunk_off.resize(static_cast<size_t>(W));
  chunk_len.resize(static_cast<size_t>(W));
  if (!variable_batch) {
    const int64_t sumD = plan.sum_dim;
    std::vector<std::vector<int64_t>> bspr(W);
    for (int64_t d = 0; d < W; ++d) {
      const EmbTensor& E = *local_embs[d];
      if (E.shape.size() != 2 || E.cols() != sumD)
        fail(d, "local_embs", "shape must be [sum_s B_s, " + std::to_string(sumD) + "]");
      if (ctx[d]->batch_size_per_rank) {
        bspr[d] = *ctx[d]->batch_size_per_rank;
      } else {  // ctx without batch sizes: equal-split reduce_scatter_tensor
        if (E.rows() % W != 0)
          fail(d, "batch_size_per_rank",
               "missing, and " + std::to_string(E.rows()) +
                   " rows do not split evenly over W ranks");
        bspr[d].assign(W, E.rows() / W);
      }
      if (static_cast<int64_t>(bspr[d].size()) != W || sum(bspr[d]) != E.rows() ||
          std::any_of(bspr[d].begin(), bspr[d].end(), [](int64_t x) { return x < 0; }))
        fail(d, "batch_size_per_rank",
             vec_str(bspr[d]) + " does not split the " + std::to_string(E.rows()) +
                 " rows of local_embs over " + std::to_string(W) + " ranks");
      chunk_off[d] = complete_cumsum(bspr[d]);
      for (int64_t& x : chunk_off[d]) x *= sumD;
    }
    // Receiver-major, so the rank blamed is the sender whose view differs from the receiver's.
    for (int64_t r = 0; r < W; ++r)
      for (int64_t d = 0; d < W; ++d)
        if (bspr[d][r] != bspr[r][r])
          fail(d, "batch_size_per_rank",
               "gives rank " + std::to_string(r) + " " + std::to_string(bspr[d][r]) +
                   " rows but rank " + std::to_string(r) + " expects " +
                   std::to_string(bspr[r][r]) + ": the reduce-scatter cannot match");
    for (int64_t r = 0; r < W; ++r) chunk_len[r] = bspr[r][r] * sumD;
  } else {
    std::vector<std::vector<int64_t>> splits(W, std::vector<int64_t>(W, 0));
    for (int64_t d = 0; d < W; ++d) {
      const auto& b = ctx[d]->batch_size_per_rank_per_feature;
      if (!b || static_cast<int64_t>(b->size()) != W)
        fail(d, "batch_size_per_rank_per_feature", "missing or not [W][F]");
      for (int64_t r = 0; r < W; ++r) {
        if (static_cast<int64_t>((*b)[r].size()) != F)
          fail(d, "batch_size_per_rank_per_feature", "row " + std::to_string(r) + " is not [F]");
        for (int64_t f = 0; f < F; ++f) splits[d][r] += (*b)[r][f] * plan.features[f].dim;
      }
      // input_splits[r] = sum_f B_{r,f} * D_f elements (§7.2).
      if (local_embs[d]->numel() != sum(splits[d]) || local_embs[d]->shape.size() != 1)
        fail(d, "batch_size_per_rank_per_feature",
             "input splits " + vec_str(splits[d]) + " do not cover the " +
                 std::to_string(local_embs[d]->numel()) + " elements of the 1-D local_embs");
      chunk_off[d] = complete_cumsum(splits[d]);
    }
    for (int64_t r = 0; r < W; ++r)
      for (int64_t d = 0; d < W; ++d)
        if (splits[d][r] != splits[r][r])
          fail(d, "batch_size_per_rank_per_feature",
               "sends " + std::to_string(splits[d][r]) + " elements to rank " + std::to_string(r) +
                   " which expects " + std::to_string(splits[r][r]));
    for (int64_t r = 0; r < W; ++r) chunk_len[r] = splits[r][r];
  }
  return out;
}

// Tensors of the refs' dtypes and shapes, no data: what the checks above read.
std::vector<EmbTensor> shape_stand_ins(const std::vector<TensorRef>& local_embs) {
  std::vector<EmbTensor> out;
  out.reserve(local_embs.size());
  for (size_t r = 0; r < local_embs.size(); ++r) {
    if (!local_embs[r].shape)
      throw Error("output dist: local_embs of rank " + std::to_string(r) + " has no shape");
    out.push_back(EmbTensor{local_embs[r].dtype, *local_embs[r].shape, {}});
  }
  return out;
}

std::vector<const EmbTensor*> tensor_pointers(const std::vector<EmbTensor>& t) {
  std::vector<const EmbTensor*> p;
  p.reserve(t.size());
  for (const EmbTensor& e : t) p.push_back(&e);
  return p;
}

SequenceDistCheck check_sequence_dist(const Plan& plan, const std::vector<TensorRef>& local_embs,
                                      const std::vector<const ShardingContext*>& ctx) {
  const std::vector<EmbTensor> shapes = shape_stand_ins(local_embs);
  return check_sequence_dist(plan, tensor_pointers(shapes), ctx);
}

PooledDistCheck check_pooled_dist(const Plan& plan, bool variable_batch,
                                  const std::vector<TensorRef>& local_embs,
                                  const std::vector<const ShardingContext*>& ctx) {
  const std::vector<EmbTensor> shapes = shape_stand_ins(local_embs);
  return check_pooled_dist(plan, variable_batch, tensor_pointers(shapes), ctx);
}

}  // namespace dynemb
