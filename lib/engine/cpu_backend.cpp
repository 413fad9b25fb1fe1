// The CPU backend: the bit-exact reference of every seam of backend.hpp (docs/semantics.md
// §3-§8). Memory: the output dists compute one destination rank at a time from index maps
// (int64 per row) instead of materializing W send/receive buffers; only one output tensor
// is alive at a time besides the caller's local_embs.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <thread>

#include "common/error.hpp"
#include "common/parallel.hpp"
#include "common/test_hooks.hpp"
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

// The CPU backend is its own comparator: the host's. With `keeps`, it keeps what a step may keep
// (Place::kept, keep()) in host memory, as a device backend keeps it on its device.
class CpuBackend final : public Backend, public Comparator {
 public:
  CpuBackend(int threads, bool keeps)
      : Backend("cpu"), threads_(threads > 0 ? threads : hardware_threads()), keeps_(keeps) {}
  // What a test needs to know the kept paths ran, not only that the reports agree.
  ~CpuBackend() override {
    if (keeps_)
      std::fprintf(stderr,
                   "DYNEMB_HOLD_OUTPUTS: %lld outputs held, %lld checks made on them, %lld "
                   "lookups kept for a dist\n",
                   static_cast<long long>(outputs_kept_), static_cast<long long>(kept_checks_),
                   static_cast<long long>(lookups_kept_));
  }
  std::string device() const override { return "host, " + std::to_string(threads_) + " threads"; }

  using Backend::bucketize;
  std::vector<BucketizedKjt> bucketize(const Plan& plan,
                                       const std::vector<const Kjt*>& kjts) override {
    return bucketize_ranks(plan, kjts);
  }

  Tensor lookup(const Plan& plan, int rank, const LookupKjt& kjt, const EmbeddingSource& source,
                Place place) override {
    EmbTensor made = lookup_on_host(plan, rank, kjt, source);
    if (place == Place::kept && keeps_) ++lookups_kept_;
    return place_tensor(std::move(made), Kept{Kept::Role::lookup, rank}, place);
  }
  std::optional<Kept> keep(const EmbTensor& host, int rank) override {
    if (!keeps_) return std::nullopt;
    const Kept k{Kept::Role::input, rank};
    kept_[key(k)] = host;
    return k;
  }
  void sequence_output_dist(const Plan& plan, const std::vector<TensorRef>& local_embs,
                            const std::vector<const ShardingContext*>& ctx, Place place,
                            const OutputSink& sink) override;
  void pooled_output_dist(const Plan& plan, bool variable_batch,
                          const std::vector<TensorRef>& local_embs,
                          const std::vector<const ShardingContext*>& ctx, Place place,
                          const OutputSink& sink) override;
  Comparator& comparator() override { return *this; }
  // A keeping CPU backend stands in for a device (tests): the hook gives its memory.
  uint64_t device_memory_for_kept() const override {
    return keeps_ ? test_hooks::device_memory().value_or(0) : 0;
  }

  std::optional<std::vector<TileDiff>> compare(const TensorRef& got, const TensorRef& want,
                                               const TileCompare& how) override;
  std::optional<std::vector<TileDiff>> compare_lookup(const TensorRef& got, const Plan& plan,
                                                      int rank, const LookupKjt& kjt,
                                                      const EmbeddingSource& source,
                                                      const TileCompare& how) override;
  std::optional<std::vector<TileDiff>> compare_reference(const TensorRef& got, const Plan& plan,
                                                         int rank, const Kjt& kjt,
                                                         const EmbeddingSource& source,
                                                         int64_t batch,
                                                         const TileCompare& how) override;

 private:
  template <class Emit>
  void each_lookup_run(const Plan& plan, int rank, const LookupKjt& k,
                       const EmbeddingSource& source, const LookupOutputLayout& L, Emit&& emit,
                       float* into = nullptr);
  EmbTensor lookup_on_host(const Plan& plan, int rank, const LookupKjt& k,
                           const EmbeddingSource& source);

