// The CPU backend: the bit-exact reference of every seam of backend.hpp (docs/semantics.md
// §3-§8). Memory: the output dists compute one destination rank at a time from index maps
// (int64 per row) instead of materializing W send/receive buffers; only one output tensor
// is alive at a time besides the caller's local_embs.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>

#include "common/error.hpp"
#include "common/parallel.hpp"
#include "engine/backend.hpp"
#include "engine/dist_checks.hpp"
#include "engine/embedding_source.hpp"
#include "engine/input_dist.hpp"
#include "engine/lookup_runs.hpp"
#include "engine/ops.hpp"
#include "engine/reference.hpp"

namespace dynemb {
namespace {

// (s, b) of bag `col` of a lookup-KJT feature row: col = sum_{s'<s} B_{s',f} + b.
void split_col(const LookupKjt& k, int64_t f, int64_t col, int64_t& s, int64_t& b) {
  for (s = 0; s < k.world_size; ++s) {
    const int64_t n = k.stride_per_key_per_rank[f][s];
    if (col < n) break;
    col -= n;
  }
  b = col;
}

// Whether the runs make(emit) makes (emit(values, at, count), on any thread) all equal `host` at
// their places and cover its n elements (`covered`: the elements in runs): a lookup or
// reference check that passes needs nothing more. Elements of no run would be zeros, which
// only the whole tensor shows, so runs that do not cover say "differs".
template <class Make>
bool runs_equal(const float* host, int64_t n, int64_t covered, Make&& make) {
  if (covered != n) return false;
  std::atomic<bool> differs{false};
  make([&](const float* v, int64_t at, int64_t count) {
    if (std::memcmp(v, host + at, sizeof(float) * size_t(count)) != 0)
      differs.store(true, std::memory_order_relaxed);
  });
  return !differs;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads > 0 ? threads : hardware_threads()) {}
  std::string name() const override { return "cpu"; }
  std::string device() const override { return "host, " + std::to_string(threads_) + " threads"; }

  BucketizedKjt bucketize(const Plan& plan, const Kjt& kjt) override {
    return bucketize_on_host(plan, kjt);
  }

  EmbTensor lookup(const Plan& plan, int rank, const LookupKjt& kjt,
                   const EmbeddingSource& source) override;
  std::optional<std::vector<TileDiff>> lookup_differences(const Plan& plan, int rank,
                                                          const LookupKjt& kjt,
                                                          const EmbeddingSource& source,
                                                          const float* captured, int64_t n,
                                                          const TileCompare& how) override;
  std::optional<std::vector<TileDiff>> reference_differences(
      const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source, int64_t batch,
      const float* replayed, int held_rank, int64_t n, const TileCompare& how) override;
  void sequence_output_dist(const Plan& plan, const std::vector<const EmbTensor*>& local_embs,
                            const std::vector<const ShardingContext*>& ctx,
                            const OutputSink& sink) override;
  void pooled_output_dist(const Plan& plan, bool variable_batch,
                          const std::vector<const EmbTensor*>& local_embs,
                          const std::vector<const ShardingContext*>& ctx,
                          const OutputSink& sink) override;

 private:
  template <class Emit>
  void each_lookup_run(const Plan& plan, int rank, const LookupKjt& k,
                       const EmbeddingSource& source, const LookupOutputLayout& L, Emit&& emit,
                       float* into = nullptr);

