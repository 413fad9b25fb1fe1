// Output dist modules: the pooled latch, broken contexts reported as OutputDistFailure,
// codecs, and the three bounds_check policies.
#include <doctest/doctest.h>

#include <string>

#include "engine/ops.hpp"
#include "engine/reference.hpp"
#include "test_engine_util.hpp"

using namespace dynemb;
using namespace dynemb::test;
using V = std::vector<int64_t>;

namespace {

Plan example_plan(ModuleKind m, BoundsCheck bc = BoundsCheck::error, DType comm = DType::f32) {
  return make_plan(2, m, {table("t0", 10, 2, {"f0"}), table("t1", 6, 2, {"f1"})}, comm, bc);
}
std::vector<Kjt> example_kjts() {
  return {make_kjt(2, {2, 1, 0, 3}, {1, 7, 5, 4, 0, 2}), make_kjt(2, {1, 2, 1, 0}, {9, 0, 3, 5})};
}
std::shared_ptr<DenseSource> example_source(const Plan& p) {
  return formula_source(p, [](int t, int64_t g, int64_t c) {
    return static_cast<float>(100 * t + g) + (c ? 0.5f : 0.0f);
  });
}

// Runs the output dist of `p` on a derived batch whose contexts `mutate` may break.
template <class Mutate>
void run_with_ctx(const Plan& p, const std::vector<Kjt>& k, Mutate mutate) {
  auto be = make_cpu_backend(2);
  auto src = example_source(p);
  DerivedBatch d = derive_input_dist(p, ptrs(k));
  std::vector<EmbTensor> local = derive_local_embs(p, d, *src, *be, 0);
  std::vector<TensorRef> lp;
  std::vector<const ShardingContext*> cp;
  for (size_t r = 0; r < local.size(); ++r) {
    mutate(static_cast<int>(r), d.ranks[r].ctx);
    lp.emplace_back(local[r]);
    cp.push_back(&d.ranks[r].ctx);
  }
  OutputSink sink = [](int, Tensor&&) {};
  if (p.module == ModuleKind::sequence)
    RwSequenceEmbeddingDist(p).forward(*be, lp, cp, Place::host, sink);
  else
    RwPooledEmbeddingDist(p).forward(*be, 0, lp, cp, Place::host, sink);
}

template <class Mutate>
std::pair<int, std::string> failure_of(const Plan& p, Mutate mutate) {
  try {
    run_with_ctx(p, example_kjts(), mutate);
  } catch (const OutputDistFailure& e) {
    return {e.rank(), e.field()};
  }
  return {-1, ""};
}

}  // namespace

TEST_CASE("RwPooledEmbeddingDist latches the variable-batch mode of its first batch") {
  Plan p =
      make_plan(2, ModuleKind::pooled, {table("t0", 10, 2, {"f0"}), table("t1", 6, 3, {"f1"})});
  OracleSource src(7, p);
  auto be = make_cpu_backend(2);
  RwPooledEmbeddingDist dist(p);
  CHECK_FALSE(dist.latched_variable_batch().has_value());
  std::vector<Kjt> normal = {make_kjt(2, {1, 0, 1, 1}, {1, 2, 3}),
                             make_kjt(2, {1, 1, 1, 1}, {9, 4, 5, 0})};
  std::vector<Kjt> vbe = {make_kjt(2, {1, 1, 1}, {1, 6, 4}, {2, 1}),
                          make_kjt(2, {1, 0, 1, 2}, {0, 8, 2, 3}, {3, 1})};
  std::vector<EmbTensor> out0 = run_sharded(p, normal, src, *be, 0, &dist);
  CHECK(out0[0].data == reference_output(p, 0, normal[0], src, 0).data);
  CHECK(dist.latched_variable_batch() == std::optional<bool>(false));
  bool caught = false;
  try {
    run_sharded(p, vbe, src, *be, 1, &dist);
  } catch (const OutputDistFailure& e) {
    caught = true;
    CHECK(e.field() == "variable_batch_per_feature");
    CHECK(e.rank() == 0);
    CHECK(std::string(e.what()).find("batch 1") != std::string::npos);
  }
  CHECK(caught);
  // The latch holds: the next normal batch still runs.
  CHECK(run_sharded(p, normal, src, *be, 2, &dist)[1].data ==
        reference_output(p, 1, normal[1], src, 2).data);
  // The other way round: latched on a VBE batch, a normal one is the mismatch.
  RwPooledEmbeddingDist dist2(p);
  run_sharded(p, vbe, src, *be, 0, &dist2);
  CHECK(dist2.latched_variable_batch() == std::optional<bool>(true));
  CHECK_THROWS_AS(run_sharded(p, normal, src, *be, 1, &dist2), OutputDistFailure);
}

