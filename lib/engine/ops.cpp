#include "engine/ops.hpp"

#include <algorithm>
#include <string>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "common/parallel.hpp"

namespace dynemb {

Route route_id(DistType dist, int64_t id, IndexType t, int64_t blk, int64_t W) {
  const uint64_t x = index_unsigned(id, t);
  const uint64_t w = static_cast<uint64_t>(W);
  Route r;
  switch (dist) {
    case DistType::continuous: {
      // FBGEMM computes in uindex_t: blk*W wraps for int32 ids just like the kernel.
      uint64_t G = static_cast<uint64_t>(blk) * w;
      const uint64_t L = static_cast<uint64_t>(blk);
      if (t == IndexType::i32) G = static_cast<uint32_t>(G);
      if (x < G) {
        r.dest = static_cast<int64_t>(x / L);
        r.local = index_store(x % L, t);
      } else {
        r.dest = static_cast<int64_t>(x % w);
        r.local = index_store(x / w, t);
      }
      break;
    }
    case DistType::roundrobin:
      r.dest = static_cast<int64_t>(x % w);
      r.local = id;
      break;
    case DistType::hash_roundrobin: {
      uint64_t h = fmix64(x);
      if (t == IndexType::i32) h = static_cast<uint32_t>(h);  // cast to the unsigned index type
      r.dest = static_cast<int64_t>(h % w);
      r.local = id;
      break;
    }
  }
  return r;
}

Route route_block_bucketize_pos(const std::vector<int64_t>& pos, int64_t id, IndexType t,
                                int64_t W) {
  const uint64_t x = index_unsigned(id, t);
  // lb = upper_bound(pos, x) - 1, comparing in the unsigned domain (pos are >= 0).
  const auto it = std::upper_bound(pos.begin(), pos.end(), x, [](uint64_t v, int64_t p) {
    return v < static_cast<uint64_t>(p);
  });
  const int64_t lb = static_cast<int64_t>(it - pos.begin()) - 1;
  Route r;
  if (lb >= 0 && lb < W) {
    r.dest = lb;
    r.local = index_store(x - static_cast<uint64_t>(pos[lb]), t);
  } else {
    r.dest = static_cast<int64_t>(x % static_cast<uint64_t>(W));
    r.local = index_store(x / static_cast<uint64_t>(W), t);
  }
  return r;
}

BucketizedKjt block_bucketize_sparse_features(
    const Kjt& kjt, const std::vector<int64_t>& block_sizes,
    const std::vector<DistType>& dist_types, int64_t my_size,
    const std::vector<std::vector<int64_t>>* block_bucketize_pos) {
  const int64_t F = kjt.num_features;
  const int64_t L = kjt.num_bags();
  const int64_t N = kjt.num_ids();
  const int64_t W = my_size;
  BucketizedKjt out;
  out.new_lengths.assign(static_cast<size_t>(W * L), 0);
  out.new_values.resize(static_cast<size_t>(N));
  if (kjt.weighted) out.new_weights.resize(static_cast<size_t>(N));
  out.unbucketize_permute.resize(static_cast<size_t>(N));
  out.dest_rank.resize(static_cast<size_t>(N));
  std::vector<int64_t> local(static_cast<size_t>(N));
  // Pass 1: route every id and count new_lengths[p*L + j] (bucket-major, then flat bag j).
  int64_t i = 0;
  for (int64_t f = 0; f < F; ++f) {
    const int64_t j0 = kjt.bag_begin(f), nb = kjt.batch_size(f);
    const std::vector<int64_t>* pos =
        block_bucketize_pos && !(*block_bucketize_pos)[size_t(f)].empty()
            ? &(*block_bucketize_pos)[size_t(f)]
            : nullptr;
    for (int64_t j = j0; j < j0 + nb; ++j) {
      for (int64_t k = 0; k < kjt.lengths[j]; ++k, ++i) {
        const Route r =
            pos ? route_block_bucketize_pos(*pos, kjt.values[i], kjt.values_type, W)
                : route_id(dist_types[f], kjt.values[i], kjt.values_type, block_sizes[f], W);
        out.dest_rank[i] = r.dest;
        local[i] = r.local;
        ++out.new_lengths[r.dest * L + j];
      }
    }
  }
  // Pass 2: stable placement; pos = new_offsets[p*L + j]++ in increasing i (§3.3).
  std::vector<int64_t> next(out.new_lengths.size());
  int64_t acc = 0;
  for (size_t q = 0; q < next.size(); ++q) {
    next[q] = acc;
    acc += out.new_lengths[q];
  }
  i = 0;
  for (int64_t f = 0; f < F; ++f) {
    const int64_t j0 = kjt.bag_begin(f), nb = kjt.batch_size(f);
    for (int64_t j = j0; j < j0 + nb; ++j) {
      for (int64_t k = 0; k < kjt.lengths[j]; ++k, ++i) {
        const int64_t pos = next[out.dest_rank[i] * L + j]++;
        out.new_values[pos] = local[i];
        if (kjt.weighted) out.new_weights[pos] = kjt.weights[i];
        out.unbucketize_permute[i] = pos;
      }
    }
  }
  return out;
}

std::vector<int32_t> get_recat(int64_t F, int64_t W) {
  std::vector<int32_t> recat(static_cast<size_t>(F * W));
  for (int64_t f = 0; f < F; ++f)
    for (int64_t s = 0; s < W; ++s) recat[f * W + s] = static_cast<int32_t>(s * F + f);
  return recat;
}

std::vector<int64_t> expand_into_jagged_permute(const std::vector<int64_t>& permute,
                                                const std::vector<int64_t>& input_offsets,
                                                const std::vector<int64_t>& output_offsets,
                                                int64_t output_size) {
  if (output_offsets.size() != permute.size() + 1)
    throw Error("expand_into_jagged_permute: output_offsets has " +
                std::to_string(output_offsets.size()) + " entries, want " +
                std::to_string(permute.size() + 1));
  std::vector<int64_t> out(static_cast<size_t>(output_size));
  const int64_t T = static_cast<int64_t>(input_offsets.size()) - 1;
  for (size_t k = 0; k < permute.size(); ++k) {
    const int64_t src = permute[k];
    if (src < 0 || src >= T)
      throw Error("expand_into_jagged_permute: permute[" + std::to_string(k) +
                  "] = " + std::to_string(src) + " outside [0, " + std::to_string(T) + ")");
    const int64_t n = output_offsets[k + 1] - output_offsets[k];
    if (n != input_offsets[src + 1] - input_offsets[src] || output_offsets[k + 1] > output_size)
      throw Error("expand_into_jagged_permute: segment " + std::to_string(k) +
                  " sizes differ between input and output");
    for (int64_t i = 0; i < n; ++i) out[output_offsets[k] + i] = input_offsets[src] + i;
  }
  return out;
}

std::vector<int64_t> invert_permute(const std::vector<int64_t>& permute) {
  const int64_t n = static_cast<int64_t>(permute.size());
  std::vector<int64_t> inv(permute.size(), -1);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t p = permute[k];
    if (p < 0 || p >= n || inv[p] != -1)
      throw Error("invert_permute: not a permutation of [0, " + std::to_string(n) + "): entry " +
                  std::to_string(k) + " = " + std::to_string(p));
    inv[p] = k;
  }
  return inv;
}

