#include "engine/dest_blocks.hpp"

#include <algorithm>
#include <cstdint>

#include "engine/ops.hpp"

namespace dynemb {
namespace {

void finish(DestBlock& b) {
  b.starts.assign(1, 0);
  for (const auto& [a, e] : b.ranges) b.starts.push_back(b.starts.back() + (e - a));
}

// Rows [r0, r1) of the sender's local_embs appended to b's ranges (merged with the last when
// they continue it); false when they lie before its end (the send order is not increasing).
bool append_rows(DestBlock& b, int64_t r0, int64_t r1) {
  if (!b.ranges.empty() && r0 < b.ranges.back().second) return false;
  if (!b.ranges.empty() && r0 == b.ranges.back().second)
    b.ranges.back().second = r1;
  else
    b.ranges.emplace_back(r0, r1);
  return true;
}

}  // namespace

int64_t DestBlock::numel() const {
  int64_t n = 1;
  for (int64_t x : shape) n *= x;
  return shape.empty() ? 0 : n;
}

int64_t DestBlock::to_whole(int64_t e) const {
  const int64_t unit = e / row_elems;
  // The range holding `unit`: the last whose start is <= unit.
  const size_t i =
      size_t(std::upper_bound(starts.begin(), starts.end(), unit) - starts.begin()) - 1;
  return (ranges[i].first + (unit - starts[i])) * row_elems + e % row_elems;
}

std::optional<DestBlock> sequence_block(const SequenceSendPlan& sp, int64_t d, int64_t D) {
  DestBlock b;
  b.row_elems = D;
  // Input segment t starts at in_off[t]; the send buffer is the segments in forward_recat
  // order, and d's chunk is [send_off[d], send_off[d + 1]) of it.
  const std::vector<int64_t> in_off = complete_cumsum(sp.segment_lengths);
  const int64_t lo = sp.send_off[size_t(d)], hi = sp.send_off[size_t(d) + 1];
  int64_t pos = 0;
  for (size_t k = 0; k < sp.forward_recat.size() && pos < hi; ++k) {
    const int64_t t = sp.forward_recat[k], len = sp.segment_lengths[size_t(t)];
    const int64_t a = std::max(lo, pos), e = std::min(hi, pos + len);
    if (a < e) {
      const int64_t r0 = in_off[size_t(t)] + (a - pos);
      if (!append_rows(b, r0, r0 + (e - a))) return std::nullopt;
    }
    pos += len;
  }
  finish(b);
  b.shape = {b.starts.back(), D};
  return b;
}

std::optional<std::vector<DestBlock>> sequence_blocks(const SequenceSendPlan& sp, int64_t D) {
  const int64_t W = int64_t(sp.send_off.size()) - 1;
  std::vector<DestBlock> out(size_t(std::max<int64_t>(W, 0)));
  for (DestBlock& b : out) b.row_elems = D;
  const std::vector<int64_t> in_off = complete_cumsum(sp.segment_lengths);
  // One walk of the send buffer: segment pieces in send order, each cut at the destination
  // boundaries send_off[d + 1] it crosses.
  int64_t pos = 0, d = 0;
  for (size_t k = 0; k < sp.forward_recat.size() && d < W; ++k) {
    const int64_t t = sp.forward_recat[k], len = sp.segment_lengths[size_t(t)];
    for (int64_t a = pos; a < pos + len;) {
      while (d < W && sp.send_off[size_t(d) + 1] <= a) ++d;  // send_off is non-decreasing
      if (d == W) break;
      const int64_t e = std::min(pos + len, sp.send_off[size_t(d) + 1]);
      DestBlock& b = out[size_t(d)];
      const int64_t r0 = in_off[size_t(t)] + (a - pos);
      if (!append_rows(b, r0, r0 + (e - a))) return std::nullopt;
      a = e;
    }
    pos += len;
  }
  for (DestBlock& b : out) {
    finish(b);
    b.shape = {b.starts.back(), D};
  }
  return out;
}

DestBlock pooled_block(const PooledDistCheck& chk, int64_t s, int64_t d, int64_t sum_D,
                       bool variable_batch) {
  DestBlock b;
  const int64_t off = chk.chunk_off[size_t(s)][size_t(d)], n = chk.chunk_len[size_t(d)];
  if (variable_batch) {
    if (n > 0) b.ranges.emplace_back(off, off + n);
    b.shape = {n};
  } else {
    b.row_elems = std::max<int64_t>(1, sum_D);
    if (n > 0) b.ranges.emplace_back(off / b.row_elems, (off + n) / b.row_elems);
    b.shape = {n / b.row_elems, sum_D};
  }
  finish(b);
  return b;
}

DestBlock block_rows(const DestBlock& b, int64_t r0, int64_t r1) {
  DestBlock out;
  out.row_elems = b.row_elems;
  if (r1 > r0) out.ranges.emplace_back(b.ranges.at(0).first + r0, b.ranges.at(0).first + r1);
  out.shape = {r1 - r0, b.shape.at(1)};
  finish(out);
  return out;
}

LookupKjt lookup_kjt_from(const LookupKjt& k, int64_t d) {
  return lookup_kjt_from(k, d, 0, INT64_MAX);
}

LookupKjt lookup_kjt_from(const LookupKjt& k, int64_t d, int64_t b0, int64_t b1) {
  return lookup_kjt_from(k, lookup_kjt_index(k), d, b0, b1);
}

LookupKjtIndex lookup_kjt_index(const LookupKjt& k) {
  LookupKjtIndex ix;
  ix.bags.reserve(size_t(k.num_features * k.world_size) + 1);
  ix.bags.push_back(0);
  for (int64_t f = 0; f < k.num_features; ++f)
    for (int64_t s = 0; s < k.world_size; ++s)
      ix.bags.push_back(ix.bags.back() + k.stride_per_key_per_rank[size_t(f)][size_t(s)]);
  ix.values = complete_cumsum(k.lengths);
  return ix;
}

LookupKjt lookup_kjt_from(const LookupKjt& k, const LookupKjtIndex& ix, int64_t d, int64_t b0,
                          int64_t b1) {
  LookupKjt out;
  out.num_features = k.num_features;
  out.world_size = 1;
  out.variable_batch = k.variable_batch;
  out.stride_per_key_per_rank.resize(size_t(k.num_features));
  const bool weighted = !k.weights.empty();
  for (int64_t f = 0; f < k.num_features; ++f) {
    // Bags [j + c0, j + c1) of (f, d), values [v0, v1).
    const int64_t j = ix.bags[size_t(f * k.world_size + d)];
    const int64_t nb = k.stride_per_key_per_rank[size_t(f)][size_t(d)];
    const int64_t c0 = std::min(b0, nb), c1 = std::min(b1, nb);
    const int64_t v0 = ix.values[size_t(j + c0)], v1 = ix.values[size_t(j + c1)];
    out.stride_per_key_per_rank[size_t(f)] = {c1 - c0};
    out.lengths.insert(out.lengths.end(), k.lengths.begin() + j + c0, k.lengths.begin() + j + c1);
    out.values.insert(out.values.end(), k.values.begin() + v0, k.values.begin() + v1);
    if (weighted)
      out.weights.insert(out.weights.end(), k.weights.begin() + v0, k.weights.begin() + v1);
  }
  return out;
}

int64_t lookup_kjt_from_ids(const LookupKjt& k, const LookupKjtIndex& ix, int64_t d, int64_t b0,
                            int64_t b1) {
  int64_t n = 0;
  for (int64_t f = 0; f < k.num_features; ++f) {
    const int64_t j = ix.bags[size_t(f * k.world_size + d)];
    const int64_t nb = k.stride_per_key_per_rank[size_t(f)][size_t(d)];
    n += ix.values[size_t(j + std::min(b1, nb))] - ix.values[size_t(j + std::min(b0, nb))];
  }
  return n;
}

Kjt kjt_samples(const Kjt& kjt, int64_t b0, int64_t b1) {
  Kjt out;
  out.num_features = kjt.num_features;
  out.weighted = kjt.weighted;
  out.lengths_type = kjt.lengths_type;
  out.values_type = kjt.values_type;
  const int64_t B = kjt.stride();
  b0 = std::clamp<int64_t>(b0, 0, B);
  b1 = std::clamp<int64_t>(b1, b0, B);
  const std::vector<int64_t> off = kjt.offsets();
  for (int64_t f = 0; f < kjt.num_features; ++f) {
    const int64_t j0 = f * B + b0, j1 = f * B + b1;
    out.lengths.insert(out.lengths.end(), kjt.lengths.begin() + j0, kjt.lengths.begin() + j1);
    out.values.insert(out.values.end(), kjt.values.begin() + off[size_t(j0)],
                      kjt.values.begin() + off[size_t(j1)]);
    if (kjt.weighted)
      out.weights.insert(out.weights.end(), kjt.weights.begin() + off[size_t(j0)],
                         kjt.weights.begin() + off[size_t(j1)]);
  }
  return out;
}

Tensor sequence_destination_output(const Plan& plan, Backend& backend, const EmbTensor& recv,
                                   const ShardingContext& ctx, Place place) {
  Plan one = plan;
  one.world_size = 1;
  ShardingContext c;
  c.unbucketize_permute = ctx.unbucketize_permute;
  Tensor out;
  backend.sequence_output_dist(one, {TensorRef(recv)}, {&c}, place,
                               [&](int, Tensor&& o) { out = std::move(o); });
  return out;
}

Tensor destination_output(const Plan& plan, Backend& backend, int64_t d,
                          std::vector<EmbTensor>& blocks,
                          const std::vector<const ShardingContext*>& ctx, bool variable_batch,
                          Place place) {
  const int64_t W = plan.world_size;
  const bool pooled = plan.module == ModuleKind::pooled;
  Tensor out;
  const auto take = [&](int r, Tensor&& o) {
    if (r == (pooled ? d : 0)) out = std::move(o);
  };
  if (!pooled) {
    EmbTensor recv{blocks[0].dtype, {0, plan.seq_dim()}, {}};
    for (EmbTensor& b : blocks) {
      recv.data.insert(recv.data.end(), b.data.begin(), b.data.end());
      recv.shape[0] += b.rows();
      b = EmbTensor{};
    }
    return sequence_destination_output(plan, backend, recv, *ctx[size_t(d)], place);
  }
  std::vector<ShardingContext> only_d(static_cast<size_t>(W));
  std::vector<const ShardingContext*> only_d_ptr(static_cast<size_t>(W));
  std::vector<TensorRef> local(static_cast<size_t>(W));
  for (int64_t s = 0; s < W; ++s) {
    ShardingContext& c = only_d[size_t(s)];
    if (variable_batch) {
      const auto& bf = *ctx[size_t(s)]->batch_size_per_rank_per_feature;
      c.batch_size_per_rank_per_feature = std::vector<std::vector<int64_t>>(
          size_t(W), std::vector<int64_t>(bf[size_t(d)].size(), 0));
      (*c.batch_size_per_rank_per_feature)[size_t(d)] = bf[size_t(d)];
    } else {
      c.batch_size_per_rank = std::vector<int64_t>(size_t(W), 0);
      (*c.batch_size_per_rank)[size_t(d)] = blocks[size_t(s)].rows();
    }
    only_d_ptr[size_t(s)] = &c;
    local[size_t(s)] = TensorRef(blocks[size_t(s)]);
  }
  backend.pooled_output_dist(plan, variable_batch, local, only_d_ptr, place, take);
  return out;
}

}  // namespace dynemb