TEST_CASE("broken sequence contexts are OutputDistFailure naming rank and field") {
  Plan p = example_plan(ModuleKind::sequence);
  CHECK(failure_of(p, [](int, ShardingContext&) {}) == std::make_pair(-1, std::string()));
  CHECK(failure_of(p, [](int r, ShardingContext& c) {
          if (r == 1) (*c.output_splits)[0] += 1;
        }) == std::make_pair(1, std::string("output_splits")));
  CHECK(failure_of(p, [](int r, ShardingContext& c) {
          if (r == 0) *c.input_splits = V{4, 2};
        }) == std::make_pair(0, std::string("input_splits")));
  CHECK(failure_of(p, [](int r, ShardingContext& c) {
          if (r == 1) (*c.unbucketize_permute)[2] = 99;
        }) == std::make_pair(1, std::string("unbucketize_permute")));
  CHECK(failure_of(p, [](int r, ShardingContext& c) {
          if (r == 0) *c.sparse_features_recat = {0, 0, 1, 3};
        }) == std::make_pair(0, std::string("sparse_features_recat")));
  CHECK(failure_of(p, [](int r, ShardingContext& c) {
          if (r == 0) (*c.lengths_after_input_dist)[0] = 5;
        }) == std::make_pair(0, std::string("lengths_after_input_dist")));
  CHECK(failure_of(p, [](int r, ShardingContext& c) {
          if (r == 1) c.unbucketize_permute.reset();
        }) == std::make_pair(1, std::string("unbucketize_permute")));
}

TEST_CASE("broken pooled contexts are OutputDistFailure naming rank and field") {
  Plan p = example_plan(ModuleKind::pooled);
  CHECK(failure_of(p, [](int, ShardingContext&) {}) == std::make_pair(-1, std::string()));
  CHECK(failure_of(p, [](int r, ShardingContext& c) {
          if (r == 1) *c.batch_size_per_rank = V{3, 1};
        }) == std::make_pair(1, std::string("batch_size_per_rank")));
  CHECK(failure_of(p, [](int r, ShardingContext& c) {
          if (r == 0) *c.batch_size_per_rank = V{2, 3};
        }) == std::make_pair(0, std::string("batch_size_per_rank")));
  // Ranks that disagree on the module to build.
  CHECK(failure_of(p, [](int r, ShardingContext& c) {
          if (r == 1) c.variable_batch_per_feature = true;
        }) == std::make_pair(1, std::string("variable_batch_per_feature")));
}

TEST_CASE("sequence codec: every element rounded once (clamp, RNE)") {
  Plan p = example_plan(ModuleKind::sequence, BoundsCheck::error, DType::f16);
  auto src = formula_source(p, [](int t, int64_t g, int64_t c) {
    // 1 + 2^-11 is a tie in fp16 (rounds to even 1); 70000 clamps to 65504.
    if (t == 0 && g == 1) return c ? 70000.0f : 1.0f + 0x1p-11f;
    return static_cast<float>(g) + 0x1p-12f * static_cast<float>(c);
  });
  auto be = make_cpu_backend(2);
  std::vector<EmbTensor> out = run_sharded(p, example_kjts(), *src, *be);
  CHECK(out[0].dtype == DType::f32);
  CHECK(out[0].data[0] == 1.0f);      // rank0 id 1 of f0, column 0: tie to even
  CHECK(out[0].data[1] == 65504.0f);  // clamped
  CHECK(out[0].data[3] == 7.0f);      // 7 + 2^-12 rounds to 7 in fp16
  Plan pb = example_plan(ModuleKind::sequence, BoundsCheck::error, DType::bf16);
  auto srcb = formula_source(pb, [](int, int64_t g, int64_t c) {
    return static_cast<float>(g) + 0x1p-9f * static_cast<float>(c);
  });
  std::vector<EmbTensor> ob = run_sharded(pb, example_kjts(), *srcb, *be);
  CHECK(ob[0].data[1] == 1.0f);  // 1 + 2^-9: below half an ulp (2^-8) of bf16 at 1
}

TEST_CASE("pooled codec: encode, sum in the low precision in rank order 0..W-1, decode") {
  // One table, D=1, W=3; every rank looks up row g for sample 0 of rank 0 only.
  Plan p = make_plan(3, ModuleKind::pooled, {table("t", 3, 1, {"f"})}, DType::f16);
  // Rows: 2048, 1, 1 (one per rank). fp16 ulp at 2048 is 2: 2048+1 = 2049 is a tie -> 2048,
  // and again -> 2048. Summing in another order (1+1 first) would give 2050.
  auto src = formula_source(p, [](int, int64_t g, int64_t) { return g == 0 ? 2048.0f : 1.0f; });
  std::vector<Kjt> k = {make_kjt(1, {3}, {0, 1, 2}), make_kjt(1, {0}, {}), make_kjt(1, {0}, {})};
  auto be = make_cpu_backend(2);
  std::vector<EmbTensor> out = run_sharded(p, k, *src, *be);
  CHECK(out[0].data == std::vector<float>{2048.0f});
  Plan p32 = make_plan(3, ModuleKind::pooled, {table("t", 3, 1, {"f"})});
  CHECK(run_sharded(p32, k, *src, *be)[0].data == std::vector<float>{2050.0f});
}