std::vector<int64_t> complete_cumsum(const std::vector<int64_t>& v) {
  std::vector<int64_t> o(v.size() + 1, 0);
  for (size_t i = 0; i < v.size(); ++i) o[i + 1] = o[i] + v[i];
  return o;
}

int64_t LookupOutputLayout::numel() const {
  int64_t n = shape.empty() ? 0 : 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> lookup_output_shape(const Plan& plan, const LookupKjt& k) {
  const int64_t F = k.num_features, W = k.world_size;
  if (plan.module == ModuleKind::sequence)
    return {static_cast<int64_t>(k.values.size()), plan.seq_dim()};
  int64_t n = 0;
  if (!k.variable_batch) {
    for (int64_t s = 0; s < W; ++s) n += F ? k.stride_per_key_per_rank[0][s] : 0;
    return {n, plan.sum_dim};
  }
  for (int64_t s = 0; s < W; ++s)
    for (int64_t f = 0; f < F; ++f) n += k.stride_per_key_per_rank[f][s] * plan.features[f].dim;
  return {n};
}

LookupOutputLayout lookup_output_layout(const Plan& plan, const LookupKjt& k) {
  const int64_t F = k.num_features, W = k.world_size;
  LookupOutputLayout L;
  std::vector<int64_t> bags_f(static_cast<size_t>(F), 0);
  for (int64_t f = 0; f < F; ++f)
    for (int64_t s = 0; s < W; ++s) bags_f[size_t(f)] += k.stride_per_key_per_rank[f][s];
  L.bag0 = complete_cumsum(bags_f);
  if (plan.module == ModuleKind::sequence) {
    L.shape = {static_cast<int64_t>(k.values.size()), plan.seq_dim()};
    return L;
  }
  L.dst.resize(size_t(L.bag0.back()));
  if (!k.variable_batch) {
    int64_t rows = 0;
    for (int64_t s = 0; s < W; ++s) rows += F ? k.stride_per_key_per_rank[0][s] : 0;
    L.shape = {rows, plan.sum_dim};
    for (int64_t f = 0; f < F; ++f)
      for (int64_t j = 0; j < bags_f[size_t(f)]; ++j)
        L.dst[size_t(L.bag0[f] + j)] = j * plan.sum_dim + plan.features[f].column_offset;
    return L;
  }
  int64_t acc = 0;
  std::vector<std::vector<int64_t>> start(static_cast<size_t>(W),
                                          std::vector<int64_t>(static_cast<size_t>(F)));
  for (int64_t s = 0; s < W; ++s)
    for (int64_t f = 0; f < F; ++f) {
      start[size_t(s)][size_t(f)] = acc;
      acc += k.stride_per_key_per_rank[f][s] * plan.features[f].dim;
    }
  L.shape = {acc};
  for (int64_t f = 0; f < F; ++f) {
    int64_t j = L.bag0[f];
    for (int64_t s = 0; s < W; ++s)
      for (int64_t b = 0; b < k.stride_per_key_per_rank[f][s]; ++b)
        L.dst[size_t(j++)] = start[size_t(s)][size_t(f)] + b * plan.features[f].dim;
  }
  return L;
}

namespace {
// Segment permute shared by the 1-D and 2-D ops: segment = `B` consecutive bags.
SparseData permute_rows(const std::vector<int64_t>& permute, const std::vector<int64_t>& lengths,
                        int64_t T, int64_t B, const std::vector<int64_t>& values,
                        const std::vector<float>& weights, const char* op) {
  if (B < 0 || T < 0 || static_cast<int64_t>(lengths.size()) != T * B)
    throw Error(std::string(op) + ": lengths of size " + std::to_string(lengths.size()) +
                " cannot be viewed as rows of " + std::to_string(B));
  const std::vector<int64_t> off = complete_cumsum(lengths);
  if (off.back() != static_cast<int64_t>(values.size()))
    throw Error(std::string(op) + ": lengths sum to " + std::to_string(off.back()) + " but " +
                std::to_string(values.size()) + " values");
  const bool w = !weights.empty();
  SparseData out;
  out.lengths.reserve(permute.size() * static_cast<size_t>(B));
  int64_t total = 0;
  for (size_t k = 0; k < permute.size(); ++k) {
    const int64_t r = permute[k];
    if (r < 0 || r >= T)
      throw Error(std::string(op) + ": permute[" + std::to_string(k) + "] = " + std::to_string(r) +
                  " outside [0, " + std::to_string(T) + ")");
    total += off[(r + 1) * B] - off[r * B];
  }
  out.values.reserve(static_cast<size_t>(total));
  if (w) out.weights.reserve(static_cast<size_t>(total));
  for (int64_t r : permute) {
    out.lengths.insert(out.lengths.end(), lengths.begin() + r * B, lengths.begin() + (r + 1) * B);
    out.values.insert(out.values.end(), values.begin() + off[r * B],
                      values.begin() + off[(r + 1) * B]);
    if (w)
      out.weights.insert(out.weights.end(), weights.begin() + off[r * B],
                         weights.begin() + off[(r + 1) * B]);
  }
  return out;
}
}  // namespace

SparseData permute_2D_sparse_data(const std::vector<int64_t>& permute,
                                  const std::vector<int64_t>& lengths, int64_t T, int64_t B,
                                  const std::vector<int64_t>& values,
                                  const std::vector<float>& weights) {
  return permute_rows(permute, lengths, T, B, values, weights, "permute_2D_sparse_data");
}

SparseData permute_1D_sparse_data(const std::vector<int64_t>& permute,
                                  const std::vector<int64_t>& lengths,
                                  const std::vector<int64_t>& values,
                                  const std::vector<float>& weights) {
  return permute_rows(permute, lengths, static_cast<int64_t>(lengths.size()), 1, values, weights,
                      "permute_1D_sparse_data");
}

Kjt pad_vbe_kjt_lengths(const Kjt& kjt) {
  if (!kjt.is_vbe()) return kjt;
  Kjt out = kjt;
  const int64_t F = kjt.num_features, B = kjt.stride();
  out.stride_per_feature.clear();
  out.lengths.assign(static_cast<size_t>(F * B), 0);
  for (int64_t f = 0; f < F; ++f)
    for (int64_t b = 0; b < kjt.batch_size(f); ++b)
      out.lengths[f * B + b] = kjt.lengths[kjt.bag_begin(f) + b];
  return out;
}

BucketizedKjt bucketize_on_host(const Plan& plan, const Kjt& kjt) {
  std::vector<int64_t> blk;
  std::vector<DistType> dt;
  std::vector<std::vector<int64_t>> pos;
  bool by_pos = false;
  for (const FeatureInfo& f : plan.features) {
    blk.push_back(f.block_size);
    dt.push_back(f.dist_type);
    pos.push_back(f.bucketize_pos);
    by_pos = by_pos || !f.bucketize_pos.empty();
  }
  return block_bucketize_sparse_features(kjt, blk, dt, plan.world_size, by_pos ? &pos : nullptr);
}

KjtAllToAllResult kjt_all_to_all(const Plan& plan, const std::vector<const Kjt*>& kjts,
                                 const std::vector<const BucketizedKjt*>& bucketized) {
  const int64_t W = plan.world_size, F = plan.num_features();
  KjtAllToAllResult res;
  for (const Kjt* k : kjts) res.variable_batch = res.variable_batch || k->is_vbe();
  // strides[s][f] = B_{s,f} (= B_s when not VBE); L[s] = bags of rank s.
  std::vector<std::vector<int64_t>> strides(W, std::vector<int64_t>(F));
  std::vector<int64_t> L(W), B(W);
  for (int64_t s = 0; s < W; ++s) {
    for (int64_t f = 0; f < F; ++f) strides[s][f] = kjts[s]->batch_size(f);
    L[s] = kjts[s]->num_bags();
    B[s] = kjts[s]->stride();
  }
  // Splits a2a (§4.1): input_splits[s][d] = ids of s routed to d.
  std::vector<std::vector<int64_t>> input_splits(W, std::vector<int64_t>(W, 0));
  for (int64_t s = 0; s < W; ++s)
    for (int64_t d = 0; d < W; ++d)
      for (int64_t j = 0; j < L[s]; ++j)
        input_splits[s][d] += bucketized[s]->new_lengths[d * L[s] + j];
  const bool weighted = !kjts.empty() && kjts[0]->weighted;
  const std::vector<int32_t> recat = get_recat(F, W);
  const bool equal_b = std::all_of(B.begin(), B.end(), [&](int64_t b) { return b == B[0]; });
  res.lookup_kjts.resize(W);
  res.ctx.resize(W);
  // Each destination's receive, permute and context on its own core: they share only inputs.
  parallel_for(
      hardware_threads(), W,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          // Received buffers, source-rank major: (s, f, b) lengths, (s, f, b, pos) values.
          std::vector<int64_t> rl, rv;
          std::vector<float> rw;
          for (int64_t s = 0; s < W; ++s) {
            const BucketizedKjt& bk = *bucketized[s];
            rl.insert(rl.end(), bk.new_lengths.begin() + r * L[s],
                      bk.new_lengths.begin() + (r + 1) * L[s]);
            int64_t v0 = 0;
            for (int64_t d = 0; d < r; ++d) v0 += input_splits[s][d];
            const int64_t n = input_splits[s][r];
            rv.insert(rv.end(), bk.new_values.begin() + v0, bk.new_values.begin() + v0 + n);
            if (weighted)
              rw.insert(rw.end(), bk.new_weights.begin() + v0, bk.new_weights.begin() + v0 + n);
          }
          LookupKjt& lk = res.lookup_kjts[r];
          lk.num_features = F;
          lk.world_size = W;
          lk.variable_batch = res.variable_batch;
          lk.stride_per_key_per_rank.assign(F, std::vector<int64_t>(W));
          for (int64_t f = 0; f < F; ++f)
            for (int64_t s = 0; s < W; ++s) lk.stride_per_key_per_rank[f][s] = strides[s][f];
          ShardingContext& ctx = res.ctx[r];
          std::vector<int32_t> ctx_recat = recat;
          if (W == 1) {
            // §4.3: the awaitables hand back the bucketized KJT unchanged; recat stays identity.
            lk.lengths = std::move(rl);
            lk.values = std::move(rv);
            lk.weights = std::move(rw);
          } else if (!res.variable_batch && equal_b) {
            SparseData p = permute_2D_sparse_data(to_i64(recat), rl, W * F, B[0], rv, rw);
            lk.lengths = std::move(p.lengths);
            lk.values = std::move(p.values);
            lk.weights = std::move(p.weights);
          } else {
            // Per-bag expansion: input segments (s, f) of B_{s,f} bags, output segments (f, s).
            std::vector<int64_t> in_sizes, out_sizes;
            for (int64_t s = 0; s < W; ++s)
              for (int64_t f = 0; f < F; ++f) in_sizes.push_back(strides[s][f]);
            for (int64_t f = 0; f < F; ++f)
              for (int64_t s = 0; s < W; ++s) out_sizes.push_back(strides[s][f]);
            const std::vector<int64_t> in_off = complete_cumsum(in_sizes);
            const std::vector<int64_t> out_off = complete_cumsum(out_sizes);
            const std::vector<int64_t> expanded =
                expand_into_jagged_permute(to_i64(recat), in_off, out_off, out_off.back());
            SparseData p = permute_1D_sparse_data(expanded, rl, rv, rw);
            lk.lengths = std::move(p.lengths);
            lk.values = std::move(p.values);
            lk.weights = std::move(p.weights);
            // The context stores the expanded recat when the B_s differ; VBE keeps the plain one.
            if (!res.variable_batch) ctx_recat.assign(expanded.begin(), expanded.end());
          }
          // §4.4 contexts.
          ctx.input_splits = input_splits[r];
          std::vector<int64_t> out_splits(W);
          for (int64_t s = 0; s < W; ++s) out_splits[s] = input_splits[s][r];
          ctx.output_splits = out_splits;
          ctx.sparse_features_recat = ctx_recat;
          if (res.variable_batch) {
            ctx.batch_size_per_rank_per_feature = strides;  // [W][F]
          } else {
            ctx.batch_size_per_rank = B;
          }
          if (plan.module == ModuleKind::sequence) {
            ctx.unbucketize_permute = bucketized[r]->unbucketize_permute;
            ctx.lengths_after_input_dist = lk.lengths;
            int64_t cols = 0;
            for (int64_t s = 0; s < W; ++s) cols += B[s];
            ctx.lengths_after_input_dist_cols = cols;
          } else {
            ctx.variable_batch_per_feature = res.variable_batch;
            std::vector<int64_t> pre(F);
            for (int64_t f = 0; f < F; ++f) pre[f] = kjts[r]->batch_size(f);
            ctx.batch_size_per_feature_pre_a2a = pre;
          }
        }
      },
      /*grain=*/1);
  return res;
}