  int threads_;
};

// Resolves the unsharded row of lookup position p (feature f, bag `bag` of f) under the
// plan's bounds_check; throws Error naming rank, feature and position for `error`.
RowRef resolve(const Plan& plan, int rank, const LookupKjt& k, int64_t f, int64_t col,
               int64_t pos_in_bag, int64_t p) {
  const RowRef ref = lookup_row(plan, f, rank, k.values[p]);
  if (ref.oob && plan.bounds_check == BoundsCheck::error) {
    int64_t s = 0, b = 0;
    split_col(k, f, col, s, b);
    const FeatureInfo& fi = plan.features[f];
    (void)p;
    throw LookupBoundsError("rank " + std::to_string(rank) + ", feature " + fi.name +
                                ": an id of rank " + std::to_string(s) + " sample " +
                                std::to_string(b) + " is outside table " +
                                plan.tables[fi.table].name + " (num_embeddings " +
                                std::to_string(fi.hash_size) + ", bounds_check=error)",
                            rank, f, s, b, pos_in_bag, k.values[p]);
  }
  return ref;
}

// Makes rank `rank`'s lookup of k run by run, on every core: emit(values, at, count) gets the
// `count` values of the output's elements [at, at + count): per value p a row of D (zeros when
// its row is not looked up), or per pooled bag its D_f sums (fp32 in bag order, one rounding
// to the TBE output dtype). Every element of the layout is in exactly one run. `into`: the
// whole output, where runs may be made in place instead of emitted (bag_runs).
template <class Emit>
void CpuBackend::each_lookup_run(const Plan& plan, int rank, const LookupKjt& k,
                                 const EmbeddingSource& source, const LookupOutputLayout& L,
                                 Emit&& emit, float* into) {
  const std::vector<int64_t>& bag0 = L.bag0;
  const std::vector<int64_t> off = complete_cumsum(k.lengths);
  if (off.back() != static_cast<int64_t>(k.values.size()))
    throw Error("rank " + std::to_string(rank) + ": lookup KJT lengths sum to " +
                std::to_string(off.back()) + " but it has " + std::to_string(k.values.size()) +
                " values");
  const float* weights = k.weights.empty() ? nullptr : k.weights.data();
  const bool rows = plan.module == ModuleKind::pooled && !k.variable_batch;
  bag_runs(
      plan, source, bag0, off, weights, rows ? L.shape[0] : -1, threads_, /*grain=*/4096,
      [&](int64_t f, int64_t j, int64_t p) {
        return resolve(plan, rank, k, f, j - bag0[f], p - off[j], p);
      },
      [&](int64_t, int64_t j) { return L.dst[size_t(j)]; }, emit, into);
}

EmbTensor CpuBackend::lookup(const Plan& plan, int rank, const LookupKjt& k,
                             const EmbeddingSource& source) {
  const LookupOutputLayout L = lookup_output_layout(plan, k);
  EmbTensor out = EmbTensor::zeros(plan.data_type(), L.shape);
  each_lookup_run(
      plan, rank, k, source, L,
      [&](const float* v, int64_t at, int64_t count) {
        std::copy(v, v + count, out.data.begin() + at);
      },
      out.data.data());
  return out;
}

// One pass that makes each run and compares it with the captured one at once: a passing check
// writes no lookup tensor. Only when some run differs is the lookup made whole, to give the
// differing tiles their values.
std::optional<std::vector<TileDiff>> CpuBackend::lookup_differences(
    const Plan& plan, int rank, const LookupKjt& k, const EmbeddingSource& source,
    const float* captured, int64_t n, const TileCompare& how) {
  const LookupOutputLayout L = lookup_output_layout(plan, k);
  if (L.numel() != n) return std::nullopt;
  int64_t covered = n;
  if (plan.module == ModuleKind::pooled) {
    covered = 0;
    for (int64_t f = 0; f < k.num_features; ++f)
      covered += (L.bag0[f + 1] - L.bag0[f]) * plan.features[f].dim;
  }
  if (runs_equal(captured, n, covered,
                 [&](const auto& emit) { each_lookup_run(plan, rank, k, source, L, emit); }))
    return std::vector<TileDiff>{};
  return Backend::lookup_differences(plan, rank, k, source, captured, n, how);
}

// The same one pass for the unsharded reference. This backend holds no outputs (the default
// hold_outputs): `replayed` is always the output.
std::optional<std::vector<TileDiff>> CpuBackend::reference_differences(
    const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source, int64_t batch,
    const float* replayed, int held_rank, int64_t n, const TileCompare& how) {
  if (held_rank >= 0) return std::nullopt;
  check_kjt(plan, kjt, "batch " + std::to_string(batch) + " rank" + std::to_string(rank));
  if (shape_numel(reference_shape(plan, kjt)) != n) return std::nullopt;
  int64_t covered = n;
  if (plan.module == ModuleKind::pooled) {
    covered = 0;
    for (int64_t f = 0; f < kjt.num_features; ++f)
      covered += kjt.batch_size(f) * plan.features[f].dim;
  }
  if (runs_equal(replayed, n, covered,
                 [&](const auto& emit) { reference_runs(plan, rank, kjt, source, batch, emit); }))
    return std::vector<TileDiff>{};
  return Backend::reference_differences(plan, rank, kjt, source, batch, replayed, held_rank, n,
                                        how);
}

void CpuBackend::sequence_output_dist(const Plan& plan,
                                      const std::vector<const EmbTensor*>& local_embs,
                                      const std::vector<const ShardingContext*>& ctx,
                                      const OutputSink& sink) {
  const int64_t W = plan.world_size, D = plan.seq_dim();
  const DType codec = plan.comm_precision;
  const SequenceDistCheck chk = check_sequence_dist(plan, local_embs, ctx);
  // send_rows[s][k]: row of local_embs[s] at position k of rank s's send buffer: the forward
  // recat applied to row indices (permute_2D over [F*W, B] rows = permute_1D over the row
  // sums); its chunk for destination d starts at send_off[s][d].
  std::vector<std::vector<int64_t>> send_rows(W);
  std::vector<std::vector<int64_t>> send_off(W);
  for (int64_t s = 0; s < W; ++s) {
    const SequenceSendPlan& sp = chk.senders[s];
    std::vector<int64_t> iota(static_cast<size_t>(sp.rows));
    std::iota(iota.begin(), iota.end(), int64_t{0});
    send_rows[s] = permute_1D_sparse_data(sp.forward_recat, sp.segment_lengths, iota, {}).values;
    send_off[s] = sp.send_off;
  }
  const std::vector<std::vector<int64_t>>& recv_off = chk.recv_off;
  for (int64_t d = 0; d < W; ++d) {
    const std::vector<int64_t>& perm = *ctx[d]->unbucketize_permute;
    const std::vector<int64_t>& ro = recv_off[d];
    const int64_t N = static_cast<int64_t>(perm.size());
    EmbTensor out = EmbTensor::zeros(output_dist_dtype(plan), {N, D});
    // recv[p]: the row that lands at position p of what d receives (rank s's chunk for d at
    // [ro[s], ro[s + 1]), in its send order), found once per position, not by a search per
    // output row: the rows are often narrow (a replay over column slices), the search costlier
    // than the copy.
    std::vector<const float*> recv(static_cast<size_t>(ro.back()));
    for (int64_t s = 0; s < W; ++s) {
      const int64_t* rows = send_rows[s].data() + send_off[s][W == 1 ? 0 : d];
      const float* base = local_embs[s]->data.data();
      for (int64_t p = ro[s]; p < ro[s + 1]; ++p) recv[size_t(p)] = base + rows[p - ro[s]] * D;
    }
    // out[i] = recv[perm[i]]; the codec rounds each element exactly once (encode before,
    // decode after the exchange).
    parallel_for(threads_, N, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const float* src = recv[size_t(perm[i])];
        float* o = &out.data[i * D];
        if (codec == DType::f32)
          for (int64_t e = 0; e < D; ++e) o[e] = src[e];
        else
          for (int64_t e = 0; e < D; ++e) o[e] = codec_encode(codec, src[e]);
      }
    });
    sink(static_cast<int>(d), std::move(out));
  }
}