  static int64_t key(const Kept& k) { return int64_t(k.rank) * 3 + int64_t(k.role); }
  // `t` on the host, or kept as `as` (its dtype and shape handed back) when asked and keeping.
  Tensor place_tensor(EmbTensor&& t, const Kept& as, Place place) {
    if (place != Place::kept || !keeps_) return Tensor{std::move(t), std::nullopt};
    Tensor shape{EmbTensor{t.dtype, t.shape, {}}, as};
    kept_[key(as)] = std::move(t);
    return shape;
  }
  // The elements of `r`: its host data, or the kept tensor it names; null when `r` names none of
  // its n elements. A check of a kept output is counted.
  const float* data_of(const TensorRef& r) {
    if (!r.kept) return r.host;
    const auto it = kept_.find(key(*r.kept));
    if (it == kept_.end() || it->second.numel() != r.n) return nullptr;
    kept_checks_ += r.kept->role == Kept::Role::output;
    return it->second.data.data();
  }
  // The dists' inputs as host pointers (kept ones resolved); throws when one names nothing kept.
  std::vector<const float*> inputs_of(const std::vector<TensorRef>& local_embs) {
    std::vector<const float*> p;
    for (size_t s = 0; s < local_embs.size(); ++s) {
      const TensorRef& r = local_embs[s];
      const float* d = r.host;
      if (r.kept) {
        const auto it = kept_.find(key(*r.kept));
        if (it == kept_.end() || !r.shape || it->second.shape != *r.shape)
          throw Error("output dist: local_embs of rank " + std::to_string(s) +
                      " is kept, and no tensor of its shape is kept for it");
        d = it->second.data.data();
      }
      p.push_back(d);
    }
    return p;
  }
  // The dist's output of rank r to the sink, kept first when asked.
  void hand_over(const OutputSink& sink, int r, EmbTensor&& out, Place place) {
    if (place == Place::kept && keeps_) ++outputs_kept_;
    sink(r, place_tensor(std::move(out), Kept{Kept::Role::output, r}, place));
  }