TEST_CASE("bounds_check policies") {
  // W=2, t0 10 rows (blk 5), t1 6 rows (blk 3). Out-of-table ids of f0 on rank 0:
  // 12 (past blk*W = 10) -> rank 12 % 2 = 0, local 12 / 2 = 6 (past rank 0's 5 rows);
  // -1 -> rank 1 local 2^63-1.
  std::vector<Kjt> k = {make_kjt(2, {2, 1, 0, 0}, {1, 12, -1}), make_kjt(2, {1, 0, 0, 1}, {3, 2})};
  SUBCASE("error: names the id, its feature, rank, sample and position in its bag") {
    Plan p = example_plan(ModuleKind::sequence, BoundsCheck::error);
    auto src = example_source(p);
    auto be = make_cpu_backend(2);
    DerivedBatch d = derive_input_dist(p, ptrs(k));
    try {
      derive_local_embs(p, d, *src, *be, 3);
      FAIL("no error");
    } catch (const LookupBoundsError& e) {
      CHECK(e.rank == 0);
      CHECK(e.feature == 0);
      CHECK(e.source_rank == 0);
      CHECK(e.sample == 0);
      CHECK(e.position == 1);
      CHECK(e.local_row == 6);
      CHECK(describe_lookup_bounds_error(p, ptrs(k), d, e) ==
            "id 12 of feature f0 (rank 0, sample 0, position 1 in its bag) is outside table t0 "
            "(num_embeddings 10; routed to rank 0). The "
            "plan says bounds_check: error; with bounds_check: warn_zero_row such ids are looked "
            "up as local row 0 of the rank they are routed to, as TorchRec's TBE does");
    }
    // -1 is routed by u64(-1) % W to rank 1 as local row 2^63 - 1: the message gives the id.
    std::vector<Kjt> neg = {make_kjt(2, {0, 2, 0, 0}, {3, -1}), make_kjt(2, {0, 0, 0, 0}, {})};
    DerivedBatch dn = derive_input_dist(p, ptrs(neg));
    try {
      derive_local_embs(p, dn, *src, *be, 3);
      FAIL("no error");
    } catch (const LookupBoundsError& e) {
      const std::string m = describe_lookup_bounds_error(p, ptrs(neg), dn, e);
      CHECK(m.rfind("id -1 of feature f0 (rank 0, sample 1, position 1 in its bag) is outside "
                    "table t0 (num_embeddings 10; routed to rank 1). ",
                    0) == 0);
      CHECK(m.find("9223372036854775807") == std::string::npos);
    }
    // 7 rows over W = 2 (blk 4): rank 1 holds rows 4..6, so id 7 is its local row 3.
    Plan ps = make_plan(2, ModuleKind::sequence, {table("t", 7, 2, {"f"})});
    auto srcs = example_source(ps);
    std::vector<Kjt> ks = {make_kjt(1, {2}, {5, 7}), make_kjt(1, {0}, {})};
    DerivedBatch ds = derive_input_dist(ps, ptrs(ks));
    try {
      derive_local_embs(ps, ds, *srcs, *be, 0);
      FAIL("no error");
    } catch (const LookupBoundsError& e) {
      CHECK(
          describe_lookup_bounds_error(ps, ptrs(ks), ds, e)
              .rfind(
                  "id 7 of feature f (rank 0, sample 0, position 1 in its bag) is outside table t "
                  "(num_embeddings 7; routed to rank 1 as local row 3, past its shard of 3 rows). ",
                  0) == 0);
    }
    try {
      reference_output(p, 0, k[0], *src, 3);
      FAIL("no error");
    } catch (const Error& e) {
      const std::string m = e.what();
      CHECK(m.find("id 12 at position 1") != std::string::npos);
      CHECK(m.find("feature f0") != std::string::npos);
    }
  }
  for (BoundsCheck bc : {BoundsCheck::warn_zero_row, BoundsCheck::ignore}) {
    CAPTURE(to_string(bc));
    Plan p = example_plan(ModuleKind::sequence, bc);
    auto src = example_source(p);
    auto be = make_cpu_backend(2);
    std::vector<EmbTensor> out = run_sharded(p, k, *src, *be);
    // id 12 -> row 0 of rank 0 (g=0); id -1 -> row 0 of rank 1 (g=5).
    CHECK(out[0].data == std::vector<float>{1, 1.5, 0, 0.5, 5, 5.5});
    CHECK(out[0].data == reference_output(p, 0, k[0], *src, 0).data);
    Plan pp = example_plan(ModuleKind::pooled, bc);
    auto srcp = example_source(pp);
    std::vector<EmbTensor> op = run_sharded(pp, k, *srcp, *be);
    // sample 0: f0 = E(1) + E(0); sample 1: f0 = E(5).
    CHECK(op[0].data == std::vector<float>{1, 2, 0, 0, 5, 5.5, 0, 0});
  }
  SUBCASE("an empty shard gives zeros") {
    // 5 rows over W=4: [2,2,1,0]; id 7 -> rank 3 (blk 2) which has no rows.
    Plan p = make_plan(4, ModuleKind::sequence, {table("t", 5, 1, {"f"})}, DType::f32,
                       BoundsCheck::ignore);
    auto src = formula_source(p, [](int, int64_t g, int64_t) { return 10.0f + g; });
    std::vector<Kjt> k4 = {make_kjt(1, {2}, {7, 4}), make_kjt(1, {0}, {}), make_kjt(1, {0}, {}),
                           make_kjt(1, {0}, {})};
    auto be = make_cpu_backend(2);
    std::vector<EmbTensor> out = run_sharded(p, k4, *src, *be);
    CHECK(out[0].data == std::vector<float>{0, 14});
    CHECK(out[0].data == reference_output(p, 0, k4[0], *src, 0).data);
  }
}

