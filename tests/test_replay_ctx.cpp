// Context diff and plan-free consistency checks on the worked example of docs/semantics.md
// §3.4 / §4.3 (W=2, F=2, B=2, sequence): each planted defect is a fail naming the field, the
// index and what the plan implies.
#include <doctest/doctest.h>

#include <algorithm>

#include "replay/ctx_check.hpp"

using namespace dynemb;

namespace {
Plan example_plan() {
  Plan p;
  p.world_size = 2;
  p.module = ModuleKind::sequence;
  TableConfig t0, t1;
  t0.name = "t0";
  t0.num_embeddings = 10;
  t0.embedding_dim = 2;
  t0.features = {"f0"};
  t1.name = "t1";
  t1.num_embeddings = 6;
  t1.embedding_dim = 2;
  t1.features = {"f1"};
  p.tables = {t0, t1};
  p.finalize();
  return p;
}

Kjt kjt_of(std::vector<int64_t> lengths, std::vector<int64_t> values) {
  Kjt k;
  k.num_features = 2;
  k.lengths = std::move(lengths);
  k.values = std::move(values);
  return k;
}

// The derived input dist of §3.4 / §4.3 / §4.4, written out by hand.
DerivedRank rank0_derived() {
  DerivedRank d;
  d.bucketized.dest_rank = {0, 1, 1, 1, 0, 0};
  d.bucketized.unbucketize_permute = {0, 3, 4, 5, 1, 2};
  d.ctx.input_splits = std::vector<int64_t>{3, 3};
  d.ctx.output_splits = std::vector<int64_t>{3, 2};
  d.ctx.batch_size_per_rank = std::vector<int64_t>{2, 2};
  d.ctx.sparse_features_recat = std::vector<int32_t>{0, 2, 1, 3};
  d.ctx.unbucketize_permute = std::vector<int64_t>{0, 3, 4, 5, 1, 2};
  d.ctx.lengths_after_input_dist = std::vector<int64_t>{1, 0, 0, 2, 0, 2, 0, 0};
  d.ctx.lengths_after_input_dist_cols = 4;
  d.ctx.variable_batch_per_feature = false;
  return d;
}
DerivedRank rank1_derived() {
  DerivedRank d;
  d.bucketized.dest_rank = {1, 0, 0, 1};
  d.ctx.input_splits = std::vector<int64_t>{2, 2};
  d.ctx.output_splits = std::vector<int64_t>{3, 2};
  d.ctx.batch_size_per_rank = std::vector<int64_t>{2, 2};
  d.ctx.sparse_features_recat = std::vector<int32_t>{0, 2, 1, 3};
  d.ctx.unbucketize_permute = std::vector<int64_t>{2, 0, 1, 3};
  d.ctx.lengths_after_input_dist = std::vector<int64_t>{1, 1, 1, 0, 0, 1, 1, 0};
  d.ctx.lengths_after_input_dist_cols = 4;
  d.ctx.variable_batch_per_feature = false;
  return d;
}

CheckResult find(const std::vector<CheckResult>& v, const std::string& check, int rank = -2) {
  auto it = std::find_if(v.begin(), v.end(), [&](const CheckResult& c) {
    return c.check == check && (rank == -2 || c.rank == rank);
  });
  REQUIRE_MESSAGE(it != v.end(), "no check " << check);
  return *it;
}

int failures(const std::vector<CheckResult>& v) {
  return int(std::count_if(v.begin(), v.end(),
                           [](const CheckResult& c) { return c.status == CheckStatus::fail; }));
}
}  // namespace

TEST_CASE("a captured context equal to the derived one passes every field") {
  const Plan p = example_plan();
  const DerivedRank d = rank0_derived();
  const auto r = diff_context(p, 3, 0, kjt_of({2, 1, 0, 3}, {1, 7, 5, 4, 0, 2}), d, d.ctx, 5);
  CHECK(r.size() == 7);  // every field present in the capture is one check
  CHECK(failures(r) == 0);
  CHECK(find(r, "unbucketize_permute").compared == 6);
}

