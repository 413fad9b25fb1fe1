// NCCL backend == CPU reference: the sequence and pooled output dists with all
// W ranks hosted on the visible GPUs (G = 1 on a one-GPU machine: every rank on one GPU,
// exchange through device memory, and a real 1-rank NCCL communicator), W = 1, both pooled
// paths (ncclReduceScatter and all-to-all + reduce), blocks inside one GPU sent through
// NCCL to self, on random batches and on every fixture (derived and captured contexts).
// Bit for bit wherever the sum order is ours; see docs/multi-node.md. Exits 77 without a
// GPU or when this build has no NCCL.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#if !defined(DYNEMB_HAVE_NCCL)
TEST_CASE("nccl backend") {
  std::printf("SKIP: this build has no NCCL backend (NCCL not found at configure time)\n");
  std::fflush(stdout);
  std::exit(77);
}
#else

#include <filesystem>
#include <random>
#include <string>

#include "capture/capture.hpp"
#include "engine/input_dist.hpp"
#include "engine/ops.hpp"
#include "gpu_test_support.hpp"
#include "nccl/nccl_backend.hpp"
#include "random_case.hpp"

using namespace dynemb;
using test::Case;
using test::cpu;
using test::first_diff;
using test::random_case;
using test::same_bits;

namespace {

void require_gpu() {
  test::skip_unless(nccl_visible_devices() > 0);
}

// The three configurations every case runs through.
struct Variant {
  const char* name;
  NcclOptions opt;
};
const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"default", NcclOptions{true, false}},
      {"a2a+reduce", NcclOptions{false, false}},
      {"intra-gpu-via-nccl", NcclOptions{true, true}},
  };
  return v;
}
Backend& nccl(size_t variant) {
  require_gpu();
  static std::vector<std::unique_ptr<Backend> > b(variants().size());
  if (!b[variant]) b[variant] = make_nccl_backend({}, variants()[variant].opt);
  return *b[variant];
}

// One output dist on the CPU and on every NCCL variant; outputs compared bit for bit, or
// the same OutputDistFailure (rank, field) everywhere. Returns false when the context
// failed (on all backends alike).
bool compare_dist(const Plan& plan, bool variable_batch, const std::vector<TensorRef>& lp,
                  const std::vector<const ShardingContext*>& cp, const std::string& desc) {
  INFO(desc);
  const int64_t W = plan.world_size;
  auto run = [&](Backend& b, std::vector<EmbTensor>& out, int& frank, std::string& field) {
    out.assign(W, EmbTensor{});
    auto sink = [&out](int r, Tensor&& t) {
      CHECK_FALSE(t.kept.has_value());  // the nccl backend keeps nothing, whatever is asked
      out[r] = std::move(t.t);
    };
    try {
      if (plan.module == ModuleKind::sequence)
        b.sequence_output_dist(plan, lp, cp, Place::kept, sink);
      else
        b.pooled_output_dist(plan, variable_batch, lp, cp, Place::kept, sink);
    } catch (const OutputDistFailure& e) {
      frank = e.rank();
      field = e.field();
    }
  };
  std::vector<EmbTensor> want;
  int want_rank = -1;
  std::string want_field;
  run(cpu(), want, want_rank, want_field);
  for (size_t v = 0; v < variants().size(); ++v) {
    INFO("variant " << std::string(variants()[v].name));
    std::vector<EmbTensor> got;
    int got_rank = -1;
    std::string got_field;
    run(nccl(v), got, got_rank, got_field);
    CHECK(got_rank == want_rank);
    CHECK(got_field == want_field);
    if (want_rank >= 0) continue;
    for (int64_t r = 0; r < W; ++r) {
      INFO("rank " << r << " first diff " << first_diff(want[r].data, got[r].data));
      CHECK(got[r].shape == want[r].shape);
      CHECK(got[r].dtype == want[r].dtype);
      CHECK(same_bits(got[r].data, want[r].data));
    }
  }
  return want_rank < 0;
}

// Derived contexts and local_embs (the lookup through the NCCL backend's per-GPU CUDA
// backends, compared with the CPU's), then the output dist.
bool compare_batch(const Plan& plan, const std::vector<const Kjt*>& kjts,
                   const EmbeddingSource& source, const std::string& desc) {
  INFO(desc);
  const int64_t W = plan.world_size;
  const DerivedBatch derived = derive_input_dist(plan, kjts);
  std::vector<EmbTensor> local = derive_local_embs(plan, derived, source, cpu(), 0);
  for (int64_t r = 0; r < W; ++r) {
    // Asked to keep it, the nccl backend hands it back on the host all the same.
    const Tensor g =
        nccl(0).lookup(plan, static_cast<int>(r), derived.ranks[r].lookup_kjt, source, Place::kept);
    INFO("lookup rank " << r);
    CHECK_FALSE(g.kept.has_value());
    CHECK(same_bits(g.t.data, local[r].data));
    CHECK_FALSE(nccl(0).keep(local[r], int(r)).has_value());
  }
  const std::vector<TensorRef> lp(local.begin(), local.end());
  std::vector<const ShardingContext*> cp;
  for (int64_t r = 0; r < W; ++r) cp.push_back(&derived.ranks[r].ctx);
  return compare_dist(plan, derived.variable_batch, lp, cp, desc);
}

}  // namespace

