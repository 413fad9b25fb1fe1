// CUDA backend == CPU reference, bit for bit: bucketize, lookup, sequence and
// pooled output dists on a few hundred random plans/batches covering the edge cases of
// docs/semantics.md (W = 1, empty ranks, zero-length bags, unequal batch per rank, VBE,
// ids past the last shard, negative and int32 ids, mixed dist types, fp16/bf16 data and
// codecs, MEAN, weights); every fixture under fixtures/ when present; sources of dense weights
// and column slices of tables, looked up on the device (no row made on the host); and one
// gather, one dense lookup and one reduce of more than 2^31 elements (64-bit indexing).
// Exits 77 when no GPU is present.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "../test_engine_util.hpp"
#include "bucketize/config.cuh"  // kChunk, kSmallW
#include "capture/capture.hpp"
#include "common/hash.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda_check.hpp"
#include "device_buffer.hpp"
#include "engine/input_dist.hpp"
#include "engine/ops.hpp"
#include "engine/reference.hpp"
#include "gather.hpp"
#include "gpu_test_support.hpp"
#include "pooled.hpp"
#include "replay/column_slice.hpp"

using namespace dynemb;
using dynemb::cuda::DeviceBuffer;
using test::cpu;
using test::first_diff;
using test::same_bits;

namespace {

void require_gpu() {
  test::skip_unless(cuda_device_available());
}

Backend& gpu() {
  require_gpu();
  static std::unique_ptr<Backend> b = make_cuda_backend(0);
  return *b;
}

struct Case {
  Plan plan;
  std::vector<Kjt> kjts;
  std::string desc;
  std::vector<const Kjt*> kjt_ptrs() const {
    std::vector<const Kjt*> p;
    for (const Kjt& k : kjts) p.push_back(&k);
    return p;
  }
};

Case random_case(std::mt19937_64& rng, int idx) {
  auto U = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Case c;
  Plan& p = c.plan;
  p.world_size = U(0, 9) == 0 ? 1 : U(2, 8);
  p.module = U(0, 1) ? ModuleKind::sequence : ModuleKind::pooled;
  const int prec = static_cast<int>(U(0, 5));
  p.comm_precision = prec == 4 ? DType::f16 : prec == 5 ? DType::bf16 : DType::f32;
  const int dprec = static_cast<int>(U(0, 7));
  const DType data = dprec == 6 ? DType::f16 : dprec == 7 ? DType::bf16 : DType::f32;
  p.bounds_check = U(0, 1) ? BoundsCheck::warn_zero_row : BoundsCheck::ignore;
  const int64_t T = U(1, 3);
  const int64_t seqD = std::vector<int64_t>{1, 4, 15, 16, 33, 128, 129}[U(0, 6)];
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
  const bool i32 = U(0, 4) == 0;
  const bool long_bags = U(0, 9) == 0;  // exercises the block-per-bag bucketize path
  const int64_t Bcommon = U(0, 6);
  for (int64_t r = 0; r < W; ++r) {
    Kjt k;
    k.num_features = F;
    k.weighted = weighted;
    k.values_type = i32 ? IndexType::i32 : IndexType::i64;
    const int64_t B = U(0, 3) == 0 ? U(0, 6) : Bcommon;  // unequal batch per rank
    for (int64_t f = 0; f < F; ++f) {
      const int64_t Bf = vbe ? U(0, 5) : B;
      if (vbe) k.stride_per_feature.push_back(Bf);
      const FeatureInfo& fi = p.features[f];
      for (int64_t b = 0; b < Bf; ++b) {
        const int64_t len = long_bags ? U(0, 700) : U(0, 6);
        k.lengths.push_back(len);
        for (int64_t i = 0; i < len; ++i) {
          int64_t id;
          const int64_t kind = U(0, 19);
          if (kind == 0)
            id = -U(1, 5);  // negative
          else if (kind == 1)
            id = fi.hash_size + U(0, 3 * W);  // past the last shard
          else if (kind == 2)
            id = static_cast<int64_t>(rng() >> 1);  // raw 63-bit key
          else
            id = U(0, fi.hash_size - 1);
          if (i32) id = static_cast<int64_t>(static_cast<int32_t>(id));
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
           (i32 ? " int32" : "") + (long_bags ? " long-bags" : "") + (p.any_mean ? " mean" : "");
  return c;
}

// `made` with bits flipped at a few places (none for some ranks; always the last element when
// any): low mantissa bits (within ulp:2 or rtol), high ones and exponent bits (mismatches, NaN
// and infinity among them), sign bits (signed zeros). Room for one more element at the end.
std::vector<float> flipped_copy(const std::vector<float>& made, int r) {
  const int64_t n = static_cast<int64_t>(made.size());
  std::vector<float> captured = made;
  captured.push_back(0.0f);  // room for the wrong-count call
  for (int64_t k = 0; n > 0 && k < r % 5; ++k) {
    const int64_t i = k == 0 ? n - 1 : (int64_t(r) * 7919 + k * 104729) % n;
    uint32_t bits;
    std::memcpy(&bits, &captured[size_t(i)], 4);
    bits ^= uint32_t(1) << ((r + 5 * k) % 32);
    std::memcpy(&captured[size_t(i)], &bits, 4);
  }
  return captured;
}

// The same tiles, statistics bit for bit and values, from both backends' checks.
void check_same_tiles(const std::vector<TileDiff>& g, const std::vector<TileDiff>& c) {
  REQUIRE(g.size() == c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    INFO("tile " << i << " at " << c[i].begin);
    CHECK(g[i].begin == c[i].begin);
    CHECK(g[i].end == c[i].end);
    CHECK(g[i].stats.mismatches == c[i].stats.mismatches);
    CHECK(std::memcmp(&g[i].stats.max_abs_err, &c[i].stats.max_abs_err, sizeof(double)) == 0);
    CHECK(std::memcmp(&g[i].stats.max_rel_err, &c[i].stats.max_rel_err, sizeof(double)) == 0);
    CHECK(g[i].stats.max_ulp == c[i].stats.max_ulp);
    CHECK(same_bits(g[i].got, c[i].got));
    CHECK(same_bits(g[i].want, c[i].want));
  }
}

// How the checks are drawn: tiles of several sizes, every tolerance kind, values of none or a
// few mismatches.
std::vector<TileCompare> compare_modes() {
  std::vector<TileCompare> out;
  for (const int64_t tile : {int64_t(1), int64_t(7), int64_t(64), int64_t(1) << 16})
    for (const Tolerance& tol :
         {Tolerance::exact(), Tolerance::ulp(2), Tolerance::rel(1.0 / 1024, 1.0 / 1024)})
      for (const int64_t maxm : {int64_t(0), int64_t(3)}) out.push_back({tol, tile, maxm});
  return out;
}

// A check compared on the device (the comparator's compare, compare_reference) == on the host:
// `made` (what the backends make) against a copy with bits flipped (flipped_copy), every
// compare_modes(): the same tiles, statistics and values; nullopt for a wrong element count.
// differences(backend, captured, n, how) runs the check on one backend.
template <class Differences>
void check_differences(const std::string& what, int r, const std::vector<float>& made,
                       const Differences& differences) {
  const int64_t n = static_cast<int64_t>(made.size());
  const std::vector<float> captured = flipped_copy(made, r);
  for (const TileCompare& how : compare_modes()) {
    INFO(what << " rank " << r << " tile " << how.tile << " " << how.tol.str() << " max "
              << how.max_report);
    const auto c = differences(cpu(), captured.data(), n, how);
    const auto g = differences(gpu(), captured.data(), n, how);
    REQUIRE(c.has_value());
    REQUIRE(g.has_value());
    check_same_tiles(*g, *c);
  }
  CHECK_FALSE(differences(gpu(), captured.data(), n + 1, compare_modes()[0]));
  CHECK_FALSE(differences(cpu(), captured.data(), n + 1, compare_modes()[0]));
}

// The output dist with its outputs kept on the device (Place::kept), as a replay checks them:
// the sinks get shapes and names and no data, and the golden and reference checks of the kept
// outputs == the host's checks of the CPU backend's outputs.
void check_kept_outputs(const Plan& plan, const std::vector<const Kjt*>& kjts,
                        const EmbeddingSource& source, const DerivedBatch& derived,
                        const std::vector<EmbTensor>& local,
                        const std::vector<EmbTensor>& out_cpu) {
  const std::vector<TensorRef> in(local.begin(), local.end());
  const std::vector<Tensor> kept = test::run_output_dist(gpu(), plan, derived, in, Place::kept);
  Comparator& cmp = gpu().comparator();
  for (size_t r = 0; r < kept.size(); ++r) {
    INFO("kept output, rank " << r);
    CHECK(kept[r].t.shape == out_cpu[r].shape);
    CHECK(kept[r].t.dtype == out_cpu[r].dtype);
    CHECK(kept[r].t.data.empty());
    REQUIRE(kept[r].kept.has_value());
    CHECK(kept[r].kept->role == Kept::Role::output);
    CHECK(kept[r].kept->rank == int(r));
    const int64_t n = out_cpu[r].numel();
    const std::vector<float> golden = flipped_copy(out_cpu[r].data, int(r) + 1);
    for (const TileCompare& how : compare_modes()) {
      INFO(how.tol.str() << " tile " << how.tile);
      const auto g = cmp.compare(kept[r], TensorRef::span(golden.data(), n), how);
      REQUIRE(g.has_value());
      check_same_tiles(*g, tile_diffs(out_cpu[r].data.data(), golden.data(), n, how));
      const auto gr = cmp.compare_reference(kept[r], plan, int(r), *kjts[r], source, 0, how);
      const auto cr =
          cpu().comparator().compare_reference(out_cpu[r], plan, int(r), *kjts[r], source, 0, how);
      REQUIRE(gr.has_value());
      REQUIRE(cr.has_value());
      check_same_tiles(*gr, *cr);
    }
    // A name with another element count names nothing kept.
    TensorRef wrong = kept[r];
    wrong.n = n + 1;
    CHECK_FALSE(cmp.compare(wrong, TensorRef::span(golden.data(), n + 1), compare_modes()[0]));
    CHECK_FALSE(
        cmp.compare_reference(wrong, plan, int(r), *kjts[r], source, 0, compare_modes()[0]));
  }
}

// The lookup check as a replay makes it: the captured lookup (n floats at `captured`) kept by
// the backend (keep(); a backend that keeps nothing compares the host copy), the lookup made
// and kept there, and the two compared by the backend's comparator. `host_side`: the captured
// lookup stays on the host (the comparator uploads it).
std::optional<std::vector<TileDiff>> lookup_check(Backend& be, const Plan& plan, int r,
                                                  const LookupKjt& lk,
                                                  const EmbeddingSource& source,
                                                  const float* captured, int64_t n,
                                                  const TileCompare& how, bool host_side) {
  EmbTensor cap;
  cap.dtype = plan.data_type();
  cap.shape = {n};
  cap.data.assign(captured, captured + n);
  TensorRef got = cap;
  if (!host_side)
    if (const std::optional<Kept> k = be.keep(cap, r)) {
      CHECK(k->role == Kept::Role::input);
      CHECK(k->rank == r);
      got.kept = k;
      got.host = nullptr;
    }
  const Tensor want = be.lookup(plan, r, lk, source, Place::kept);
  return be.comparator().compare(got, want, how);
}

// The CUDA backend's bucketize of a KJT (`got`) against the host's: what it sends back (no
// dest_rank; the permute of a sequence plan only), bit for bit. The kernels' dest_rank and
// pooled permutes are checked where they are made (check_batched_bucketize).
void check_backend_bucketize(const Plan& plan, const BucketizedKjt& got,
                             const BucketizedKjt& want) {
  CHECK(got.new_lengths == want.new_lengths);
  CHECK(got.new_values == want.new_values);
  CHECK(same_bits(got.new_weights, want.new_weights));
  if (plan.module == ModuleKind::sequence)
    CHECK(got.unbucketize_permute == want.unbucketize_permute);
  else
    CHECK(got.unbucketize_permute.empty());
  CHECK(got.dest_rank.empty());
}

// The input dist with the GPU's bucketize (`got`) against the host's: what every rank looks up
// and the context it would have filled.
void check_same_input_dist(const DerivedBatch& got, const DerivedBatch& want) {
  CHECK(got.variable_batch == want.variable_batch);
  REQUIRE(got.ranks.size() == want.ranks.size());
  for (size_t r = 0; r < want.ranks.size(); ++r) {
    INFO("input dist rank " << r);
    const LookupKjt &g = got.ranks[r].lookup_kjt, &w = want.ranks[r].lookup_kjt;
    CHECK(g.stride_per_key_per_rank == w.stride_per_key_per_rank);
    CHECK(g.lengths == w.lengths);
    CHECK(g.values == w.values);
    CHECK(same_bits(g.weights, w.weights));
    CHECK(g.variable_batch == w.variable_batch);
    test::check_same_context(got.ranks[r].ctx, want.ranks[r].ctx);
    CHECK(got.ranks[r].ctx.batch_size_per_feature_pre_a2a ==
          want.ranks[r].ctx.batch_size_per_feature_pre_a2a);
  }
}

// Runs one batch through both backends and compares every stage bit for bit.
void compare_batch(const Plan& plan, const std::vector<const Kjt*>& kjts,
                   const EmbeddingSource& source, const std::string& desc) {
  INFO(desc);
  const int64_t W = plan.world_size;
  // Rank by rank (R = 1) and the whole batch in one launch (the replay's input dist).
  const std::vector<BucketizedKjt> all = gpu().bucketize(plan, kjts);
  REQUIRE(all.size() == kjts.size());
  for (int64_t r = 0; r < W; ++r) {
    const BucketizedKjt a = cpu().bucketize(plan, *kjts[r]);
    for (const BucketizedKjt& b : {gpu().bucketize(plan, *kjts[r]), all[size_t(r)]}) {
      INFO("bucketize rank " << r << (&b == &all[size_t(r)] ? " (batch)" : " (alone)"));
      check_backend_bucketize(plan, b, a);
    }
  }
  const DerivedBatch derived = derive_input_dist(plan, kjts);
  check_same_input_dist(derive_input_dist(plan, kjts, &gpu()), derived);
  std::vector<EmbTensor> local = derive_local_embs(plan, derived, source, cpu(), 0);
  for (int64_t r = 0; r < W; ++r) {
    const Tensor g =
        gpu().lookup(plan, static_cast<int>(r), derived.ranks[r].lookup_kjt, source, Place::host);
    INFO("lookup rank " << r << " first diff " << first_diff(local[r].data, g.t.data));
    CHECK_FALSE(g.kept.has_value());
    CHECK(g.t.shape == local[r].shape);
    CHECK(same_bits(g.t.data, local[r].data));
  }
  for (int64_t r = 0; r < W; ++r) {
    const LookupKjt& lk = derived.ranks[r].lookup_kjt;
    for (const bool host_side : {false, true})
      check_differences(host_side ? "lookup check, captured on the host" : "lookup check, kept",
                        int(r), local[r].data,
                        [&](Backend& be, const float* captured, int64_t n, const TileCompare& how) {
                          return lookup_check(be, plan, int(r), lk, source, captured, n, how,
                                              host_side);
                        });
    const EmbTensor ref = reference_output(plan, int(r), *kjts[r], source, 0);
    check_differences("reference check", int(r), ref.data,
                      [&](Backend& be, const float* replayed, int64_t n, const TileCompare& how) {
                        return be.comparator().compare_reference(TensorRef::span(replayed, n), plan,
                                                                 int(r), *kjts[r], source, 0, how);
                      });
  }
  const std::vector<EmbTensor> out_cpu = test::run_output_dist(cpu(), plan, derived, local);
  const std::vector<EmbTensor> out_gpu = test::run_output_dist(gpu(), plan, derived, local);
  for (int64_t r = 0; r < W; ++r) {
    INFO("output dist rank " << r << " first diff "
                             << first_diff(out_cpu[r].data, out_gpu[r].data));
    CHECK(out_gpu[r].shape == out_cpu[r].shape);
    CHECK(out_gpu[r].dtype == out_cpu[r].dtype);
    CHECK(same_bits(out_gpu[r].data, out_cpu[r].data));
  }
  check_kept_outputs(plan, kjts, source, derived, local, out_cpu);
  // The lookups made only as the dist's inputs (Place::kept, as a column slice's are): kept on
  // the device, handed back as shapes and names; the dist takes them from there, its outputs on
  // the host or kept.
  std::vector<Tensor> for_dist;
  for (int64_t r = 0; r < W; ++r) {
    INFO("lookup kept for the dist, rank " << r);
    for_dist.push_back(
        gpu().lookup(plan, int(r), derived.ranks[r].lookup_kjt, source, Place::kept));
    CHECK(for_dist[r].t.shape == local[r].shape);
    CHECK(for_dist[r].t.dtype == local[r].dtype);
    CHECK(for_dist[r].t.data.empty());  // made and kept on the device
    REQUIRE(for_dist[r].kept.has_value());
    CHECK(for_dist[r].kept->role == Kept::Role::lookup);
    CHECK(for_dist[r].kept->rank == int(r));
  }
  const std::vector<Tensor> out_for_dist =
      test::run_output_dist(gpu(), plan, derived, test::refs_of(for_dist), Place::host);
  const std::vector<Tensor> kept_out =
      test::run_output_dist(gpu(), plan, derived, test::refs_of(for_dist), Place::kept);
  for (int64_t r = 0; r < W; ++r) {
    INFO("output dist on the lookups kept for it, rank "
         << r << " first diff " << first_diff(out_cpu[r].data, out_for_dist[r].t.data));
    CHECK_FALSE(out_for_dist[r].kept.has_value());
    CHECK(same_bits(out_for_dist[r].t.data, out_cpu[r].data));
    const auto kept = gpu().comparator().compare(kept_out[r], out_cpu[r], compare_modes()[0]);
    REQUIRE(kept.has_value());
    CHECK(kept->empty());  // every element equal: no tile adds anything
  }
  // The captured lookups kept on the device and checked there first (as a replay does): the
  // dist then takes the inputs kept there (the pooled dist in place, unless a codec rounds
  // them), and must give the same outputs, twice: the kept inputs are what keep() took still.
  std::vector<Tensor> inputs(static_cast<size_t>(W));
  for (int64_t r = 0; r < W; ++r) {
    const std::optional<Kept> k = gpu().keep(local[r], int(r));
    REQUIRE(k.has_value());
    inputs[r].t = EmbTensor{local[r].dtype, local[r].shape, {}};
    inputs[r].kept = k;
    const Tensor derived_lookup =
        gpu().lookup(plan, int(r), derived.ranks[r].lookup_kjt, source, Place::kept);
    const auto d = gpu().comparator().compare(inputs[r], derived_lookup, compare_modes()[0]);
    REQUIRE(d.has_value());
    CHECK(d->empty());
  }
  for (int pass = 0; pass < 2; ++pass) {
    const std::vector<Tensor> out_kept =
        test::run_output_dist(gpu(), plan, derived, test::refs_of(inputs), Place::host);
    for (int64_t r = 0; r < W; ++r) {
      INFO("output dist on the kept inputs, pass " << pass << " rank " << r);
      CHECK(same_bits(out_kept[r].t.data, out_cpu[r].data));
    }
  }
}

// Counts the rows the host makes (row(), row_columns()); the device's rows come from
// table_rows() and are not counted.
class CountingSource final : public EmbeddingSource {
 public:
  explicit CountingSource(std::shared_ptr<const EmbeddingSource> inner)
      : inner_(std::move(inner)) {}
  void row(int table, uint64_t g, float* out, int64_t dim) const override {
    ++host_rows;
    inner_->row(table, g, out, dim);
  }
  void row_columns(int table, uint64_t g, int64_t c0, int64_t n, float* out) const override {
    ++host_rows;
    inner_->row_columns(table, g, c0, n, out);
  }
  std::optional<uint64_t> oracle_seed() const override { return inner_->oracle_seed(); }
  TableRows table_rows(int table) const override { return inner_->table_rows(table); }
  mutable std::atomic<int64_t> host_rows{0};

 private:
  std::shared_ptr<const EmbeddingSource> inner_;
};

// The oracle, or dense weights for about three tables in four (values multiples of 1/64 in
// [-2, 2), exact in every dtype) and the oracle for the rest.
std::shared_ptr<const EmbeddingSource> random_source(std::mt19937_64& rng, const Plan& plan,
                                                     uint64_t seed, bool dense) {
  auto oracle = std::make_shared<OracleSource>(seed, plan);
  if (!dense) return oracle;
  std::vector<std::optional<std::vector<float>>> w(plan.tables.size());
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    if (rng() % 4 == 0) continue;  // this table from the oracle
    const TableConfig& tc = plan.tables[t];
    std::vector<float> v(static_cast<size_t>(tc.num_embeddings * tc.embedding_dim));
    for (float& x : v) x = static_cast<float>(static_cast<int>(rng() % 256) - 128) / 64.0f;
    w[t] = std::move(v);
  }
  return std::make_shared<DenseSource>(plan, std::move(w), oracle);
}

// compare_batch, then the same lookups and references again with every row made on the device:
// `counted` (source, or what it wraps) must make none on the host. Where the CPU reference
// refuses the batch (an id whose row a table's dense weights do not have), the device backend's
// lookups must refuse it in the same words; returns false then.
bool compare_on_device(const Plan& plan, const std::vector<const Kjt*>& kjts,
                       const EmbeddingSource& source, const CountingSource& counted,
                       const std::string& desc) {
  INFO(desc);
  const DerivedBatch derived = derive_input_dist(plan, kjts);
  std::string want, got;
  try {
    derive_local_embs(plan, derived, source, cpu(), 0);
  } catch (const Error& e) {
    want = e.what();
  }
  if (!want.empty()) {
    try {
      derive_local_embs(plan, derived, source, gpu(), 0);
    } catch (const Error& e) {
      got = e.what();
    }
    CHECK(got == want);
    return false;
  }
  compare_batch(plan, kjts, source, desc);
  std::vector<EmbTensor> refs;
  for (int64_t r = 0; r < plan.world_size; ++r)
    refs.push_back(reference_output(plan, int(r), *kjts[r], source, 0));
  counted.host_rows = 0;
  for (int64_t r = 0; r < plan.world_size; ++r) {
    const LookupKjt& lk = derived.ranks[r].lookup_kjt;
    gpu().lookup(plan, int(r), lk, source, Place::host);
    gpu().lookup(plan, int(r), lk, source, Place::kept);
    const auto d = gpu().comparator().compare_reference(refs[r], plan, int(r), *kjts[r], source, 0,
                                                        compare_modes()[0]);
    REQUIRE(d.has_value());
    CHECK(d->empty());
  }
  CHECK(counted.host_rows == 0);
  return true;
}

// DYNEMB_GPU_CASES trims the count under compute-sanitizer (slow).
int gpu_cases(int default_cases) {
  const char* env = std::getenv("DYNEMB_GPU_CASES");
  return env ? std::max(1, std::atoi(env)) : default_cases;
}

}  // namespace

TEST_CASE("cuda == cpu on random batches (bit for bit)") {
  require_gpu();
  std::mt19937_64 rng(20261202);
  const int cases = gpu_cases(300);
  int n = 0;
  for (int i = 0; i < cases; ++i) {
    Case c = random_case(rng, i);
    std::vector<const Kjt*> kp;
    for (const Kjt& k : c.kjts) kp.push_back(&k);
    const OracleSource source(0x5eed0000ULL + static_cast<uint64_t>(i), c.plan);
    compare_batch(c.plan, kp, source, c.desc);
    ++n;
  }
  CHECK(n == cases);
}

TEST_CASE("dense weights: lookups and references made on the device == cpu") {
  require_gpu();
  std::mt19937_64 rng(20261205);
  const int cases = gpu_cases(150);
  int compared = 0, refused = 0;
  for (int i = 0; i < cases; ++i) {
    const Case c = random_case(rng, i);
    const std::vector<const Kjt*> kp = c.kjt_ptrs();
    const CountingSource source(random_source(rng, c.plan, 0xde75e000ULL + uint64_t(i), true));
    if (compare_on_device(c.plan, kp, source, source, c.desc + " dense"))
      ++compared;
    else
      ++refused;
  }
  MESSAGE(compared << " batches compared, " << refused << " refused alike by both backends");
  CHECK(compared + refused == cases);
  // Both outcomes are exercised: a hashed table's raw keys are mostly past its dense rows, so
  // many random batches are refused; continuous tables' are not.
  CHECK(compared > 0);
  CHECK(refused > 0);
}

// Rows resolved on the device (resolve.cu) under bounds_check=error: a batch with an id outside
// its shard is refused in the CPU reference's words; one without is made on the device == cpu
// (every id of a continuous feature folded into its table in half the cases, so both occur).
TEST_CASE("bounds_check=error: refused like the cpu, or made on the device == cpu") {
  require_gpu();
  std::mt19937_64 rng(20261207);
  const int cases = gpu_cases(150);
  int compared = 0, refused = 0;
  for (int i = 0; i < cases; ++i) {
    Case c = random_case(rng, i);
    c.plan.bounds_check = BoundsCheck::error;
    if (i % 2 == 0)
      for (Kjt& k : c.kjts) {
        const std::vector<int64_t> off = k.offsets();
        for (int64_t f = 0; f < k.num_features; ++f) {
          const FeatureInfo& fi = c.plan.features[size_t(f)];
          if (fi.dist_type != DistType::continuous) continue;
          const int64_t j0 = k.bag_begin(f), j1 = j0 + k.batch_size(f);
          for (int64_t p = off[size_t(j0)]; p < off[size_t(j1)]; ++p)
            k.values[size_t(p)] = int64_t(uint64_t(k.values[size_t(p)]) % uint64_t(fi.hash_size));
        }
      }
    const std::vector<const Kjt*> kp = c.kjt_ptrs();
    const CountingSource source(
        random_source(rng, c.plan, 0xb0e40000ULL + uint64_t(i), i % 3 == 0));
    if (compare_on_device(c.plan, kp, source, source, c.desc + " bounds_check=error"))
      ++compared;
    else
      ++refused;
  }
  MESSAGE(compared << " batches compared, " << refused << " refused alike by both backends");
  CHECK(compared > cases / 4);
  CHECK(refused > cases / 4);
}

TEST_CASE("column slices: lookups and references made on the device == cpu") {
  require_gpu();
  std::mt19937_64 rng(20261206);
  const int cases = gpu_cases(150);
  int compared = 0, slices = 0;
  for (int i = 0; i < cases; ++i) {
    const Case c = random_case(rng, i);
    const std::vector<const Kjt*> kp = c.kjt_ptrs();
    auto counted = std::make_shared<CountingSource>(
        random_source(rng, c.plan, 0x511ce000ULL + uint64_t(i), i % 2 == 1));
    // Two to four slices of random widths covering every column.
    const int64_t C = embedding_columns(c.plan);
    std::vector<int64_t> cuts = {0, C};
    for (int k = 0; k < 3 && C > 1; ++k) cuts.push_back(1 + int64_t(rng() % uint64_t(C - 1)));
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    bool all = true;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const ColumnSlice s = make_column_slice(c.plan, counted, cuts[k], cuts[k + 1]);
      all = compare_on_device(s.plan, kp, *s.source, *counted,
                              c.desc + " columns [" + std::to_string(cuts[k]) + ", " +
                                  std::to_string(cuts[k + 1]) + ")") &&
            all;
      ++slices;
    }
    compared += all ? 1 : 0;
  }
  MESSAGE(compared << " of " << cases << " batches compared in " << slices << " slices");
  CHECK(compared >= cases / 2);
}

// Rows only row() knows (no oracle seed, no dense weights): the device cannot make them.
class HostOnlySource final : public EmbeddingSource {
 public:
  explicit HostOnlySource(const EmbeddingSource& inner) : inner_(inner) {}
  void row(int table, uint64_t g, float* out, int64_t dim) const override {
    inner_.row(table, g, out, dim);
  }

 private:
  const EmbeddingSource& inner_;
};

TEST_CASE("a kept lookup: rows only the host can make; an input neither given nor kept") {
  require_gpu();
  std::mt19937_64 rng(7);
  int refused = 0;
  for (int i = 0; i < 20; ++i) {
    const Case c = random_case(rng, i);
    const std::vector<const Kjt*> kp = c.kjt_ptrs();
    const DerivedBatch derived = derive_input_dist(c.plan, kp);
    const OracleSource oracle(11 + uint64_t(i), c.plan);
    std::vector<EmbTensor> local = derive_local_embs(c.plan, derived, oracle, cpu(), 0);
    const HostOnlySource host_only(oracle);
    for (int64_t r = 0; r < c.plan.world_size; ++r) {
      // Made on the host and handed back whole; the rank's kept lookup is gone.
      const Tensor made =
          gpu().lookup(c.plan, int(r), derived.ranks[r].lookup_kjt, host_only, Place::kept);
      INFO(c.desc << " rank " << r);
      CHECK_FALSE(made.kept.has_value());
      CHECK(made.t.shape == local[r].shape);
      CHECK(same_bits(made.t.data, local[r].data));
    }
    int64_t r = 0;
    while (r < c.plan.world_size && local[r].numel() == 0) ++r;
    if (r == c.plan.world_size) continue;
    std::vector<TensorRef> in(local.begin(), local.end());
    in[size_t(r)].host = nullptr;  // neither data nor a name
    CHECK_THROWS_WITH_AS(test::run_output_dist(gpu(), c.plan, derived, in, Place::host),
                         doctest::Contains("has neither data nor a kept tensor"), Error);
    in[size_t(r)].kept = Kept{Kept::Role::lookup, int(r)};  // a name kept no longer
    CHECK_THROWS_WITH_AS(test::run_output_dist(gpu(), c.plan, derived, in, Place::host),
                         doctest::Contains("that is not kept with"), Error);
    ++refused;
  }
  CHECK(refused > 10);
}

// The batched bucketize of all W ranks in one launch (what `bench` times), through both
// paths of launch_bucketize: the one-pass kernel (a block per bag; bags of
// <= 2048 ids keep them on chip, longer ones are ranked again chunk by chunk; blocks of a
// rank exchange epoch-tagged counts) and the three-pass path. Every output is compared with
// the CPU reference rank by rank.
TEST_CASE("batched bucketize: one-pass and three-pass paths == cpu") {
  require_gpu();
  std::mt19937_64 rng(7);
  auto U = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  cudaStream_t s = nullptr;
  int fused_runs = 0, hist_runs = 0, full_rr_runs = 0, plain_hist_runs = 0;
  for (int it = 0; it < 40; ++it) {
    Plan p;
    p.world_size = std::vector<int64_t>{1, 2, 5, 16, 256}[U(0, 4)];
    p.module = ModuleKind::sequence;
    const int64_t T = U(1, 3);
    for (int64_t t = 0; t < T; ++t) {
      TableConfig tc;
      tc.name = "t" + std::to_string(t);
      // Some tables are larger than int32 ids address: blk * W wraps for them (FBGEMM's
      // uindex_t), and blk reaches the range where the fp32 quotient estimate is coarse.
      const int64_t size_kind = U(0, 5);
      tc.num_embeddings = size_kind == 0   ? U(1, 7)
                          : size_kind == 1 ? (int64_t{1} << 33) + U(0, 1000)
                                           : U(10, 100000);
      tc.embedding_dim = 4;
      tc.dist_type = static_cast<DistType>(U(0, 2));
      tc.features = {tc.name + "_f"};
      p.tables.push_back(tc);
    }
    p.finalize();
    const int64_t W = p.world_size, F = p.num_features();
    const bool weighted = U(0, 2) == 0, i32 = U(0, 3) == 0;
    std::vector<Kjt> kjts(static_cast<size_t>(W));
    for (int64_t r = 0; r < W; ++r) {
      Kjt& k = kjts[r];
      k.num_features = F;
      k.weighted = weighted;
      k.values_type = i32 ? IndexType::i32 : IndexType::i64;
      const int64_t B = W > 16 ? U(0, 1) : U(0, 9);  // some ranks have no bags
      for (int64_t f = 0; f < F; ++f)
        for (int64_t b = 0; b < B; ++b) {
          const int64_t kind = U(0, 9);
          // Odd iterations keep every bag within one 2048-id chunk (with W <= 16: the one-pass
          // kernel's histogram-first path, rank_from_dest), half their long bags exactly full
          // (its no-bounds-test path for round-robin rules and W a power of two).
          const int64_t long_len = it % 2 == 0 ? U(2040, 2300) : U(0, 1) ? 2048 : U(2040, 2047);
          const int64_t len = kind == 0 ? 0 : kind == 1 ? long_len : U(1, 300);
          k.lengths.push_back(len);
          for (int64_t i = 0; i < len; ++i) {
            int64_t id = U(0, 4) == 0 ? static_cast<int64_t>(rng() >> 1)
                                      : U(-3, p.features[f].hash_size + 5);
            if (i32) id = static_cast<int64_t>(static_cast<int32_t>(id));
            k.values.push_back(id);
            if (weighted) k.weights.push_back(static_cast<float>(U(-8, 8)) / 4.0f);
          }
        }
    }
    std::vector<const Kjt*> kp;
    for (const Kjt& k : kjts) kp.push_back(&k);
    std::vector<int64_t> ref_off{0};
    for (const Kjt& k : kjts)
      for (int64_t l : k.lengths) ref_off.push_back(ref_off.back() + l);
    // A full 2048-id bag of a round-robin feature with W a power of two (hist_chunk's fast
    // path, which routes by masking).
    bool full_rr = false;
    for (const Kjt& k : kjts)
      for (int64_t f = 0, i = 0; f < F; ++f)
        for (int64_t b = 0; b < k.batch_size(f); ++b, ++i)
          full_rr =
              full_rr || (k.lengths[i] == 2048 && p.features[f].dist_type != DistType::continuous);
    full_rr = full_rr && (W & (W - 1)) == 0 && W <= 16;
    for (int variant = 0; variant < 3; ++variant) {
      // 0: the one-pass kernel where eligible (a block per bag); 1 and 2: the three passes
      // with a block per bag and with a warp per bag, whatever the lengths (short bags by
      // blocks and 2048-id bags by warps are covered too).
      // Without dest_rank (as `bench` runs it) in every third iteration: the placement's
      // common instance, which writes neither weights nor dest_rank when unweighted.
      const bool with_dest = it % 3 != 0;
      cuda::BatchedBucketize bb(p, kp, with_dest, s);
      bb.args.bag_path =
          variant == 2 ? cuda::BucketizeArgs::BagPath::warp : cuda::BucketizeArgs::BagPath::block;
      const cuda::BucketizeArgs& ba = bb.args;
      const int64_t N = ba.total_ids, L = ba.total_bags, max_rank_bags = bb.max_rank_bags;
      REQUIRE(ba.ids_i32 == i32);
      REQUIRE((ba.weights != nullptr) == (weighted && N > 0));
      if (variant == 0) {
        bb.enable_one_pass(s);
        REQUIRE(bb.one_pass.scratch != nullptr);  // an H200 has cooperative launch
      }
      const cuda::BucketizeOnePass& one_pass = bb.one_pass;
      const bool want_fused = variant == 0 && L > 0 && max_rank_bags * W <= 65536 &&
                              L <= cuda::bucketize_one_pass_capacity();
      INFO("it " << it << " variant " << variant << " W=" << W << " F=" << F << " L=" << L
                 << " N=" << N << " weighted=" << weighted << " int32=" << i32);
      CHECK((cuda::bucketize_choice(ba, one_pass).path == cuda::BucketizePath::one_pass) ==
            want_fused);
      fused_runs += want_fused;
      hist_runs += want_fused && W <= 16 && ba.max_bag_len <= 2048;
      full_rr_runs += want_fused && full_rr && ba.max_bag_len <= 2048;
      plain_hist_runs += want_fused && W <= 16 && ba.max_bag_len <= 2048 && !with_dest && !weighted;
      // First on other ids (same lengths), then twice on the real ones, all on one scratch:
      // the scratch words of an earlier launch hold other counts, so a block that took a
      // stale word for a fresh one (the epoch tag) would misplace ids below.
      DeviceBuffer<int64_t> d_other;
      std::vector<int64_t> other(static_cast<size_t>(N));
      for (size_t i = 0; i < other.size(); ++i) other[i] = static_cast<int64_t>(rng() >> 1);
      d_other.upload(other, s);
      cuda::BucketizeArgs warm = ba;
      warm.ids = d_other.data();
      cuda::launch_bucketize(warm, bb.d_lengths.data(), bb.one_pass, s);
      for (int rep = 0; rep < 2; ++rep) bb.launch(s);
      CHECK(one_pass.epoch == (want_fused ? 3u : 0u));
      CHECK(bb.d_bag_offsets.download(s) == ref_off);
      const std::vector<int64_t> nl = bb.d_new_lengths.download(s),
                                 nv = bb.d_new_values.download(s), perm = bb.d_perm.download(s),
                                 dest = with_dest ? bb.d_dest_rank.download(s)
                                                  : std::vector<int64_t>{};
      const std::vector<float> nw = weighted ? bb.d_new_weights.download(s) : std::vector<float>{};
      int64_t o = 0, ol = 0;
      for (int64_t r = 0; r < W; ++r) {
        const BucketizedKjt ref = cpu().bucketize(p, kjts[r]);
        const size_t n = ref.new_values.size(), nlr = ref.new_lengths.size();
        INFO("rank " << r);
        CHECK(std::vector<int64_t>(nl.begin() + ol, nl.begin() + ol + nlr) == ref.new_lengths);
        CHECK(std::vector<int64_t>(nv.begin() + o, nv.begin() + o + n) == ref.new_values);
        CHECK(std::vector<int64_t>(perm.begin() + o, perm.begin() + o + n) ==
              ref.unbucketize_permute);
        if (with_dest)
          CHECK(std::vector<int64_t>(dest.begin() + o, dest.begin() + o + n) == ref.dest_rank);
        if (weighted)
          CHECK(same_bits(std::vector<float>(nw.begin() + o, nw.begin() + o + n), ref.new_weights));
        o += n;
        ol += nlr;
      }
    }
  }
  CHECK(fused_runs >= 25);
  CHECK(hist_runs >= 10);
  CHECK(full_rr_runs >= 3);
  MESSAGE("one-pass runs " << fused_runs << ", histogram-first " << hist_runs
                           << " (without weights and dest_rank: " << plain_hist_runs << ")");
  CHECK(plain_hist_runs >= 1);
}

// A batch of plan p: every rank has `bags` bags per feature, bag lengths from len(rng), ids
// in and past the table (continuous, roundrobin and hash_roundrobin features).
Plan bucketize_plan(int64_t W) {
  Plan p;
  p.world_size = W;
  p.module = ModuleKind::sequence;
  for (int64_t t = 0; t < 3; ++t) {
    TableConfig tc;
    tc.name = "t" + std::to_string(t);
    tc.num_embeddings = 1000 * W + 7;
    tc.embedding_dim = 4;
    tc.dist_type = static_cast<DistType>(t);
    tc.features = {tc.name + "_f"};
    p.tables.push_back(tc);
  }
  p.finalize();
  return p;
}

template <typename Len>
std::vector<Kjt> bucketize_batch(const Plan& p, int64_t bags, Len len, std::mt19937_64& rng) {
  std::vector<Kjt> kjts(static_cast<size_t>(p.world_size));
  for (Kjt& k : kjts) {
    k.num_features = p.num_features();
    for (int64_t f = 0; f < k.num_features; ++f)
      for (int64_t b = 0; b < bags; ++b) {
        const int64_t n = len(rng);
        k.lengths.push_back(n);
        for (int64_t i = 0; i < n; ++i)
          k.values.push_back(static_cast<int64_t>(rng() % (p.features[f].hash_size + 9)));
      }
  }
  return kjts;
}

// Runs the batched bucketize of kjts (with the one-pass workspace when one_pass) and checks
// every output against the CPU reference; returns the path it took.
cuda::BucketizeChoice check_batched_bucketize(const Plan& p, const std::vector<Kjt>& kjts,
                                              bool one_pass) {
  std::vector<const Kjt*> kp;
  for (const Kjt& k : kjts) kp.push_back(&k);
  cudaStream_t s = nullptr;
  cuda::BatchedBucketize bb(p, kp, /*with_dest_rank=*/true, s);
  if (one_pass) bb.enable_one_pass(s);
  const cuda::BucketizeChoice choice = cuda::bucketize_choice(bb.args, bb.one_pass);
  bb.launch(s);
  const std::vector<int64_t> nl = bb.d_new_lengths.download(s), nv = bb.d_new_values.download(s),
                             perm = bb.d_perm.download(s), dest = bb.d_dest_rank.download(s);
  size_t o = 0, ol = 0;
  for (size_t r = 0; r < kjts.size(); ++r) {
    const BucketizedKjt ref = cpu().bucketize(p, kjts[r]);
    const size_t n = ref.new_values.size(), nlr = ref.new_lengths.size();
    INFO("rank " << r << " path " << cuda::to_string(choice.path));
    CHECK(std::vector<int64_t>(nl.begin() + ol, nl.begin() + ol + nlr) == ref.new_lengths);
    CHECK(std::vector<int64_t>(nv.begin() + o, nv.begin() + o + n) == ref.new_values);
    CHECK(std::vector<int64_t>(perm.begin() + o, perm.begin() + o + n) == ref.unbucketize_permute);
    CHECK(std::vector<int64_t>(dest.begin() + o, dest.begin() + o + n) == ref.dest_rank);
    o += n;
    ol += nlr;
  }
  return choice;
}

// W > 256 takes the three passes with a thread per bag (the one-pass kernel and the shared
// per-bucket arrays stop at 256 buckets).
TEST_CASE("batched bucketize: W > 256 (a thread per bag) == cpu") {
  require_gpu();
  std::mt19937_64 rng(11);
  for (const int64_t W : {300, 4096}) {
    const Plan p = bucketize_plan(W);
    for (const int64_t max_len : {3, 40, 700}) {
      INFO("W=" << W << " bags of <= " << max_len << " ids");
      std::vector<Kjt> kjts = bucketize_batch(
          p, W > 1000 ? 1 : 2,
          [&](std::mt19937_64& g) { return static_cast<int64_t>(g() % (max_len + 1)); }, rng);
      // W = 4096: bags on one rank in 16 only, so new_lengths (W x bags) stays ~3 M entries and
      // the case stays short under compute-sanitizer.
      for (size_t r = 0; r < kjts.size(); ++r)
        if (W > 1000 && r % 16 != 0) {
          kjts[r].lengths.clear();
          kjts[r].values.clear();
        }
      for (const bool one_pass : {false, true})
        CHECK(check_batched_bucketize(p, kjts, one_pass).path ==
              cuda::BucketizePath::thread_per_bag);
    }
  }
}

// Each instance of the one-pass kernel on a batch that must take it: 4-bit buckets (W <= 16)
// and 8-bit, bags within one 2048-id chunk (ids kept on chip) and longer (Long: ranked again
// chunk by chunk).
TEST_CASE("batched bucketize: every one-pass instance == cpu") {
  require_gpu();
  std::mt19937_64 rng(12);
  for (const int64_t W : {8, 256})
    for (const bool long_bags : {false, true}) {
      INFO("W=" << W << " long bags " << long_bags);
      const Plan p = bucketize_plan(W);
      // Every bag must have a resident block: with W = 256 only one rank in three has bags
      // (one per feature: 258 bags).
      const int64_t bags = W <= 16 ? 4 : 1;
      std::vector<Kjt> kjts = bucketize_batch(
          p, bags,
          [&](std::mt19937_64& g) {
            return long_bags ? 2049 + static_cast<int64_t>(g() % 2000)
                             : static_cast<int64_t>(g() % 2049);
          },
          rng);
      int64_t total_bags = 0;
      for (size_t r = 0; r < kjts.size(); ++r) {
        if (W > 16 && r % 3 != 0) {  // no bags on this rank
          kjts[r].lengths.clear();
          kjts[r].values.clear();
        }
        total_bags += static_cast<int64_t>(kjts[r].lengths.size());
      }
      if (total_bags > cuda::bucketize_one_pass_capacity()) {
        MESSAGE("skipped: more bags than resident blocks of the one-pass kernel");
        continue;
      }
      const cuda::BucketizeChoice c = check_batched_bucketize(p, kjts, true);
      CHECK(c.path == cuda::BucketizePath::one_pass);
      CHECK(c.ids_cached == !long_bags);
    }
}

// The backend's bucketize of a whole batch whose ranks differ in values type (an int32 KJT
// routes u32(id), so a negative id lands elsewhere than as int64) and in size (an empty rank),
// weighted: each rank as the host bucketizes it, and the replay's input dist on it unchanged.
TEST_CASE("backend bucketize: a batch of int32 and int64 ranks == cpu") {
  require_gpu();
  std::mt19937_64 rng(14);
  for (const int64_t W : {1, 3, 8}) {
    const Plan p = bucketize_plan(W);
    std::vector<Kjt> kjts = bucketize_batch(
        p, 5, [](std::mt19937_64& g) { return static_cast<int64_t>(g() % 9); }, rng);
    for (size_t r = 0; r < kjts.size(); ++r) {
      Kjt& k = kjts[r];
      k.values_type = r % 2 ? IndexType::i32 : IndexType::i64;
      for (int64_t& v : k.values)
        if (rng() % 4 == 0) v = -v - 1;  // negative: u32 routing differs from int64
      k.weighted = true;
      for (size_t i = 0; i < k.values.size(); ++i) k.weights.push_back(0.25f * float(i));
      if (r == 2) {  // an empty rank: bags of no ids
        k.values.clear();
        k.weights.clear();
        for (int64_t& l : k.lengths) l = 0;
      }
    }
    std::vector<const Kjt*> kp;
    for (const Kjt& k : kjts) kp.push_back(&k);
    INFO("W=" << W);
    const std::vector<BucketizedKjt> got = gpu().bucketize(p, kp);
    const std::vector<BucketizedKjt> want = bucketize_ranks(p, kp);
    REQUIRE(got.size() == want.size());
    for (size_t r = 0; r < want.size(); ++r) {
      INFO("rank " << r);
      check_backend_bucketize(p, got[r], want[r]);
    }
    check_same_input_dist(derive_input_dist(p, kp, &gpu()), derive_input_dist(p, kp));
  }
}

// Batches past the one-pass kernel's capacity (thousands to a million bags): the partition
// path (W <= 256, tiles of bags) against the CPU reference, every output bit for bit, with the
// shapes it was built for and its edges: B = 8192-65536 bags per feature on a rank, W = 1, 5,
// 8, 17, 256 (4-bit and 8-bit buckets, W not a power of two), bags of 0-20 ids and long bags
// (forced: automatic gives those a block per bag), empty bags and empty ranks, ids negative,
// past the table and raw 63-bit keys, int32 and int64, weights, each dist_type (one table of
// each), tile bases summed by the place kernel and by the cub scan, offset 0 poisoned (the
// count kernel writes the bag offsets). W = 300 has no partition (8-bit bucket keys): it must
// take a thread per bag.
// DYNEMB_GPU_CASES (set for compute-sanitizer) shrinks the batches.
TEST_CASE("batched bucketize: the partition path (large batches) == cpu") {
  require_gpu();
  const bool small = std::getenv("DYNEMB_GPU_CASES") != nullptr;
  std::mt19937_64 rng(27);
  auto U = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  struct Shape {
    int64_t W, B, B_small, min_len, max_len;         // B_small: under DYNEMB_GPU_CASES
    bool force, i32, weighted, with_dest, lopsided;  // lopsided: rank 0 holds most bags
    // mixed: features of unlike hotness (bags of feature 1 up to 6 x max_len ids, of feature
    // 2 at most one id: the host plans tiles of unlike bag counts); tile_ids: tiles re-planned
    // for about that many ids (0: the automatic tiling).
    bool mixed = false;
    int64_t tile_ids = 0;
  };
  // Every shape keeps more bags than the one-pass kernel's capacity (<= 1024) in both sizes.
  const std::vector<Shape> shapes = {
      {8, 8192, 512, 0, 20, false, false, false, false, false},  // ec-bench-criteo's shape
      {8, 8192, 512, 0, 20, false, true, true, true, false},
      {8, 65536, 2048, 0, 4, false, false, true, true, true},
      // W x tiles per rank > kPartDirectBaseEntries: tile bases by the cub scan (the first
      // only in the full size, the second in both), not summed by the place kernel.
      {16, 65536, 2048, 0, 4, false, true, true, false, true},
      {64, 2048, 2048, 0, 6, false, false, true, true, false},
      {1, 8192, 512, 0, 20, false, true, false, true, false},
      {5, 4096, 256, 0, 30, false, false, true, true, false},
      {17, 1024, 128, 0, 60, false, true, true, true, false},
      {256, 16, 16, 0, 20, false, false, true, true, false},
      {16, 64, 24, 100, 3000, true, false, true, true, false},  // long bags, forced
      {8, 2048, 64, 0, 300, true, true, false, true, false},
      {300, 256, 32, 0, 20, false, false, true, true, false},                // thread per bag
      {8, 8192, 512, 0, 16, false, false, true, true, false, true, 0},       // unit-pooled-w8-like
      {8, 4096, 512, 0, 16, false, true, false, true, true, true, 700},      // tiles under a chunk
      {16, 2048, 256, 0, 20, false, false, true, false, false, false, 100},  // tiles of ~10 bags
      {256, 64, 32, 0, 40, false, true, true, true, false, true, 5000},  // over a chunk, 16 bags
  };
  int resident_runs = 0, two_kernel_runs = 0;
  int one_chunk_runs = 0, multi_chunk_runs = 0;  // one launch, W <= 16: the two orders
  for (const Shape& sh : shapes) {
    const Plan p = bucketize_plan(sh.W);
    const int64_t W = sh.W, F = p.num_features();
    std::vector<Kjt> kjts(static_cast<size_t>(W));
    for (int64_t r = 0; r < W; ++r) {
      Kjt& k = kjts[r];
      k.num_features = F;
      k.weighted = sh.weighted;
      k.values_type = sh.i32 ? IndexType::i32 : IndexType::i64;
      // W > 16: bags on every 4th rank only (new_lengths is W x bags); lopsided: rank 0
      // holds B bags per feature, the others B / 64; rank 1 none, rank 2 only empty bags
      // (tiles with bags but no ids).
      const int64_t Bs = small ? sh.B_small : sh.B;
      int64_t B = Bs;
      if (W > 16 && r % 4 != 0) B = 0;
      if (sh.lopsided && r > 0) B = r == 1 ? 0 : std::max<int64_t>(1, Bs / 64);
      for (int64_t f = 0; f < F; ++f)
        for (int64_t b = 0; b < B; ++b) {
          const int64_t max_len = !sh.mixed ? sh.max_len
                                  : f == 1  ? 6 * sh.max_len
                                  : f == 2  ? 1
                                            : sh.max_len;
          const int64_t len = U(0, 9) == 0 || (sh.lopsided && r == 2)
                                  ? 0
                                  : U(std::min(sh.min_len, max_len),
                                      small ? std::min<int64_t>(max_len, 400) : max_len);
          k.lengths.push_back(len);
          for (int64_t i = 0; i < len; ++i) {
            const int64_t kind = U(0, 19);
            int64_t id = kind == 0   ? -U(1, 5)
                         : kind == 1 ? p.features[f].hash_size + U(0, 3 * W)
                         : kind == 2 ? static_cast<int64_t>(rng() >> 1)
                                     : U(0, p.features[f].hash_size - 1);
            if (sh.i32) id = static_cast<int64_t>(static_cast<int32_t>(id));
            k.values.push_back(id);
            if (sh.weighted) k.weights.push_back(static_cast<float>(U(-8, 8)) / 4.0f);
          }
        }
    }
    std::vector<const Kjt*> kp;
    for (const Kjt& k : kjts) kp.push_back(&k);
    cudaStream_t s = nullptr;
    // Each shape both ways: the partition's one launch (where its tiles all fit resident) and
    // its two kernels.
    for (const bool one_launch : {true, false}) {
      cuda::BatchedBucketize bb(p, kp, sh.with_dest, s);
      bb.args.partition_one_launch = one_launch;
      bb.enable_one_pass(s);  // plans the tiles again, for one launch where they can all fit
      if (sh.force) bb.args.bag_path = cuda::BucketizeArgs::BagPath::partition;
      if (sh.tile_ids > 0) bb.plan_tiles(sh.tile_ids, s);
      const cuda::BucketizeArgs& ba = bb.args;
      const cuda::BucketizeChoice c = cuda::bucketize_choice(ba, bb.one_pass);
      const bool resident =
          one_launch && W * ba.tiles_per_rank <= cuda::bucketize_partition_resident_capacity();
      INFO("W=" << W << " B=" << (small ? sh.B_small : sh.B) << " bags of " << sh.min_len << ".."
                << sh.max_len << " ids, L=" << ba.total_bags << " N=" << ba.total_ids << " int32="
                << sh.i32 << " weighted=" << sh.weighted << " path " << cuda::to_string(c.path)
                << " tiles " << ba.tiles_per_rank << " per rank, <= " << ba.tile_max_bags
                << " bags, <= " << ba.tile_max_ids << " ids");
      CHECK(c.path == (W > 256    ? cuda::BucketizePath::thread_per_bag
                       : resident ? cuda::BucketizePath::partition_resident
                                  : cuda::BucketizePath::partition));
      if (W <= 256) ++(resident ? resident_runs : two_kernel_runs);
      // W <= 16 with tiles of at most one chunk: the one launch's counts-first instance.
      if (resident && W <= cuda::bucketize::kSmallW)
        ++(ba.tile_max_ids <= cuda::bucketize::kChunk ? one_chunk_runs : multi_chunk_runs);
      // First on other ids (same lengths), then on the real ones: new_offsets (the tile counts)
      // and every output then hold an earlier launch's values, which must all be replaced.
      DeviceBuffer<int64_t> d_other;
      std::vector<int64_t> other(static_cast<size_t>(ba.total_ids));
      for (int64_t& x : other) x = static_cast<int64_t>(rng() >> 1);
      d_other.upload(other, s);
      cuda::BucketizeArgs warm = ba;
      warm.ids = d_other.data();
      cuda::launch_bucketize(warm, bb.d_lengths.data(), bb.one_pass, s);
      // The partition path's offsets scan leaves entry 0 to the count kernel: poison it.
      REQUIRE(cudaMemsetAsync(bb.d_bag_offsets.data(), 0xff, sizeof(int64_t), s) == cudaSuccess);
      bb.launch(s);
      std::vector<int64_t> ref_off{0};
      for (const Kjt& k : kjts)
        for (int64_t l : k.lengths) ref_off.push_back(ref_off.back() + l);
      CHECK(bb.d_bag_offsets.download(s) == ref_off);
      const std::vector<int64_t> nl = bb.d_new_lengths.download(s),
                                 nv = bb.d_new_values.download(s), perm = bb.d_perm.download(s),
                                 dest = sh.with_dest ? bb.d_dest_rank.download(s)
                                                     : std::vector<int64_t>{};
      const std::vector<float> nw =
          ba.weights ? bb.d_new_weights.download(s) : std::vector<float>{};
      size_t o = 0, ol = 0;
      for (int64_t r = 0; r < W; ++r) {
        const BucketizedKjt ref = cpu().bucketize(p, kjts[r]);
        const size_t n = ref.new_values.size(), nlr = ref.new_lengths.size();
        INFO("rank " << r);
        CHECK(std::vector<int64_t>(nl.begin() + ol, nl.begin() + ol + nlr) == ref.new_lengths);
        CHECK(std::vector<int64_t>(nv.begin() + o, nv.begin() + o + n) == ref.new_values);
        CHECK(std::vector<int64_t>(perm.begin() + o, perm.begin() + o + n) ==
              ref.unbucketize_permute);
        if (sh.with_dest)
          CHECK(std::vector<int64_t>(dest.begin() + o, dest.begin() + o + n) == ref.dest_rank);
        if (ba.weights)
          CHECK(same_bits(std::vector<float>(nw.begin() + o, nw.begin() + o + n), ref.new_weights));
        o += n;
        ol += nlr;
      }
    }
  }
  // Both partition kernels ran (the small shapes fit one launch, the large ones do not), and
  // the one launch's counts-first instance (tiles of one chunk: the re-planned tiles under a
  // chunk, and the small batches). Tiles of several chunks at W <= 16 come with the full
  // batches (ec-bench-criteo's shape).
  CHECK(resident_runs > 0);
  CHECK(two_kernel_runs > 0);
  CHECK(one_chunk_runs > 0);
  if (!small) CHECK(multi_chunk_runs > 0);
}

TEST_CASE("worked example (docs/semantics.md §6.1) on the GPU") {
  require_gpu();
  // §3.4 / §6.1: W=2, f0 (10 rows, blk 5), f1 (6 rows, blk 3), D = 2 rows E_f(g).
  Plan p;
  p.world_size = 2;
  p.module = ModuleKind::sequence;
  for (int t = 0; t < 2; ++t) {
    TableConfig tc;
    tc.name = "t" + std::to_string(t);
    tc.num_embeddings = t == 0 ? 10 : 6;
    tc.embedding_dim = 2;
    tc.features = {"f" + std::to_string(t)};
    p.tables.push_back(tc);
  }
  p.finalize();
  Kjt k0, k1;
  k0.num_features = k1.num_features = 2;
  k0.lengths = {2, 1, 0, 3};
  k0.values = {1, 7, 5, 4, 0, 2};
  k1.lengths = {1, 2, 1, 0};
  k1.values = {9, 0, 3, 5};
  const BucketizedKjt b0 = gpu().bucketize(p, k0);
  CHECK(b0.new_lengths == std::vector<int64_t>{1, 0, 0, 2, 1, 1, 0, 1});
  CHECK(b0.new_values == std::vector<int64_t>{1, 0, 2, 2, 0, 1});
  CHECK(b0.unbucketize_permute == std::vector<int64_t>{0, 3, 4, 5, 1, 2});
  const BucketizedKjt b1 = gpu().bucketize(p, k1);
  CHECK(b1.new_lengths == std::vector<int64_t>{0, 2, 0, 0, 1, 0, 1, 0});
  CHECK(b1.new_values == std::vector<int64_t>{0, 3, 4, 2});
  CHECK(b1.unbucketize_permute == std::vector<int64_t>{2, 0, 1, 3});
  // The output dist with the derived contexts and the §6.1 local_embs.
  const DerivedBatch d = derive_input_dist(p, {&k0, &k1});
  EmbTensor l0, l1;
  l0.shape = l1.shape = {5, 2};
  l0.data = {1, 1.5, 0, 0.5, 3, 3.5, 100, 100.5, 102, 102.5};
  l1.data = {7, 7.5, 5, 5.5, 9, 9.5, 104, 104.5, 105, 105.5};
  std::vector<Tensor> out(2);
  gpu().sequence_output_dist(p, {l0, l1}, {&d.ranks[0].ctx, &d.ranks[1].ctx}, Place::host,
                             [&](int r, Tensor&& t) { out[r] = std::move(t); });
  CHECK(out[0].t.data ==
        std::vector<float>{1, 1.5, 7, 7.5, 5, 5.5, 104, 104.5, 100, 100.5, 102, 102.5});
  CHECK(out[1].t.data == std::vector<float>{9, 9.5, 0, 0.5, 3, 3.5, 105, 105.5});
}

TEST_CASE("a bad context fails the same way on both backends") {
  require_gpu();
  std::mt19937_64 rng(7);
  for (int tries = 0; tries < 200; ++tries) {
    Case c = random_case(rng, tries);
    if (c.plan.module != ModuleKind::sequence || c.plan.world_size < 2) continue;
    std::vector<const Kjt*> kp;
    for (const Kjt& k : c.kjts) kp.push_back(&k);
    DerivedBatch d = derive_input_dist(c.plan, kp);
    if (d.ranks[1].ctx.unbucketize_permute->empty()) continue;
    (*d.ranks[1].ctx.unbucketize_permute)[0] = 1 << 30;  // out of range
    const OracleSource src(1, c.plan);
    std::vector<EmbTensor> local = derive_local_embs(c.plan, d, src, cpu(), 0);
    const std::vector<TensorRef> lp(local.begin(), local.end());
    std::vector<const ShardingContext*> cp;
    for (size_t r = 0; r < local.size(); ++r) cp.push_back(&d.ranks[r].ctx);
    auto noop = [](int, Tensor&&) {};
    int rank_cpu = -1, rank_gpu = -2;
    std::string field_cpu, field_gpu;
    try {
      cpu().sequence_output_dist(c.plan, lp, cp, Place::host, noop);
    } catch (const OutputDistFailure& e) {
      rank_cpu = e.rank();
      field_cpu = e.field();
    }
    try {
      gpu().sequence_output_dist(c.plan, lp, cp, Place::host, noop);
    } catch (const OutputDistFailure& e) {
      rank_gpu = e.rank();
      field_gpu = e.field();
    }
    CHECK(rank_cpu == 1);
    CHECK(rank_gpu == rank_cpu);
    CHECK(field_gpu == field_cpu);
    CHECK(field_gpu == "unbucketize_permute");
    return;
  }
  FAIL("no usable case drawn");
}

TEST_CASE("fixtures: cuda == cpu on every capture under fixtures/") {
  require_gpu();
  const std::filesystem::path dir = std::filesystem::path(DYNEMB_SOURCE_DIR) / "fixtures";
  int n = 0;
  if (std::filesystem::exists(dir))
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      if (e.path().extension() != ".h5") continue;
      INFO(e.path().string());
      // Fixtures that are deliberately broken (bad plans, bad files) are the CLI tests'
      // business; here only readable ones count.
      std::unique_ptr<CaptureReader> cap;
      try {
        cap = std::make_unique<CaptureReader>(e.path().string());
      } catch (const Error&) {
        continue;
      }
      Plan plan;
      std::shared_ptr<const EmbeddingSource> source;
      try {
        plan = capture_plan(*cap);
        source = open_embedding_source(*cap, plan);
      } catch (const Error&) {
        continue;
      }
      if (!source) continue;  // output dist only: nothing to look up
      for (int64_t bi = 0; bi < cap->num_batches(); ++bi) {
        Batch batch;
        try {
          batch = cap->read_batch(plan, bi);
          for (const RankBatch& rb : batch.ranks) check_kjt(plan, rb.kjt, "fixture");
        } catch (const Error&) {
          break;
        }
        std::vector<const Kjt*> kp;
        for (const RankBatch& rb : batch.ranks) kp.push_back(&rb.kjt);
        try {
          compare_batch(plan, kp, *source,
                        e.path().filename().string() + " batch " + std::to_string(bi));
        } catch (const OutputDistFailure&) {
          continue;  // the fixture's own batch is inconsistent: a replay finding, not ours
        } catch (const Error& err) {
          // bounds_check=error fixtures throw from the lookup on both backends alike.
          MESSAGE("fixture batch raised: " << err.what());
          continue;
        }
        ++n;
      }
    }
  MESSAGE("fixture batches compared: " << n);
}

TEST_CASE("64-bit indexing: gather and reduce of more than 2^31 elements") {
  require_gpu();
  using cuda::DeviceBuffer;
  const int64_t rows = 17'000'000, D = 128, n = rows * D;  // 2.18e9 floats, 8.7 GB
  REQUIRE(n > (int64_t{1} << 31));
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < static_cast<size_t>(n) * 4 * 2 + (size_t{1} << 30)) {
    MESSAGE("not enough device memory for the 2^31 case; skipped");
    return;
  }
  // src row r = oracle row r of table 0; perm reverses the rows, so the last output rows
  // read the first source rows and vice versa (offsets past 2^31 on both sides).
  std::vector<uint64_t> g(rows);
  std::vector<int32_t> tab(rows, 0);
  std::vector<int64_t> perm(rows);
  for (int64_t r = 0; r < rows; ++r) {
    g[r] = static_cast<uint64_t>(r);
    perm[r] = rows - 1 - r;
  }
  const uint64_t seed = oracle_table_seed(99, 0);
  std::vector<uint64_t> g_rev(rows);
  for (int64_t r = 0; r < rows; ++r) g_rev[r] = static_cast<uint64_t>(perm[r]);
  DeviceBuffer<uint64_t> d_g, d_g_rev;
  DeviceBuffer<int32_t> d_tab;
  DeviceBuffer<int64_t> d_perm;
  DeviceBuffer<cuda::DeviceRows> d_oracle, d_dense;
  d_g.upload(g);
  d_g_rev.upload(g_rev);
  d_tab.upload(tab);
  d_perm.upload(perm);
  cuda::DeviceRows oracle;
  oracle.seed = seed;
  d_oracle.upload(std::vector<cuda::DeviceRows>{oracle});
  DeviceBuffer<float> src(n), out(n);
  cuda::launch_lookup_rows(d_g.data(), d_tab.data(), d_oracle.data(), rows, D, src.data(), nullptr);
  // out row r = src row rows-1-r, twice: the unbucketize gather, and a lookup of dense weights
  // (src as the table's weights: row offsets past 2^31 there too).
  std::vector<float> row(D);
  cuda::DeviceRows dense;
  dense.dense = src.data();
  dense.stride = D;
  d_dense.upload(std::vector<cuda::DeviceRows>{dense});
  for (const char* how : {"gather", "dense lookup"}) {
    CUDA_CHECK(cudaMemset(out.data(), 0xff, sizeof(float) * n));  // poison: NaN everywhere
    if (how[0] == 'g')
      cuda::launch_gather_rows(src.data(), d_perm.data(), rows, D, out.data(), nullptr);
    else
      cuda::launch_lookup_rows(d_g_rev.data(), d_tab.data(), d_dense.data(), rows, D, out.data(),
                               nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int64_t r : {int64_t{0}, int64_t{1}, rows / 2, rows - 2, rows - 1, int64_t{16'777'215},
                      int64_t{16'777'216}, int64_t{16'900'001}}) {
      CUDA_CHECK(cudaMemcpy(row.data(), out.data() + r * D, 4 * D, cudaMemcpyDeviceToHost));
      bool ok = true;
      for (int64_t c = 0; c < D; ++c)
        ok = ok && row[c] == oracle_value(seed, static_cast<uint64_t>(rows - 1 - r), c);
      INFO(how << ": output row " << r);
      CHECK(ok);
    }
  }
  // Reduce of W = 2 buffers of n elements each (src and the gathered copy): element e is
  // src[e] + src[mirror(e)], both exact multiples of 1/64, so the sum is exact.
  DeviceBuffer<float> both(2 * n);
  CUDA_CHECK(cudaMemcpy(both.data(), src.data(), 4 * n, cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaMemcpy(both.data() + n, out.data(), 4 * n, cudaMemcpyDeviceToDevice));
  out = DeviceBuffer<float>();
  src = DeviceBuffer<float>();
  DeviceBuffer<float> red(n);
  cuda::launch_reduce(both.data(), 2, n, n, cuda::Precision::f32, red.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (int64_t e : {n - 1, n - 129, int64_t{1} << 31, (int64_t{1} << 31) + 77, int64_t{5}}) {
    float got = 0;
    CUDA_CHECK(cudaMemcpy(&got, red.data() + e, 4, cudaMemcpyDeviceToHost));
    const int64_t r = e / D, c = e % D;
    const float want = oracle_value(seed, r, c) + oracle_value(seed, rows - 1 - r, c);
    INFO("reduce element " << e);
    CHECK(got == want);
  }
}