TEST_CASE("each wrong context field is a fail naming index and the plan's value") {
  const Plan p = example_plan();
  const Kjt k0 = kjt_of({2, 1, 0, 3}, {1, 7, 5, 4, 0, 2});
  const DerivedRank d = rank0_derived();

  SUBCASE("input_splits") {
    ShardingContext c = d.ctx;
    (*c.input_splits)[1] = 4;
    const auto r = diff_context(p, 3, 0, k0, d, c, 5);
    CHECK(failures(r) == 1);
    const CheckResult& x = find(r, "input_splits");
    CHECK(x.status == CheckStatus::fail);
    CHECK(x.batch == 3);
    CHECK(x.rank == 0);
    CHECK(x.mismatches == 1);
    CHECK(x.message ==
          "1 of 2 elements differ; first at index 1: captured 4, derived 3 — plan routes 3 ids "
          "of rank 0 to rank 1");
  }
  SUBCASE("output_splits") {
    ShardingContext c = d.ctx;
    (*c.output_splits)[1] = 1;
    const CheckResult& x = find(diff_context(p, 0, 0, k0, d, c, 5), "output_splits");
    CHECK(x.details.at(0).note == "plan routes 2 ids of rank 1 to rank 0");
  }
  SUBCASE("unbucketize_permute, a wrong but bijective permutation") {
    ShardingContext c = d.ctx;
    std::swap((*c.unbucketize_permute)[1], (*c.unbucketize_permute)[4]);  // ids 7 and 0
    const CheckResult& x = find(diff_context(p, 0, 0, k0, d, c, 5), "unbucketize_permute");
    CHECK(x.mismatches == 2);
    REQUIRE(x.details.size() == 2);
    CHECK(to_string(x.details[0].where) == "index 1");
    CHECK(x.details[0].got == "1");
    CHECK(x.details[0].want == "3");
    CHECK(x.details[0].note ==
          "id 7 (feature f0, sample 0, position 1) is routed to rank 1, bucketized position 3");
    CHECK(x.details[1].note ==
          "id 0 (feature f1, sample 1, position 1) is routed to rank 0, bucketized position 1");
  }
  SUBCASE("lengths_after_input_dist, 2-D") {
    ShardingContext c = d.ctx;
    (*c.lengths_after_input_dist)[5] = 1;  // f1 column 1 = (source 0, sample 1)
    const CheckResult& x = find(diff_context(p, 0, 0, k0, d, c, 5), "lengths_after_input_dist");
    CHECK(to_string(x.details.at(0).where) == "index 5, row 1, col 1");
    CHECK(x.details[0].note ==
          "plan routes 2 ids of bag (feature f1, source rank 0, sample 1) to rank 0");
  }
  SUBCASE("sparse_features_recat") {
    ShardingContext c = d.ctx;
    *c.sparse_features_recat = {0, 1, 2, 3};
    const CheckResult& x = find(diff_context(p, 0, 0, k0, d, c, 5), "sparse_features_recat");
    CHECK(x.mismatches == 2);
    CHECK(x.details.at(0).note ==
          "segment (feature f0, source rank 1) takes input segment 2 = s*F+f");
  }
  SUBCASE("batch_size_per_rank") {
    ShardingContext c = d.ctx;
    *c.batch_size_per_rank = {2, 3};
    const CheckResult& x = find(diff_context(p, 0, 0, k0, d, c, 5), "batch_size_per_rank");
    CHECK(x.details.at(0).note == "rank 1's KJT has batch size 2");
  }
  SUBCASE("variable_batch_per_feature and VBE-only fields in a non-VBE batch") {
    ShardingContext c = d.ctx;
    c.variable_batch_per_feature = true;
    c.batch_size_per_rank_per_feature = std::vector<std::vector<int64_t>>{{2, 2}, {2, 2}};
    const auto r = diff_context(p, 0, 0, k0, d, c, 5);
    CHECK(failures(r) == 2);
    CHECK(find(r, "variable_batch_per_feature").message.find("captured 1, derived 0") !=
          std::string::npos);
    CHECK(find(r, "batch_size_per_rank_per_feature").status == CheckStatus::fail);
  }
  SUBCASE("a length that differs is reported, not thrown") {
    ShardingContext c = d.ctx;
    c.input_splits->push_back(0);
    const CheckResult& x = find(diff_context(p, 0, 0, k0, d, c, 5), "input_splits");
    CHECK(x.status == CheckStatus::fail);
    CHECK(x.message == "captured length 3, derived length 2");
  }
}

TEST_CASE("batch_size_per_rank_per_feature names source rank and feature") {
  const Plan p = example_plan();
  DerivedRank d = rank0_derived();
  d.ctx.batch_size_per_rank.reset();
  d.ctx.batch_size_per_rank_per_feature = std::vector<std::vector<int64_t>>{{2, 1}, {3, 1}};
  d.ctx.variable_batch_per_feature = true;
  ShardingContext c = d.ctx;
  (*c.batch_size_per_rank_per_feature)[1][0] = 2;
  const CheckResult& x =
      find(diff_context(p, 1, 0, kjt_of({2, 1, 0, 3}, {1, 7, 5, 4, 0, 2}), d, c, 5),
           "batch_size_per_rank_per_feature");
  CHECK(to_string(x.details.at(0).where) == "index 2, row 1, col 0");
  CHECK(x.details[0].note == "rank 1's KJT has 3 samples of feature f0");
}

