// Every worked example of docs/semantics.md, with its exact numbers.
#include <doctest/doctest.h>

#include "common/hash.hpp"
#include "engine/mean_pooling.hpp"
#include "engine/ops.hpp"
#include "engine/reference.hpp"
#include "test_engine_util.hpp"

using namespace dynemb;
using namespace dynemb::test;
using V = std::vector<int64_t>;

namespace {

// §3.4: W=2, f0 (10 rows, blk 5), f1 (6 rows, blk 3); each its own table.
Plan example_plan(ModuleKind m, int64_t dim = 2) {
  return make_plan(2, m, {table("t0", 10, dim, {"f0"}), table("t1", 6, dim, {"f1"})});
}
std::vector<Kjt> example_kjts() {
  return {make_kjt(2, {2, 1, 0, 3}, {1, 7, 5, 4, 0, 2}), make_kjt(2, {1, 2, 1, 0}, {9, 0, 3, 5})};
}
// §6.1: E_f(g) = [100 f + g, 100 f + g + 0.5] (table t = feature f here).
std::shared_ptr<DenseSource> example_source(const Plan& p) {
  return formula_source(p, [](int t, int64_t g, int64_t c) {
    return static_cast<float>(100 * t + g) + (c ? 0.5f : 0.0f);
  });
}
std::vector<float> col0(const EmbTensor& e) {
  std::vector<float> v;
  for (int64_t r = 0; r < e.rows(); ++r) v.push_back(e.data[r * e.cols()]);
  return v;
}

}  // namespace