TEST_CASE("nccl backend: name, device and the W ranks per GPU") {
  require_gpu();
  CHECK(nccl(0).name() == "nccl");
  CHECK(nccl(0).device().find("NCCL " + nccl_version()) != std::string::npos);
  MESSAGE("device: " << nccl(0).device() << ", visible GPUs " << nccl_visible_devices());
  CHECK_THROWS_AS(make_nccl_backend({0, 0}), UsageError);
  CHECK_THROWS_AS(make_nccl_backend({nccl_visible_devices()}), DeviceError);
}

TEST_CASE("nccl == cpu on random batches (bit for bit)") {
  require_gpu();
  std::mt19937_64 rng(20261210);
  const char* env = std::getenv("DYNEMB_GPU_CASES");
  const int cases = env ? std::max(1, std::atoi(env)) : 200;
  int ran = 0;
  for (int i = 0; i < cases; ++i) {
    Case c = random_case(rng, i);
    std::vector<const Kjt*> kp;
    for (const Kjt& k : c.kjts) kp.push_back(&k);
    const OracleSource source(0x5eed1000ULL + static_cast<uint64_t>(i), c.plan);
    ran += compare_batch(c.plan, kp, source, c.desc) ? 1 : 0;
  }
  MESSAGE("random batches through the output dist: " << ran << " of " << cases);
  CHECK(ran > cases / 2);
}

TEST_CASE("W = 1 through a 1-rank NCCL communicator, and W = 16 on the visible GPUs") {
  require_gpu();
  std::mt19937_64 rng(11);
  for (int64_t W : {int64_t{1}, int64_t{16}})
    for (int i = 0; i < 12; ++i) {
      Case c = random_case(rng, i, W);
      std::vector<const Kjt*> kp;
      for (const Kjt& k : c.kjts) kp.push_back(&k);
      const OracleSource source(77 + static_cast<uint64_t>(i), c.plan);
      compare_batch(c.plan, kp, source, c.desc);
    }
}

TEST_CASE("docs/semantics.md worked example §6.1 through the NCCL backend") {
  require_gpu();
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
  const DerivedBatch d = derive_input_dist(p, {&k0, &k1});
  EmbTensor l0, l1;
  l0.shape = l1.shape = {5, 2};
  l0.data = {1, 1.5, 0, 0.5, 3, 3.5, 100, 100.5, 102, 102.5};
  l1.data = {7, 7.5, 5, 5.5, 9, 9.5, 104, 104.5, 105, 105.5};
  for (size_t v = 0; v < variants().size(); ++v) {
    INFO("variant " << std::string(variants()[v].name));
    std::vector<EmbTensor> out(2);
    nccl(v).sequence_output_dist(p, {l0, l1}, {&d.ranks[0].ctx, &d.ranks[1].ctx}, Place::host,
                                 [&](int r, Tensor&& t) { out[r] = std::move(t.t); });
    CHECK(out[0].data ==
          std::vector<float>{1, 1.5, 7, 7.5, 5, 5.5, 104, 104.5, 100, 100.5, 102, 102.5});
    CHECK(out[1].data == std::vector<float>{9, 9.5, 0, 0.5, 3, 3.5, 105, 105.5});
  }
}