TEST_CASE("plan-free checks: bijection, split symmetry, sums against local_embs") {
  const Plan p = example_plan();
  const Kjt k0 = kjt_of({2, 1, 0, 3}, {1, 7, 5, 4, 0, 2});
  const Kjt k1 = kjt_of({1, 2, 1, 0}, {9, 0, 3, 5});
  ShardingContext c0 = rank0_derived().ctx, c1 = rank1_derived().ctx;
  const EmbTensor le0 = EmbTensor::zeros(DType::f32, {5, 2});
  const EmbTensor le1 = EmbTensor::zeros(DType::f32, {5, 2});
  auto run = [&] {
    return consistency_checks(p, 2, {&k0, &k1}, {&c0, &c1}, {&le0, &le1}, {nullptr, nullptr}, 5);
  };
  {
    const auto r = run();
    CHECK(failures(r) == 0);
    CHECK(find(r, "unbucketize_permute.bijection", 1).message == "a permutation of [0, 4)");
    CHECK(find(r, "input_splits.symmetry", 0).compared == 2);
    CHECK(find(r, "lengths_after_input_dist.sum", 1).status == CheckStatus::pass);
  }
  SUBCASE("non-bijective unbucketize_permute") {
    (*c0.unbucketize_permute)[2] = 3;  // duplicate of index 1
    (*c1.unbucketize_permute)[0] = 4;  // out of range
    const auto r = run();
    const CheckResult& x = find(r, "unbucketize_permute.bijection", 0);
    CHECK(x.status == CheckStatus::fail);
    CHECK(x.message ==
          "not a bijection: 1 bad entries, first at index 2: value 3 duplicate of index 1");
    CHECK(find(r, "unbucketize_permute.bijection", 1).details.at(0).note == "out of range [0, 4)");
  }
  SUBCASE("input_splits of s to d != output_splits of d from s") {
    *c0.input_splits = {2, 4};
    const auto r = run();
    const CheckResult& x = find(r, "input_splits.symmetry", 0);
    CHECK(x.mismatches == 2);
    CHECK(x.details.at(1).note ==
          "rank 0 sends 4 ids to rank 1, which expects 3 (its output_splits[0])");
    CHECK(find(r, "input_splits.sum", 0).status == CheckStatus::pass);  // still 6 ids
  }
  SUBCASE("lengths_after_input_dist that does not sum to the rows of local_embs") {
    (*c1.lengths_after_input_dist)[0] = 2;
    const CheckResult& x = find(run(), "lengths_after_input_dist.sum", 1);
    CHECK(x.status == CheckStatus::fail);
    CHECK(x.message ==
          "sum(lengths_after_input_dist) 6 != local_embs rows 5 — local_embs of rank 1 has 5 "
          "rows");
  }
}

TEST_CASE("pooled: batch_size_per_rank against local_embs and golden rows") {
  Plan p = example_plan();
  p.module = ModuleKind::pooled;
  const Kjt k0 = kjt_of({2, 1, 0, 3}, {1, 7, 5, 4, 0, 2});
  const Kjt k1 = kjt_of({1, 2, 1, 0}, {9, 0, 3, 5});
  ShardingContext c0, c1;
  c0.batch_size_per_rank = std::vector<int64_t>{2, 2};
  c1.batch_size_per_rank = std::vector<int64_t>{2, 3};  // wrong: rank 1 has 2 samples
  const EmbTensor le = EmbTensor::zeros(DType::f32, {4, 4});
  const EmbTensor out = EmbTensor::zeros(DType::f32, {2, 4});
  const auto r = consistency_checks(p, 0, {&k0, &k1}, {&c0, &c1}, {&le, &le}, {&out, &out}, 5);
  CHECK(find(r, "batch_size_per_rank.sum", 0).status == CheckStatus::pass);
  CHECK(find(r, "batch_size_per_rank.sum", 1).status == CheckStatus::fail);
  const CheckResult& x = find(r, "batch_size_per_rank.output_rows", 1);
  CHECK(x.status == CheckStatus::fail);
  CHECK(x.message ==
        "at index 1: batch_size_per_rank[1] 3 != output rows 2 — the golden output of rank 1 "
        "has 2 rows");
}

TEST_CASE("latch check: a batch whose variable-batch mode differs from the latched one") {
  CHECK(latch_check(0, 1, false, false, 0).status == CheckStatus::pass);
  const CheckResult c = latch_check(4, 1, true, false, 0);
  CHECK(c.status == CheckStatus::fail);
  CHECK(c.name() == "batch4.rank1.ctx.variable_batch_per_feature.latch");
  CHECK(c.message ==
        "at index 0: flag 1, latched 0 — the output dist was built non-variable-batch at batch "
        "0 and stays so; this batch's context says variable batch");
}