TEST_CASE("§1 KJT docstring example") {
  Kjt k = make_kjt(2, {2, 0, 1, 1, 1, 3}, {0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(k.stride() == 3);
  CHECK(k.offsets() == V{0, 2, 2, 3, 4, 5, 8});
  CHECK(k.length_per_key() == V{3, 5});
  CHECK(k.bag_begin(1) == 3);
  Kjt vbe = make_kjt(2, {1, 1, 2, 0, 3}, {0, 1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(vbe.is_vbe());
  CHECK(vbe.stride() == 3);
  CHECK(vbe.batch_size(0) == 2);
  CHECK(vbe.bag_begin(1) == 2);
  CHECK(vbe.length_per_key() == V{2, 5});
}

TEST_CASE("§2.2 even RW shard rows") {
  CHECK(rw_even_shard_rows(10, 4) == V{3, 3, 3, 1});
  CHECK(rw_even_shard_rows(5, 4) == V{2, 2, 1, 0});
  CHECK(rw_even_shard_rows(12, 4) == V{3, 3, 3, 3});
}

TEST_CASE("§3.2 continuous routing, N=10 W=4 blk=3") {
  auto r = [](int64_t id, IndexType t = IndexType::i64) {
    const Route x = route_id(DistType::continuous, id, t, 3, 4);
    return std::make_pair(x.dest, x.local);
  };
  CHECK(r(4) == std::make_pair<int64_t, int64_t>(1, 1));
  CHECK(r(10) == std::make_pair<int64_t, int64_t>(3, 1));
  CHECK(r(11) == std::make_pair<int64_t, int64_t>(3, 2));
  CHECK(r(12) == std::make_pair<int64_t, int64_t>(0, 3));
  CHECK(r(13) == std::make_pair<int64_t, int64_t>(1, 3));
  CHECK(r(-1) == std::make_pair<int64_t, int64_t>(3, 4611686018427387903LL));
  CHECK(r(-2) == std::make_pair<int64_t, int64_t>(2, 4611686018427387903LL));
  // int32 ids route by the uint32 value: 4294967295 % 4 = 3, local 1073741823.
  CHECK(r(-1, IndexType::i32) == std::make_pair<int64_t, int64_t>(3, 1073741823));
  CHECK(r(-2, IndexType::i32) == std::make_pair<int64_t, int64_t>(2, 1073741823));
  // Lookup side: local 1 on rank 3 is past its single row (§2.2: [3,3,3,1]).
  Plan p = make_plan(4, ModuleKind::sequence, {table("t", 10, 1, {"f"})});
  CHECK(lookup_row(p, 0, 3, 0).g == 9);
  CHECK_FALSE(lookup_row(p, 0, 3, 0).oob);
  CHECK(lookup_row(p, 0, 3, 1).oob);
  CHECK(lookup_row(p, 0, 0, 3).oob);
}

TEST_CASE("§3.4 bucketize, both ranks") {
  Plan p = example_plan(ModuleKind::sequence);
  auto be = make_cpu_backend(2);
  std::vector<Kjt> k = example_kjts();
  BucketizedKjt b0 = be->bucketize(p, k[0]);
  CHECK(b0.new_lengths == V{1, 0, 0, 2, 1, 1, 0, 1});
  CHECK(b0.new_values == V{1, 0, 2, 2, 0, 1});
  CHECK(b0.unbucketize_permute == V{0, 3, 4, 5, 1, 2});
  CHECK(b0.dest_rank == V{0, 1, 1, 1, 0, 0});
  BucketizedKjt b1 = be->bucketize(p, k[1]);
  CHECK(b1.new_lengths == V{0, 2, 0, 0, 1, 0, 1, 0});
  CHECK(b1.new_values == V{0, 3, 4, 2});
  CHECK(b1.unbucketize_permute == V{2, 0, 1, 3});
  // Weights follow their ids.
  Kjt w = k[0];
  w.weighted = true;
  w.weights = {0.f, 1.f, 2.f, 3.f, 4.f, 5.f};
  CHECK(be->bucketize(p, w).new_weights == std::vector<float>{0.f, 4.f, 5.f, 1.f, 2.f, 3.f});
}

TEST_CASE("§3.6 block_bucketize_pos, sizes [4,2,4]") {
  const V pos{0, 4, 6, 10};
  auto r = [&](int64_t id) {
    const Route x = route_block_bucketize_pos(pos, id, IndexType::i64, 3);
    return std::make_pair(x.dest, x.local);
  };
  CHECK(r(3) == std::make_pair<int64_t, int64_t>(0, 3));
  CHECK(r(4) == std::make_pair<int64_t, int64_t>(1, 0));
  CHECK(r(7) == std::make_pair<int64_t, int64_t>(2, 1));
  CHECK(r(9) == std::make_pair<int64_t, int64_t>(2, 3));
  CHECK(r(12) == std::make_pair<int64_t, int64_t>(0, 4));
  CHECK(r(-1) == std::make_pair<int64_t, int64_t>(0, 6148914691236517205LL));
  // Through the op: one feature, B=1, ids 3,4,7,9 -> lengths per bucket [1,1,2].
  Kjt k = make_kjt(1, {4}, {3, 4, 7, 9});
  std::vector<V> bp{pos};
  BucketizedKjt b = block_bucketize_sparse_features(k, {4}, {DistType::continuous}, 3, &bp);
  CHECK(b.new_lengths == V{1, 1, 2});
  CHECK(b.new_values == V{3, 0, 1, 3});
}

namespace {

// An inference plan (W ranks): table t (sum of `rows` rows, D = 2) split as `rows` says, with
// feature f; the roundrobin table r beside it keeps its rule.
Plan inference_plan(const V& rows, ModuleKind m = ModuleKind::sequence,
                    BoundsCheck bc = BoundsCheck::ignore) {
  TableConfig t = table("t", 0, 2, {"f"});
  for (size_t r = 0; r < rows.size(); ++r) {
    ShardSpec s;
    s.rank = static_cast<int64_t>(r);
    s.row_offset = t.num_embeddings;
    s.rows = rows[r];
    t.shards.push_back(s);
    t.num_embeddings += rows[r];
  }
  Plan p;
  p.world_size = static_cast<int64_t>(rows.size());
  p.module = m;
  p.bounds_check = bc;
  p.input_dist = InputDist::inference;
  p.tables = {t, table("r", 5, 2, {"g"}, DistType::roundrobin)};
  p.finalize();
  return p;
}

// (dest, local) of every id of feature 0 through the engine's bucketize (CpuBackend), in id
// order: dest_rank, and the local id at the id's place (unbucketize_permute) in new_values.
std::vector<std::pair<int64_t, int64_t>> bucketized_routes(Backend& be, const Plan& p,
                                                           const Kjt& k) {
  const BucketizedKjt b = be.bucketize(p, k);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t i = 0; i < k.values.size(); ++i)
    out.emplace_back(b.dest_rank[i], b.new_values[size_t(b.unbucketize_permute[i])]);
  return out;
}

}  // namespace

TEST_CASE("§3.6 an inference plan's uneven shards [4,2,4] route by block_bucketize_pos") {
  using P = std::pair<int64_t, int64_t>;
  const Plan p = inference_plan({4, 2, 4});
  REQUIRE(p.features[0].bucketize_pos == V{0, 4, 6, 10});
  CHECK(p.features[1].bucketize_pos.empty());  // roundrobin: its own rule
  auto be = make_cpu_backend(1);
  // f: one bag of ids 3, 4, 7, 9, 12, -1; g (roundrobin): one bag of key 7.
  Kjt k = make_kjt(2, {6, 1}, {3, 4, 7, 9, 12, -1, 7});
  const BucketizedKjt b = be->bucketize(p, k);
  // Rank 0 gets 3 (its row 3), 12 (past the table: 12 % 3, local 12 / 3) and -1 (u64: 2^64 - 1,
  // past the table: rank 0, local (2^64 - 1) / 3); rank 1 gets 4 (its row 0); rank 2 gets 7
  // and 9 (its rows 1 and 3). g's key 7 goes to 7 % 3 = 1 unchanged.
  CHECK(b.dest_rank == V{0, 1, 2, 2, 0, 0, 1});
  CHECK(b.new_lengths == V{3, 0, 1, 1, 2, 0});  // [rank][bag]
  CHECK(b.new_values == V{3, 4, 6148914691236517205LL, 0, 7, 1, 3});
  CHECK(b.unbucketize_permute == V{0, 3, 5, 6, 1, 2, 4});
  CHECK(bucketized_routes(*be, p, k) ==
        std::vector<P>{{0, 3}, {1, 0}, {2, 1}, {2, 3}, {0, 4}, {0, 6148914691236517205LL}, {1, 7}});
  // int32 ids: -1 is 2^32 - 1 (rank (2^32 - 1) % 3 = 0, local 1431655765), -2 is 2^32 - 2
  // (rank 2, local 1431655764).
  Kjt k32 = make_kjt(2, {7, 0}, {3, 4, 7, 9, 12, -1, -2});
  k32.values_type = IndexType::i32;
  CHECK(bucketized_routes(*be, p, k32) ==
        std::vector<P>{{0, 3}, {1, 0}, {2, 1}, {2, 3}, {0, 4}, {0, 1431655765}, {2, 1431655764}});
  // The lookup: a rank's first row is its shard's offset, its rows the shard's size.
  CHECK(lookup_row(p, 0, 1, 0).g == 4);
  CHECK(lookup_row(p, 0, 2, 3).g == 9);
  CHECK_FALSE(lookup_row(p, 0, 2, 3).oob);
  CHECK(lookup_row(p, 0, 1, 2).oob);     // rank 1 holds 2 rows
  CHECK(lookup_row(p, 0, 1, 2).g == 4);  // its local row 0 under warn_zero_row / ignore
  CHECK(lookup_row(p, 0, 0, 4).oob);     // id 12: rank 0's local row 4 of 4
  CHECK(lookup_row(p, 0, 0, 4).g == 0);
  // The reference routes alike: ids 4, 7, 9 read rows 4, 7, 9 on ranks 1, 2, 2.
  auto src = formula_source(p, [](int t, int64_t g, int64_t c) {
    return static_cast<float>(100 * t + g) + (c ? 0.5f : 0.0f);
  });
  Kjt in = make_kjt(2, {3, 0}, {4, 7, 9});
  CHECK(col0(reference_output(p, 0, in, *src, 0)) == std::vector<float>{4, 7, 9});
  // The sharded sequence path: rank 2's lookup holds its local rows 1, 3 (ids 7, 9).
  std::vector<Kjt> kjts{in, make_kjt(2, {0, 0}, {}), make_kjt(2, {1, 0}, {5})};
  const DerivedBatch d = derive_input_dist(p, ptrs(kjts));
  CHECK(d.ranks[2].lookup_kjt.values == V{1, 3});
  CHECK(d.ranks[1].lookup_kjt.values == V{0, 1});  // id 4 of rank 0, id 5 of rank 2
  CHECK(d.ranks[0].ctx.input_splits == V{0, 1, 2});
  const std::vector<EmbTensor> out = run_sharded(p, kjts, *src, *be);
  CHECK(col0(out[0]) == std::vector<float>{4, 7, 9});
  CHECK(col0(out[2]) == std::vector<float>{5});
}

TEST_CASE("§3.6 empty shards repeat an offset and take no ids") {
  auto be = make_cpu_backend(1);
  using P = std::pair<int64_t, int64_t>;
  // [4,0,2,4]: pos [0,4,4,6,10]; id 4 skips empty rank 1 for rank 2; past the table, x % 4.
  const Plan p = inference_plan({4, 0, 2, 4});
  REQUIRE(p.features[0].bucketize_pos == V{0, 4, 4, 6, 10});
  Kjt k = make_kjt(2, {6, 0}, {3, 4, 5, 6, 10, 13});
  CHECK(bucketized_routes(*be, p, k) ==
        std::vector<P>{{0, 3}, {2, 0}, {2, 1}, {3, 0}, {2, 2}, {1, 3}});
  CHECK(lookup_row(p, 0, 1, 0).oob);  // rank 1 holds nothing: zeros
  CHECK_FALSE(lookup_row(p, 0, 1, 0).valid);
  CHECK(lookup_row(p, 0, 1, 0).g == 4);
  // [0,5,5]: pos [0,0,5,10]; id 0 goes to rank 1. [5,5,0]: pos [0,5,10,10]; id 9 is rank 1's
  // row 4; ids 10 and 11 are past the table: ranks 10 % 3 = 1 and 11 % 3 = 2, local 3 each.
  CHECK(bucketized_routes(*be, inference_plan({0, 5, 5}), make_kjt(2, {2, 0}, {0, 4})) ==
        std::vector<P>{{1, 0}, {1, 4}});
  const Plan last_empty = inference_plan({5, 5, 0});
  CHECK(bucketized_routes(*be, last_empty, make_kjt(2, {3, 0}, {9, 10, 11})) ==
        std::vector<P>{{1, 4}, {1, 3}, {2, 3}});
  CHECK(lookup_row(last_empty, 0, 1, 3).g == 8);  // id 10 reads row 8 (TorchRec does too)
  CHECK_FALSE(lookup_row(last_empty, 0, 2, 3).valid);
  // Even shards under inference route by the ceil rule, as before (no bucketize_pos).
  CHECK(inference_plan({4, 4, 2}).features[0].bucketize_pos.empty());
}

TEST_CASE("§4.3 recat and its expansions") {
  CHECK(get_recat(2, 2) == std::vector<int32_t>{0, 2, 1, 3});
  CHECK(get_recat(2, 4) == std::vector<int32_t>{0, 2, 4, 6, 1, 3, 5, 7});
  // F=2, W=2, B=[2,3]: input (s,f) sizes [2,2,3,3], output (f,s) sizes [2,3,2,3].
  const V expanded =
      expand_into_jagged_permute(to_i64(get_recat(2, 2)), {0, 2, 4, 7, 10}, {0, 2, 5, 7, 10}, 10);
  CHECK(expanded == V{0, 1, 4, 5, 6, 2, 3, 7, 8, 9});
  CHECK(invert_permute(expanded) == V{0, 1, 5, 6, 2, 3, 4, 7, 8, 9});
  CHECK_THROWS_AS(invert_permute({0, 0, 1}), Error);
  // permute_2D: rows of B=2; permute_1D: bags.
  SparseData p2 = permute_2D_sparse_data({1, 0}, {1, 0, 2, 1}, 2, 2, {7, 8, 9, 10}, {});
  CHECK(p2.lengths == V{2, 1, 1, 0});
  CHECK(p2.values == V{8, 9, 10, 7});
  SparseData p1 = permute_1D_sparse_data({2, 0}, {1, 0, 2}, {7, 8, 9}, {1.f, 2.f, 3.f});
  CHECK(p1.lengths == V{2, 1});
  CHECK(p1.values == V{8, 9, 7});
  CHECK(p1.weights == std::vector<float>{2.f, 3.f, 1.f});
  CHECK_THROWS_AS(permute_1D_sparse_data({3}, {1, 0, 2}, {7, 8, 9}, {}), Error);
}

TEST_CASE("§4.3 post-all-to-all KJT and §4.4 contexts") {
  Plan p = example_plan(ModuleKind::sequence);
  auto be = make_cpu_backend(2);
  std::vector<Kjt> k = example_kjts();
  DerivedBatch d = derive_input_dist(p, ptrs(k));
  const LookupKjt& l0 = d.ranks[0].lookup_kjt;
  CHECK(l0.lengths == V{1, 0, 0, 2, 0, 2, 0, 0});
  CHECK(l0.values == V{1, 0, 3, 0, 2});
  CHECK(l0.stride_per_key_per_rank == std::vector<V>{{2, 2}, {2, 2}});
  const LookupKjt& l1 = d.ranks[1].lookup_kjt;
  CHECK(l1.lengths == V{1, 1, 1, 0, 0, 1, 1, 0});
  CHECK(l1.values == V{2, 0, 4, 1, 2});
  const ShardingContext& c0 = d.ranks[0].ctx;
  CHECK(*c0.input_splits == V{3, 3});
  CHECK(*c0.output_splits == V{3, 2});
  CHECK(*c0.batch_size_per_rank == V{2, 2});
  CHECK(*c0.sparse_features_recat == std::vector<int32_t>{0, 2, 1, 3});
  CHECK(*c0.unbucketize_permute == V{0, 3, 4, 5, 1, 2});
  CHECK(*c0.lengths_after_input_dist == V{1, 0, 0, 2, 0, 2, 0, 0});
  CHECK(c0.lengths_after_input_dist_cols == 4);
  CHECK_FALSE(c0.batch_size_per_rank_per_feature.has_value());
  const ShardingContext& c1 = d.ranks[1].ctx;
  CHECK(*c1.input_splits == V{2, 2});
  CHECK(*c1.output_splits == V{3, 2});

  // Unequal batch per rank: B = [2, 3] gives the expanded recat in the context.
  std::vector<Kjt> u = {make_kjt(2, {1, 0, 0, 1}, {1, 2}),
                        make_kjt(2, {1, 1, 1, 0, 0, 1}, {6, 7, 8, 3})};
  DerivedBatch du = derive_input_dist(p, ptrs(u));
  CHECK(*du.ranks[0].ctx.sparse_features_recat ==
        std::vector<int32_t>{0, 1, 4, 5, 6, 2, 3, 7, 8, 9});
  CHECK(*du.ranks[0].ctx.batch_size_per_rank == V{2, 3});
  CHECK(du.ranks[0].ctx.lengths_after_input_dist_cols == 5);
  // (f, s, b) order, stride 5: rank 0 gets f0 id 1 (r0b0) and f1 id 2 (r0b1);
  // rank 1 gets f0 ids 6,7,8 (r1b0..2) and f1 id 3 (r1b2).
  CHECK(du.ranks[0].lookup_kjt.lengths == V{1, 0, 0, 0, 0, 0, 1, 0, 0, 0});
  CHECK(du.ranks[0].lookup_kjt.values == V{1, 2});
  CHECK(du.ranks[1].lookup_kjt.lengths == V{0, 0, 1, 1, 1, 0, 0, 0, 0, 1});
  CHECK(du.ranks[1].lookup_kjt.values == V{1, 2, 3, 0});

  // W = 1: the bucketized KJT unchanged, identity recat.
  Plan p1 =
      make_plan(1, ModuleKind::sequence, {table("t0", 10, 2, {"f0"}), table("t1", 6, 2, {"f1"})});
  DerivedBatch d1 = derive_input_dist(p1, {&k[0]});
  CHECK(d1.ranks[0].lookup_kjt.values == V{1, 7, 5, 4, 0, 2});
  CHECK(*d1.ranks[0].ctx.sparse_features_recat == std::vector<int32_t>{0, 1});
}

TEST_CASE("§6.1 sequence output dist") {
  Plan p = example_plan(ModuleKind::sequence);
  auto be = make_cpu_backend(2);
  std::vector<Kjt> k = example_kjts();
  auto src = example_source(p);
  DerivedBatch d = derive_input_dist(p, ptrs(k));
  std::vector<EmbTensor> local = derive_local_embs(p, d, *src, *be, 0);
  CHECK(local[0].shape == V{5, 2});
  CHECK(local[0].data == std::vector<float>{1, 1.5, 0, 0.5, 3, 3.5, 100, 100.5, 102, 102.5});
  CHECK(local[1].data == std::vector<float>{7, 7.5, 5, 5.5, 9, 9.5, 104, 104.5, 105, 105.5});
  std::vector<EmbTensor> out = run_sharded(p, k, *src, *be);
  CHECK(out[0].shape == V{6, 2});
  CHECK(col0(out[0]) == std::vector<float>{1, 7, 5, 104, 100, 102});
  CHECK(out[0].data[1] == 1.5f);
  CHECK(col0(out[1]) == std::vector<float>{9, 0, 3, 105});
  for (int r = 0; r < 2; ++r) CHECK(out[r].data == reference_output(p, r, k[r], *src, 0).data);
}

TEST_CASE("§7.1 pooled output dist") {
  Plan p = example_plan(ModuleKind::pooled);
  auto be = make_cpu_backend(2);
  std::vector<Kjt> k = example_kjts();
  auto src = example_source(p);
  DerivedBatch d = derive_input_dist(p, ptrs(k));
  CHECK_FALSE(d.variable_batch);
  CHECK(*d.ranks[0].ctx.variable_batch_per_feature == false);
  CHECK(*d.ranks[0].ctx.batch_size_per_feature_pre_a2a == V{2, 2});
  std::vector<EmbTensor> local = derive_local_embs(p, d, *src, *be, 0);
  CHECK(local[0].shape == V{4, 4});
  CHECK(local[0].data == std::vector<float>{1, 1.5, 0, 0, 0, 0, 202, 203, 0, 0, 0, 0, 3, 4, 0, 0});
  CHECK(local[1].data ==
        std::vector<float>{7, 7.5, 0, 0, 5, 5.5, 104, 104.5, 9, 9.5, 105, 105.5, 0, 0, 0, 0});
  std::vector<EmbTensor> out = run_sharded(p, k, *src, *be);
  CHECK(out[0].shape == V{2, 4});
  CHECK(out[0].data == std::vector<float>{8, 9, 0, 0, 5, 5.5, 306, 307.5});
  CHECK(out[1].data == std::vector<float>{9, 9.5, 105, 105.5, 3, 4, 0, 0});

  SUBCASE("MEAN: the dist carries sums; the module divides by length + 1e-6, SUM by 1 + 1e-6") {
    Plan pm = make_plan(2, ModuleKind::pooled,
                        {table("t0", 10, 2, {"f0"}),
                         table("t1", 6, 2, {"f1"}, DistType::continuous, PoolingMode::mean)});
    auto srcm = example_source(pm);
    std::vector<EmbTensor> om = run_sharded(pm, k, *srcm, *be);
    // The dist's result is the SUM result, bit for bit (TorchRec divides after the dist).
    CHECK(om[0].dtype == DType::f32);
    CHECK(om[0].data == out[0].data);
    CHECK(om[1].data == out[1].data);
    for (int r = 0; r < 2; ++r) CHECK(om[r].data == reference_output(pm, r, k[r], *srcm, 0).data);
    // The module's callback: every column divided, SUM columns by float32(1 + 1e-6).
    const float one = 1.0f + 1e-6f;
    CHECK(one == 1.00000095367431640625f);
    const EmbTensor m0 = module_output(pm, k[0], om[0], nullptr);
    CHECK(m0.shape == V{2, 4});
    // rank0 sample1: f1 = {4,0,2} -> 306 / (3 + 1e-6); sample0 f1 empty -> 0 / 1e-6 = 0.
    CHECK(m0.data == std::vector<float>{8 / one, 9 / one, 0.0f / 1e-6f, 0.0f / 1e-6f, 5 / one,
                                        5.5f / one, 306 / (3 + 1e-6f), 307.5f / (3 + 1e-6f)});
    CHECK(m0.data[2] == 0.0f);
    CHECK(mean_divided(pm, k[0], om[0]).data == m0.data);
    // Without a MEAN table there is no callback: the module output is the dist's output.
    CHECK(module_output(p, k[0], out[0], nullptr).data == out[0].data);
  }
  SUBCASE("weighted: sum of w * E") {
    std::vector<Kjt> kw = k;
    kw[0].weighted = kw[1].weighted = true;
    kw[0].weights = {0.5f, 2.f, 1.f, 0.25f, 1.f, 1.f};
    kw[1].weights = {1.f, 1.f, 1.f, 1.f};
    std::vector<EmbTensor> ow = run_sharded(p, kw, *src, *be);
    // sample0 f0 = 0.5*E(1) + 2*E(7) = [14.5, 15.75]; sample1 f1 = .25*E(4)+E(0)+E(2)
    CHECK(ow[0].data == std::vector<float>{14.5f, 15.75f, 0, 0, 5, 5.5f, 228, 229.125f});
  }
}

TEST_CASE("§7.2 pooled VBE (dims 2 and 3)") {
  Plan p =
      make_plan(2, ModuleKind::pooled, {table("t0", 10, 2, {"f0"}), table("t1", 6, 3, {"f1"})});
  auto src = formula_source(p, [](int t, int64_t g, int64_t c) {
    return t == 0 ? static_cast<float>(10 * c + g) : static_cast<float>(100 * (c + 1) + g);
  });
  std::vector<Kjt> k = {make_kjt(2, {1, 1, 1}, {1, 6, 4}, {2, 1}),
                        make_kjt(2, {1, 0, 1, 2}, {0, 8, 2, 3}, {3, 1})};
  auto be = make_cpu_backend(2);
  BucketizedKjt b0 = be->bucketize(p, k[0]), b1 = be->bucketize(p, k[1]);
  CHECK(b0.new_lengths == V{1, 0, 0, 0, 1, 1});
  CHECK(b0.new_values == V{1, 1, 1});
  CHECK(b1.new_lengths == V{1, 0, 0, 1, 0, 0, 1, 1});
  CHECK(b1.new_values == V{0, 2, 3, 0});
  DerivedBatch d = derive_input_dist(p, ptrs(k));
  CHECK(d.variable_batch);
  CHECK(d.ranks[0].lookup_kjt.stride_per_key_per_rank == std::vector<V>{{2, 3}, {1, 1}});
  const auto& bsprpf = *d.ranks[0].ctx.batch_size_per_rank_per_feature;
  CHECK(bsprpf == std::vector<V>{{2, 1}, {3, 1}});
  CHECK_FALSE(d.ranks[0].ctx.batch_size_per_rank.has_value());
  CHECK(*d.ranks[0].ctx.variable_batch_per_feature == true);
  CHECK(*d.ranks[1].ctx.batch_size_per_feature_pre_a2a == V{3, 1});
  CHECK(vbe_reduce_scatter_input_splits(p, bsprpf) == V{7, 9});
  std::vector<EmbTensor> local = derive_local_embs(p, d, *src, *be, 0);
  CHECK(local[0].data ==
        std::vector<float>{1, 11, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 102, 202, 302});
  CHECK(local[1].data ==
        std::vector<float>{0, 0, 6, 16, 104, 204, 304, 0, 0, 0, 0, 8, 18, 103, 203, 303});
  std::vector<EmbTensor> out = run_sharded(p, k, *src, *be);
  CHECK(out[0].shape == V{7});
  CHECK(out[0].data == std::vector<float>{1, 11, 6, 16, 104, 204, 304});
  CHECK(out[1].data == std::vector<float>{0, 10, 0, 0, 8, 18, 205, 405, 605});
  for (int r = 0; r < 2; ++r) CHECK(out[r].data == reference_output(p, r, k[r], *src, 0).data);

  // The module expands rank 1 by its inverse indices (f0: [0,1,2,2], f1: [0,0,0,0], B_full 4).
  const V inv = {0, 1, 2, 2, 0, 0, 0, 0};
  const EmbTensor m1 = module_output(p, k[1], out[1], &inv);
  CHECK(m1.shape == V{4, 5});
  CHECK(m1.data == std::vector<float>{0, 10, 205, 405, 605, 0, 0,  205, 405, 605,
                                      8, 18, 205, 405, 605, 8, 18, 205, 405, 605});
  CHECK_THROWS_AS(module_output(p, k[1], out[1], nullptr), Error);
  // MEAN f1: rank 1's bag {2,3} has 2 ids; the divisor is taken after the expansion, so every
  // full sample of f1 is (205, 405, 605) / (2 + 1e-6); f0 (SUM) is divided by 1 + 1e-6.
  Plan pm = make_plan(2, ModuleKind::pooled,
                      {table("t0", 10, 2, {"f0"}),
                       table("t1", 6, 3, {"f1"}, DistType::continuous, PoolingMode::mean)});
  const EmbTensor mm = module_output(pm, k[1], out[1], &inv);
  const float one = 1.0f + 1e-6f, two = 2.0f + 1e-6f;
  CHECK(mm.data == std::vector<float>{0 / one, 10 / one, 205 / two, 405 / two, 605 / two,
                                      0 / one, 0 / one,  205 / two, 405 / two, 605 / two,
                                      8 / one, 18 / one, 205 / two, 405 / two, 605 / two,
                                      8 / one, 18 / one, 205 / two, 405 / two, 605 / two});

  // A lookup that kept MEAN under RW: rank 1's local sub-bag of f1 from source 1 holds {3}
  // (1 id) and from source 0 holds {4} (1 id); rank 0's f1 bag from source 1 holds {2}.
  // Every MEAN sub-bag with one id keeps its sum; f0 is SUM and unchanged.
  const EmbTensor pm0 = per_rank_means(pm, d.ranks[0].lookup_kjt, local[0]);
  CHECK(pm0.data == local[0].data);
}

TEST_CASE("per-rank means: MEAN sub-bags scaled by 1/local length, empty ones 0") {
  Plan pm = make_plan(2, ModuleKind::pooled,
                      {table("t0", 10, 2, {"f0"}),
                       table("t1", 6, 2, {"f1"}, DistType::continuous, PoolingMode::mean)});
  auto src = example_source(pm);
  std::vector<Kjt> k = example_kjts();
  auto be = make_cpu_backend(2);
  DerivedBatch d = derive_input_dist(pm, ptrs(k));
  std::vector<EmbTensor> local = derive_local_embs(pm, d, *src, *be, 0);
  // rank0 local rows (s,b): (0,1) f1 = [202, 203] is the sum of 2 ids (ids 0 and 2 of f1).
  CHECK(local[0].data == std::vector<float>{1, 1.5, 0, 0, 0, 0, 202, 203, 0, 0, 0, 0, 3, 4, 0, 0});
  const EmbTensor m = per_rank_means(pm, d.ranks[0].lookup_kjt, local[0]);
  CHECK(m.data == std::vector<float>{1, 1.5, 0, 0, 0, 0, 101, 101.5, 0, 0, 0, 0, 3, 4, 0, 0});
}

TEST_CASE("§10.2 fmix64 table and roundrobin routing") {
  const int64_t keys[] = {0, 1, 2, 3, 7, 12345, -1};
  const int64_t want[][3] = {{0, 0, 0}, {0, 2, 0}, {1, 0, 3}, {0, 2, 2},
                             {1, 1, 1}, {1, 0, 1}, {1, 1, 1}};
  CHECK(fmix64(0) == 0);
  for (int i = 0; i < 7; ++i)
    for (int w = 2; w <= 4; ++w) {
      CAPTURE(keys[i]);
      CAPTURE(w);
      CHECK(static_cast<int64_t>(fmix64(static_cast<uint64_t>(keys[i])) % w) == want[i][w - 2]);
      const Route r = route_id(DistType::hash_roundrobin, keys[i], IndexType::i64, 5, w);
      CHECK(r.dest == want[i][w - 2]);
      CHECK(r.local == keys[i]);  // raw key, unchanged
    }
  const Route rr = route_id(DistType::roundrobin, -1, IndexType::i64, 5, 3);
  CHECK(rr.dest == 0);
  CHECK(rr.local == -1);
  CHECK(route_id(DistType::roundrobin, 7, IndexType::i64, 5, 3).dest == 1);
  // int32: u32(-1) = 4294967295 = 0 mod 3 as well, and mod 2 = 1.
  CHECK(route_id(DistType::roundrobin, -1, IndexType::i32, 5, 2).dest == 1);
  // The oracle row of a roundrobin key is the raw key, whatever rank it lands on.
  Plan p = make_plan(3, ModuleKind::sequence, {table("t", 4, 2, {"f"}, DistType::roundrobin)});
  CHECK(lookup_row(p, 0, 0, 12345).g == 12345u);
  CHECK_FALSE(lookup_row(p, 0, 0, 12345).oob);
}