TEST_CASE(
    "docs/semantics.md worked example §7.1 (pooled, equal batches) through the NCCL backend") {
  require_gpu();
  Plan p;
  p.world_size = 2;
  p.module = ModuleKind::pooled;
  for (int t = 0; t < 2; ++t) {
    TableConfig tc;
    tc.name = "t" + std::to_string(t);
    tc.num_embeddings = t == 0 ? 10 : 6;
    tc.embedding_dim = 2;
    tc.features = {"f" + std::to_string(t)};
    p.tables.push_back(tc);
  }
  p.finalize();
  EmbTensor l0, l1;
  l0.shape = l1.shape = {4, 4};
  l0.data = {1, 1.5, 0, 0, 0, 0, 202, 203, 0, 0, 0, 0, 3, 4, 0, 0};
  l1.data = {7, 7.5, 0, 0, 5, 5.5, 104, 104.5, 9, 9.5, 105, 105.5, 0, 0, 0, 0};
  ShardingContext c;
  c.batch_size_per_rank = std::vector<int64_t>{2, 2};
  for (size_t v = 0; v < variants().size(); ++v) {
    INFO("variant " << std::string(variants()[v].name));
    std::vector<EmbTensor> out(2);
    nccl(v).pooled_output_dist(p, false, {l0, l1}, {&c, &c}, Place::host,
                               [&](int r, Tensor&& t) { out[r] = std::move(t.t); });
    CHECK(out[0].shape == std::vector<int64_t>{2, 4});
    CHECK(out[0].data == std::vector<float>{8, 9, 0, 0, 5, 5.5, 306, 307.5});
    CHECK(out[1].data == std::vector<float>{9, 9.5, 105, 105.5, 3, 4, 0, 0});
  }
}

TEST_CASE("fixtures: nccl == cpu on every capture under fixtures/ (derived and captured ctx)") {
  require_gpu();
  const std::filesystem::path dir = std::filesystem::path(DYNEMB_SOURCE_DIR) / "fixtures";
  int derived_n = 0, captured_n = 0;
  REQUIRE(std::filesystem::exists(dir));
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".h5") continue;
    INFO(e.path().string());
    std::unique_ptr<CaptureReader> cap;
    Plan plan;
    std::shared_ptr<const EmbeddingSource> source;
    try {  // deliberately broken fixtures are the CLI tests' business
      cap = std::make_unique<CaptureReader>(e.path().string());
      plan = capture_plan(*cap);
      source = open_embedding_source(*cap, plan);
    } catch (const Error&) {
      continue;
    }
    for (int64_t bi = 0; bi < cap->num_batches(); ++bi) {
      Batch batch;
      try {
        batch = cap->read_batch(plan, bi);
        for (const RankBatch& rb : batch.ranks) check_kjt(plan, rb.kjt, "fixture");
      } catch (const Error&) {
        break;
      }
      const std::string what = e.path().filename().string() + " batch " + std::to_string(bi);
      std::vector<const Kjt*> kp;
      for (const RankBatch& rb : batch.ranks) kp.push_back(&rb.kjt);
      if (source) {
        try {
          derived_n += compare_batch(plan, kp, *source, what + " (derived)") ? 1 : 0;
        } catch (const Error& err) {
          MESSAGE("fixture batch raised: " << err.what());  // bounds_check=error
        }
      }
      // Captured contexts and local_embs, as `replay --ctx captured` feeds them; fields not
      // captured are filled from the derived context.
      bool all = true;
      for (const RankBatch& rb : batch.ranks) all = all && rb.ctx && rb.local_embs;
      if (!all) continue;
      DerivedBatch derived;
      try {
        derived = derive_input_dist(plan, kp);
      } catch (const Error&) {
        continue;
      }
      std::vector<ShardingContext> ctx;
      for (size_t r = 0; r < batch.ranks.size(); ++r) {
        ShardingContext c = *batch.ranks[r].ctx;
        const ShardingContext& d = derived.ranks[r].ctx;
        if (!c.input_splits) c.input_splits = d.input_splits;
        if (!c.output_splits) c.output_splits = d.output_splits;
        if (!c.batch_size_per_rank) c.batch_size_per_rank = d.batch_size_per_rank;
        if (!c.batch_size_per_rank_per_feature)
          c.batch_size_per_rank_per_feature = d.batch_size_per_rank_per_feature;
        if (!c.sparse_features_recat) c.sparse_features_recat = d.sparse_features_recat;
        if (!c.unbucketize_permute) c.unbucketize_permute = d.unbucketize_permute;
        if (!c.lengths_after_input_dist) {
          c.lengths_after_input_dist = d.lengths_after_input_dist;
          c.lengths_after_input_dist_cols = d.lengths_after_input_dist_cols;
        }
        ctx.push_back(std::move(c));
      }
      std::vector<TensorRef> lp;
      std::vector<const ShardingContext*> cp;
      for (size_t r = 0; r < batch.ranks.size(); ++r) {
        lp.emplace_back(*batch.ranks[r].local_embs);
        cp.push_back(&ctx[r]);
      }
      const bool vb = cp.empty() ? false : cp[0]->variable_batch_per_feature.value_or(false);
      captured_n += compare_dist(plan, vb, lp, cp, what + " (captured)") ? 1 : 0;
    }
  }
  MESSAGE("fixture batches compared: derived " << derived_n << ", captured " << captured_n);
  CHECK(derived_n + captured_n > 0);
}

#endif  // DYNEMB_HAVE_NCCL