RowRef lookup_row(const Plan& plan, int64_t f, int64_t rank, int64_t local) {
  const FeatureInfo& fi = plan.features[f];
  RowRef ref;
  if (fi.dist_type != DistType::continuous) {
    ref.g = static_cast<uint64_t>(local);  // raw key (sign-extended for int32 keys)
    return ref;
  }
  // This rank's shard: its explicit rows when the table routes by shards, else §2.2's (blk,
  // the remainder, or 0).
  const RankRows rr = rank_rows(fi, rank);
  const uint64_t u = static_cast<uint64_t>(local);  // negative locals are huge: out of bounds
  if (u < static_cast<uint64_t>(rr.rows)) {
    ref.g = static_cast<uint64_t>(rr.first) + u;
    return ref;
  }
  // TBE bounds check: local row 0 of this rank, or nothing when the shard is empty.
  ref.oob = true;
  ref.g = static_cast<uint64_t>(rr.first);
  ref.valid = rr.rows > 0;
  return ref;
}

std::vector<int64_t> vbe_reduce_scatter_input_splits(
    const Plan& plan, const std::vector<std::vector<int64_t>>& batch_size_per_rank_per_feature) {
  std::vector<int64_t> out;
  for (const auto& row : batch_size_per_rank_per_feature) {
    int64_t n = 0;
    for (size_t f = 0; f < row.size() && f < plan.features.size(); ++f)
      n += row[f] * plan.features[f].dim;
    out.push_back(n);
  }
  return out;
}

std::vector<float> mean_divisors(const Plan& plan, const Kjt& kjt) {
  std::vector<float> div(static_cast<size_t>(kjt.num_bags()));
  int64_t i = 0;
  for (int64_t f = 0; f < kjt.num_features; ++f) {
    const bool mean = plan.features[f].pooling == PoolingMode::mean;
    const bool by_weights = kjt.weighted && (kjt.mean_divisor.empty() ||
                                             kjt.mean_divisor[size_t(f)] == MeanDivisor::weights);
    const int64_t j0 = kjt.bag_begin(f);
    for (int64_t j = j0; j < j0 + kjt.batch_size(f); ++j) {
      float len = 1.0f;
      if (mean && by_weights) {
        len = 0.0f;
        for (int64_t k = i; k < i + kjt.lengths[j]; ++k) len += kjt.weights[k];
      } else if (mean) {
        len = static_cast<float>(kjt.lengths[j]);
      }
      div[j] = len + 1e-6f;  // float32 add, as `lengths.float() + 1e-6`
      i += kjt.lengths[j];
    }
  }
  return div;
}

}  // namespace dynemb