  int threads_;
  bool keeps_;
  std::map<int64_t, EmbTensor> kept_;  // by key(): one tensor per role and rank
  int64_t outputs_kept_ = 0, kept_checks_ = 0, lookups_kept_ = 0;
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

EmbTensor CpuBackend::lookup_on_host(const Plan& plan, int rank, const LookupKjt& k,
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

// One pass that makes each run and compares it with `got` at once: a passing check writes no
// lookup tensor. Only when some run differs is the lookup made whole, to give the differing tiles
// their values.
std::optional<std::vector<TileDiff>> CpuBackend::compare_lookup(const TensorRef& got,
                                                                const Plan& plan, int rank,
                                                                const LookupKjt& k,
                                                                const EmbeddingSource& source,
                                                                const TileCompare& how) {
  const LookupOutputLayout L = lookup_output_layout(plan, k);
  const int64_t n = got.n;
  const float* g = data_of(got);
  if (L.numel() != n) return std::nullopt;
  if (n == 0) return std::vector<TileDiff>{};
  if (!g) return std::nullopt;
  int64_t covered = n;
  if (plan.module == ModuleKind::pooled) {
    covered = 0;
    for (int64_t f = 0; f < k.num_features; ++f)
      covered += (L.bag0[f + 1] - L.bag0[f]) * plan.features[f].dim;
  }
  if (runs_equal(g, n, covered,
                 [&](const auto& emit) { each_lookup_run(plan, rank, k, source, L, emit); }))
    return std::vector<TileDiff>{};
  const EmbTensor want = lookup_on_host(plan, rank, k, source);
  return tile_diffs(g, want.data.data(), n, how);
}

// The same one pass for the unsharded reference.
std::optional<std::vector<TileDiff>> CpuBackend::compare_reference(
    const TensorRef& got, const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source,
    int64_t batch, const TileCompare& how) {
  const float* g = data_of(got);
  const int64_t n = got.n;
  check_kjt(plan, kjt, "batch " + std::to_string(batch) + " rank" + std::to_string(rank));
  if (shape_numel(reference_shape(plan, kjt)) != n) return std::nullopt;
  if (n == 0) return std::vector<TileDiff>{};
  if (!g) return std::nullopt;
  int64_t covered = n;
  if (plan.module == ModuleKind::pooled) {
    covered = 0;
    for (int64_t f = 0; f < kjt.num_features; ++f)
      covered += kjt.batch_size(f) * plan.features[f].dim;
  }
  if (runs_equal(g, n, covered,
                 [&](const auto& emit) { reference_runs(plan, rank, kjt, source, batch, emit); }))
    return std::vector<TileDiff>{};
  const EmbTensor want = reference_output(plan, rank, kjt, source, batch);
  return tile_diffs(g, want.data.data(), n, how);
}

std::optional<std::vector<TileDiff>> CpuBackend::compare(const TensorRef& got,
                                                         const TensorRef& want,
                                                         const TileCompare& how) {
  if (got.n != want.n) return std::nullopt;
  const float* g = data_of(got);
  const float* w = data_of(want);
  if (got.n == 0) return std::vector<TileDiff>{};
  if (!g || !w) return std::nullopt;
  return tile_diffs(g, w, got.n, how);
}

void CpuBackend::sequence_output_dist(const Plan& plan, const std::vector<TensorRef>& local_embs,
                                      const std::vector<const ShardingContext*>& ctx, Place place,
                                      const OutputSink& sink) {
  const int64_t W = plan.world_size, D = plan.seq_dim();
  const DType codec = plan.comm_precision;
  const SequenceDistCheck chk = check_sequence_dist(plan, local_embs, ctx);
  const std::vector<const float*> in = inputs_of(local_embs);
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
      const float* base = in[size_t(s)];
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
    hand_over(sink, static_cast<int>(d), std::move(out), place);
  }
}

void CpuBackend::pooled_output_dist(const Plan& plan, bool variable_batch,
                                    const std::vector<TensorRef>& local_embs,
                                    const std::vector<const ShardingContext*>& ctx, Place place,
                                    const OutputSink& sink) {
  const int64_t W = plan.world_size;
  const DType rd = pooled_reduce_dtype(plan);
  const bool codec = plan.comm_precision != DType::f32;
  // chunk_off[d][r]: first element of local_embs[d] reduced into rank r; chunk_len[r]: size.
  const PooledDistCheck chk = check_pooled_dist(plan, variable_batch, local_embs, ctx);
  const std::vector<const float*> in = inputs_of(local_embs);
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
          const float* s0 = in[0] + chunk_off[0][r];
          for (int64_t e = t0; e < t1; ++e) o[e] = s0[e];
          for (int64_t d = 1; d < W; ++d) {
            const float* sd = in[size_t(d)] + chunk_off[d][r];
            for (int64_t e = t0; e < t1; ++e) o[e] += sd[e];
          }
        }
      });
      hand_over(sink, static_cast<int>(r), std::move(out), place);
      continue;
    }
    parallel_for(threads_, n, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) {
        auto value = [&](int64_t d) {
          const float x = in[size_t(d)][chunk_off[d][r] + e];
          return codec ? codec_encode(rd, x) : x;
        };
        float acc = value(0);
        for (int64_t d = 1; d < W; ++d) acc = round_to(rd, acc + value(d));
        out.data[e] = acc;
      }
    });
    hand_over(sink, static_cast<int>(r), std::move(out), place);
  }
}

}  // namespace

Comparator& host_comparator() {
  static const std::unique_ptr<Backend> host = make_cpu_backend();
  return host->comparator();
}

std::unique_ptr<Backend> make_cpu_backend(int threads, bool keeps) {
  return std::make_unique<CpuBackend>(threads, keeps);
}

}  // namespace dynemb