TEST_CASE("check_kjt names what and where") {
  Plan p = example_plan(ModuleKind::sequence);
  CHECK_NOTHROW(check_kjt(p, example_kjts()[0], "/batches/0/rank0"));
  auto msg = [&](const Kjt& k) {
    try {
      check_kjt(p, k, "/batches/3/rank1");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(msg(make_kjt(2, {2, 1, 0, 3}, {1, 7, 5})) ==
        "/batches/3/rank1/lengths: sum 6 != len(values) 3");
  CHECK(msg(make_kjt(2, {2, -1, 0, 3}, {1, 7, 5, 4})).find("negative") != std::string::npos);
  CHECK(msg(make_kjt(3, {1, 1, 1}, {1, 2, 3})).find("3 features") != std::string::npos);
  CHECK(msg(make_kjt(2, {1, 1, 1}, {1, 2, 3})).find("multiple of F") != std::string::npos);
  CHECK(msg(make_kjt(2, {1, 1, 1}, {1, 2, 3}, {1, 1})).find("stride_per_feature") !=
        std::string::npos);
  CHECK(msg(make_kjt(2, {1, 1}, {1, 2}, {}, {1.f})).find("weights") != std::string::npos);
}

// A pooled lookup or reference (not VBE) is made row by row, each row all features' bags, yet
// a bounds_check=error names the first bad id in bag order (feature-major), as before. Rank
// 0's KJT holds two bad ids: f0's 12 in sample 1 (rank 0, local 6 of 5 rows) and f1's 8 in
// sample 0 (past blk * W = 6: rank 0, local 4 of 3 rows). Row by row meets f1's first.
TEST_CASE("pooled bounds_check=error: the first bad id in bag order, made row by row") {
  Plan p = example_plan(ModuleKind::pooled, BoundsCheck::error);
  auto src = example_source(p);
  auto be = make_cpu_backend(2);
  std::vector<Kjt> k = {make_kjt(2, {1, 1, 1, 1}, {1, 12, 8, 0}), make_kjt(2, {0, 0, 0, 0}, {})};
  DerivedBatch d = derive_input_dist(p, ptrs(k));
  const auto check_lookup_error = [&](const auto& call) {
    try {
      call();
      FAIL("no error");
    } catch (const LookupBoundsError& e) {
      CHECK(e.feature == 0);
      CHECK(e.sample == 1);
      CHECK(e.local_row == 6);
    }
  };
  const LookupKjt& lk = d.ranks[0].lookup_kjt;
  check_lookup_error([&] { be->lookup(p, 0, lk, *src, Place::host); });
  const std::vector<float> zeros(16, 0.0f);  // [4 rows, sum_D 4]
  const TileCompare how{Tolerance::exact(), 4, 10};
  check_lookup_error([&] {
    be->comparator().compare_lookup(TensorRef::span(zeros.data(), 16), p, 0, lk, *src, how);
  });
  const std::string want =
      "batch 3: rank 0, feature f0: id 12 at position 1 is outside table t0 [0, 10) "
      "(bounds_check=error)";
  CHECK_THROWS_WITH(reference_output(p, 0, k[0], *src, 3), want.c_str());
  CHECK_THROWS_WITH(be->comparator().compare_reference(TensorRef::span(zeros.data(), 8), p, 0, k[0],
                                                       *src, 3, how),
                    want.c_str());
}