void CpuBackend::pooled_output_dist(const Plan& plan, bool variable_batch,
                                    const std::vector<const EmbTensor*>& local_embs,
                                    const std::vector<const ShardingContext*>& ctx,
                                    const OutputSink& sink) {
  const int64_t W = plan.world_size;
  const DType rd = pooled_reduce_dtype(plan);
  const bool codec = plan.comm_precision != DType::f32;
  // chunk_off[d][r]: first element of local_embs[d] reduced into rank r; chunk_len[r]: size.
  const PooledDistCheck chk = check_pooled_dist(plan, variable_batch, local_embs, ctx);
  const std::vector<std::vector<int64_t>>& chunk_off = chk.chunk_off;
  const std::vector<int64_t>& chunk_len = chk.chunk_len;
  for (int64_t r = 0; r < W; ++r) {
    const int64_t n = chunk_len[r];
    EmbTensor out = EmbTensor::zeros(
        output_dist_dtype(plan),
        variable_batch
            ? std::vector<int64_t>{n}
            : std::vector<int64_t>{n / std::max<int64_t>(1, plan.sum_dim), plan.sum_dim});
    // Sum over source ranks in rank order 0..W-1, rounding to the reduce dtype after every
    // add (codec: inputs encoded first). fp16/bf16 sums of two values computed in fp32 and
    // rounded once are correctly rounded (fp32 has >= 2p+2 bits for p = 11 and 8).
    if (rd == DType::f32 && !codec) {
      // fp32 without a codec: the same adds in the same order per element, a tile of
      // elements at a time with the source rank outer, so that they vectorize and the tile
      // of sums stays in cache across the W sources.
      parallel_for(threads_, n, [&](int64_t e0, int64_t e1) {
        constexpr int64_t kTile = 2048;
        float* o = out.data.data();
        for (int64_t t0 = e0; t0 < e1; t0 += kTile) {
          const int64_t t1 = std::min(e1, t0 + kTile);
          const float* s0 = local_embs[0]->data.data() + chunk_off[0][r];
          for (int64_t e = t0; e < t1; ++e) o[e] = s0[e];
          for (int64_t d = 1; d < W; ++d) {
            const float* sd = local_embs[d]->data.data() + chunk_off[d][r];
            for (int64_t e = t0; e < t1; ++e) o[e] += sd[e];
          }
        }
      });
      sink(static_cast<int>(r), std::move(out));
      continue;
    }
    parallel_for(threads_, n, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) {
        auto in = [&](int64_t d) {
          const float x = local_embs[d]->data[chunk_off[d][r] + e];
          return codec ? codec_encode(rd, x) : x;
        };
        float acc = in(0);
        for (int64_t d = 1; d < W; ++d) acc = round_to(rd, acc + in(d));
        out.data[e] = acc;
      }
    });
    sink(static_cast<int>(r), std::move(out));
  }
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace dynemb
