// Alternative plans (lib/load/alternatives.hpp), each function against values computed by hand:
// the dist_type and world-size alternatives, the row histogram's buckets, the balanced cut of a
// skewed histogram, PlanRouter, and the batch re-split (W = 2 -> 4, VBE, weighted). Every plan
// generated reads back through plan_to_yaml and parse_plan.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "load/alternatives.hpp"

using namespace dynemb;
using namespace dynemb::load;

namespace {

TableConfig table(const std::string& name, int64_t rows, std::vector<std::string> features,
                  DistType dist = DistType::continuous, std::vector<int64_t> shard_rows = {}) {
  TableConfig t;
  t.name = name;
  t.num_embeddings = rows;
  t.embedding_dim = 4;
  t.dist_type = dist;
  t.features = std::move(features);
  int64_t off = 0;
  for (size_t r = 0; r < shard_rows.size(); ++r) {
    ShardSpec s;
    s.rank = int64_t(r);
    s.row_offset = off;
    s.rows = shard_rows[r];
    off += s.rows;
    t.shards.push_back(s);
  }
  return t;
}

Plan plan_of(int64_t W, std::vector<TableConfig> tables) {
  Plan p;
  p.world_size = W;
  p.module = ModuleKind::sequence;
  p.tables = std::move(tables);
  p.finalize();
  return p;
}

std::vector<int64_t> rows_of(const TableConfig& t) {
  std::vector<int64_t> v;
  for (const ShardSpec& s : t.shards) v.push_back(s.rows);
  return v;
}

// The plan's YAML reads back with no error, to a plan that writes the same YAML (the writer
// writes every field, so equal YAML is an equal plan).
void check_round_trip(const Alternative& a) {
  INFO(a.name);
  const std::string yaml = plan_to_yaml(a.plan, a.origin);
  const PlanLoadResult r = parse_plan(yaml, a.name + ".yaml");
  for (const Diagnostic& d : r.findings) CHECK_MESSAGE(d.severity != Severity::error, d.str());
  REQUIRE(r.ok());
  CHECK(plan_to_yaml(*r.plan, a.origin) == yaml);
  CHECK(a.plan.source_text == plan_to_yaml(a.plan, ""));
}

// A KJT of one rank from its bags, feature by feature ({{bag, bag}, {bag}}); weights = the
// id + 0.5 when `weighted`.
Kjt kjt_of(const std::vector<std::vector<std::vector<int64_t>>>& bags, bool vbe,
           bool weighted = false) {
  Kjt k;
  k.num_features = int64_t(bags.size());
  k.weighted = weighted;
  for (const auto& feature : bags) {
    if (vbe) k.stride_per_feature.push_back(int64_t(feature.size()));
    for (const auto& bag : feature) {
      k.lengths.push_back(int64_t(bag.size()));
      for (int64_t id : bag) {
        k.values.push_back(id);
        if (weighted) k.weights.push_back(float(id) + 0.5f);
      }
    }
  }
  return k;
}

double imbalance_of(const std::vector<int64_t>& v) {
  int64_t sum = 0, mx = 0;
  for (int64_t x : v) sum += x, mx = std::max(mx, x);
  return sum == 0 ? 0 : double(mx) * double(v.size()) / double(sum);
}

// Ids per destination rank when `plan` routes the one-feature KJT `k`.
std::vector<int64_t> routed(const Plan& plan, const Kjt& k) {
  const PlanRouter router(plan);
  std::vector<int64_t> per(size_t(plan.world_size), 0);
  for (int64_t id : k.values) ++per[size_t(router.route(0, id, k.values_type).dest)];
  return per;
}

}  // namespace

TEST_CASE("generate_alternatives: each dist_type not used throughout, then each world size") {
  // t0: continuous with explicit shards by the ceil rule; t1: roundrobin with capacities.
  const Plan base = plan_of(2, {table("t0", 10, {"f0"}, DistType::continuous, {5, 5}),
                                table("t1", 6, {"f1"}, DistType::roundrobin, {4, 2})});
  AlternativeRequest req;
  req.dist_types = true;
  req.world_sizes = {4, 3, 4};
  const std::vector<Alternative> alts = generate_alternatives(base, req);
  REQUIRE(alts.size() == 5);
  CHECK(alts[0].name == "continuous");
  CHECK(alts[0].origin ==
        "every table under continuous (was mixed: 1 continuous, 1 roundrobin); explicit shards "
        "of 1 table dropped");
  CHECK(alts[0].plan.tables[0].dist_type == DistType::continuous);
  CHECK(alts[0].plan.tables[1].dist_type == DistType::continuous);
  CHECK(rows_of(alts[0].plan.tables[0]) == std::vector<int64_t>{5, 5});  // kept: valid there
  CHECK(alts[0].plan.tables[1].shards.empty());  // capacities, not the ceil rule's ranges
  CHECK(alts[1].name == "roundrobin");
  CHECK(alts[1].origin ==
        "every table under roundrobin (was mixed: 1 continuous, 1 roundrobin); explicit shards "
        "of 2 tables dropped");
  CHECK(alts[1].plan.tables[0].shards.empty());
  CHECK(alts[2].name == "hash_roundrobin");
  CHECK(alts[2].plan.features[1].dist_type == DistType::hash_roundrobin);
  CHECK(alts[3].name == "w4");
  CHECK(alts[3].origin ==
        "world_size 4 (was 2); explicit shards dropped: even rows by the ceil rule");
  CHECK(alts[3].plan.world_size == 4);
  CHECK(alts[3].plan.features[0].block_size == 3);  // ceil(10/4): rows 3,3,3,1
  CHECK(alts[3].plan.features[1].block_size == 2);
  CHECK(alts[3].plan.tables[1].dist_type == DistType::roundrobin);  // only W changes
  CHECK(alts[3].plan.tables[0].shards.empty());
  CHECK(alts[4].name == "w3");  // the second 4 is not repeated
  CHECK(alts[4].plan.features[0].block_size == 4);
  for (const Alternative& a : alts) check_round_trip(a);

  // A base all continuous, no shards: no "continuous" alternative; its own W once more.
  const Plan even = plan_of(2, {table("t0", 10, {"f0"})});
  req.world_sizes = {2};
  const std::vector<Alternative> e = generate_alternatives(even, req);
  REQUIRE(e.size() == 3);
  CHECK(e[0].name == "roundrobin");
  CHECK(e[0].origin == "every table under roundrobin (was continuous)");
  CHECK(e[1].name == "hash_roundrobin");
  CHECK(e[2].name == "w2");
  CHECK(e[2].origin == "world_size 2 (as the base)");
  for (const Alternative& a : e) check_round_trip(a);

  CHECK(generate_alternatives(even, AlternativeRequest{}).empty());
  AlternativeRequest bad;
  bad.world_sizes = {0};
  CHECK_THROWS_AS(generate_alternatives(even, bad), UsageError);
  bad.world_sizes = {-3};
  CHECK_THROWS_WITH_AS(generate_alternatives(even, bad),
                       "world size -3: a plan's world_size is 1..65536", UsageError);
  bad.world_sizes = {65537};
  CHECK_THROWS_AS(generate_alternatives(even, bad), UsageError);
  bad.world_sizes = {65536};
  CHECK(generate_alternatives(even, bad).at(0).plan.features[0].block_size == 1);
}

TEST_CASE("RowHistogram: equal row ranges per table, ids outside not counted") {
  const Plan p = plan_of(2, {table("t0", 10, {"f0"}), table("t1", 6, {"f1"}, DistType::roundrobin),
                             table("huge", int64_t(1) << 62, {"f2"})});
  RowHistogram h(p, 4);
  CHECK(h.width(0) == 3);  // ceil(10/4): rows [0,3) [3,6) [6,9) [9,10)
  CHECK(h.counts(0).size() == 4);
  CHECK(h.width(1) == 2);  // ceil(6/4): 3 buckets
  CHECK(h.counts(1).size() == 3);
  CHECK(h.width(2) == int64_t(1) << 60);
  CHECK(h.counts(2).size() == 4);
  h.add(
      kjt_of({{{0, 2}, {3, 9, 9}, {10, -1}}, {{5, 5}, {}, {6}}, {{(int64_t(1) << 62) - 1}, {}, {}}},
             false));
  h.add(kjt_of({{{8}}, {{0}}, {{int64_t(1) << 62}}}, false));
  CHECK(h.counts(0) == std::vector<int64_t>{2, 1, 1, 2});
  CHECK(h.outside(0) == 2);
  CHECK(h.counts(1) == std::vector<int64_t>{1, 0, 2});
  CHECK(h.outside(1) == 1);
  CHECK(h.counts(2) == std::vector<int64_t>{0, 0, 0, 1});
  CHECK(h.outside(2) == 1);
  // Bounded whatever the table: 4096 buckets by default.
  CHECK(RowHistogram(p).counts(2).size() == 4096);
  CHECK(RowHistogram(p).counts(0).size() == 10);
  CHECK_THROWS_AS(RowHistogram(p, 0), UsageError);
  CHECK_THROWS_AS(h.add(kjt_of({{{1}}}, false)), Error);  // one feature for a plan of three
}

TEST_CASE("balanced_rows_plan: a skewed histogram's cut, by hand") {
  // 20 rows, buckets of 2 rows, W = 4. Ids: row 0 x40, rows 2, 4, 6 x10, rows 8..18 (even) x5.
  // Bucket counts [40,10,10,10,5,5,5,5,5,5], total 100; prefix 0,40,50,60,70,75,80,...,100.
  // Edge 1: nearest 25 within [1,7] is 40 (edge 1); edge 2: 50 (edge 2); edge 3: 75 (edge 5).
  // Offsets 0,2,4,10,20: rows 2,2,6,10; ids per rank 40,10,25,25 (max/mean 1.6). The even
  // split (blk 5) gives 60,15,15,10 (max/mean 2.4).
  Kjt k;
  k.num_features = 1;
  auto put = [&](int64_t row, int n) {
    for (int i = 0; i < n; ++i) k.values.push_back(row);
  };
  put(0, 40);
  for (int64_t r : {2, 4, 6}) put(r, 10);
  for (int64_t r : {8, 10, 12, 14, 16, 18}) put(r, 5);
  k.lengths = {int64_t(k.values.size())};
  const Plan base =
      plan_of(4, {table("t", 20, {"f"}), table("rr", 8, {"g"}, DistType::roundrobin)});
  Kjt both = k;
  both.num_features = 2;
  both.lengths.push_back(0);
  RowHistogram h(base, 10);
  h.add(both);
  CHECK(h.counts(0) == std::vector<int64_t>{40, 10, 10, 10, 5, 5, 5, 5, 5, 5});
  const Alternative b = balanced_rows_plan(base, h);
  CHECK(b.name == "balanced");
  CHECK(b.origin.rfind("inference only: 1 continuous table split into uneven row ranges", 0) == 0);
  CHECK(b.plan.input_dist == InputDist::inference);
  const TableConfig& t = b.plan.tables[0];
  REQUIRE(t.shards.size() == 4);
  CHECK(rows_of(t) == std::vector<int64_t>{2, 2, 6, 10});
  CHECK(t.shards[2].row_offset == 4);
  CHECK(t.shards[3].rank == 3);
  CHECK(b.plan.tables[1].shards.empty());  // roundrobin: as it was
  CHECK(b.plan.tables[1].dist_type == DistType::roundrobin);
  CHECK(routed(b.plan, k) == std::vector<int64_t>{40, 10, 25, 25});
  CHECK(routed(base, k) == std::vector<int64_t>{60, 15, 15, 10});
  CHECK(imbalance_of(routed(b.plan, k)) == doctest::Approx(1.6));
  CHECK(imbalance_of(routed(base, k)) == doctest::Approx(2.4));
  // PlanRouter under the balanced plan: row 3 is rank 1's local row 1; past the table, x % W.
  const PlanRouter router(b.plan);
  CHECK(router.by_shards(0));
  CHECK_FALSE(router.by_shards(1));
  CHECK(router.route(0, 3, IndexType::i64).dest == 1);
  CHECK(router.route(0, 3, IndexType::i64).local == 1);
  CHECK(router.route(0, 19, IndexType::i64).local == 9);
  CHECK(router.route(0, 21, IndexType::i64).dest == 1);
  CHECK(engine_routing_gap(b.plan).find("table 't' has uneven explicit shards") == 0);
  check_round_trip(b);
}

TEST_CASE("balanced_rows_plan: ties, empty buckets, and tables it leaves alone") {
  // [1,2,1], W = 2: prefix 0,1,3,4, target 2: edges 1 and 2 are as near; the lowest wins.
  {
    const Plan base = plan_of(2, {table("t", 3, {"f"})});
    RowHistogram h(base, 3);
    h.add(kjt_of({{{0, 1, 1, 2}}}, false));
    CHECK(rows_of(balanced_rows_plan(base, h).plan.tables[0]) == std::vector<int64_t>{1, 2});
  }
  // Every id in the last bucket: each rank still gets a bucket (the lowest edges).
  {
    const Plan base = plan_of(4, {table("t", 20, {"f"})});
    RowHistogram h(base, 10);
    h.add(kjt_of({{{19, 19, 18}}}, false));
    const Alternative b = balanced_rows_plan(base, h);
    CHECK(rows_of(b.plan.tables[0]) == std::vector<int64_t>{2, 2, 2, 14});
    check_round_trip(b);
  }
  // The last bucket short (10 rows, width 3): counts [2,2,2,6], prefix 0,2,4,6,12, target 6:
  // edge 3 (row 9); the last rank's one row ends at the table's end. With counts [1,0,0,3]
  // (prefix 0,1,1,1,4, target 2) edges 1..3 are equally near: the lowest, edge 1 (row 3).
  {
    const Plan base = plan_of(2, {table("t", 10, {"f"})});
    RowHistogram h(base, 4);
    h.add(kjt_of({{{0, 0, 3, 3, 6, 6, 9, 9, 9, 9, 9, 9}}}, false));
    CHECK(rows_of(balanced_rows_plan(base, h).plan.tables[0]) == std::vector<int64_t>{9, 1});
    RowHistogram h2(base, 4);
    h2.add(kjt_of({{{9, 9, 9, 0}}}, false));
    CHECK(rows_of(balanced_rows_plan(base, h2).plan.tables[0]) == std::vector<int64_t>{3, 7});
  }
  // No ids, fewer buckets than ranks, or W = 1: the table stays as it was.
  {
    const Plan base = plan_of(4, {table("none", 20, {"f"}), table("few", 20, {"g"})});
    RowHistogram h(base, 3);
    h.add(kjt_of({{{}}, {{1, 2}}}, false));
    const Alternative b = balanced_rows_plan(base, h);
    CHECK(b.plan.tables[0].shards.empty());
    CHECK(b.plan.tables[1].shards.empty());
    CHECK(b.origin.find("2 continuous tables left as before") != std::string::npos);
    CHECK(engine_routing_gap(b.plan).empty());
    check_round_trip(b);
    const Plan one = plan_of(1, {table("t", 5, {"f"})});
    RowHistogram h1(one, 5);
    h1.add(kjt_of({{{1}}}, false));
    CHECK(balanced_rows_plan(one, h1).plan.tables[0].shards.empty());
  }
  // A histogram of another plan is refused.
  {
    const Plan a = plan_of(2, {table("t", 10, {"f"})});
    const Plan other = plan_of(2, {table("t", 12, {"f"})});
    CHECK_THROWS_AS(balanced_rows_plan(a, RowHistogram(other)), Error);
  }
}

TEST_CASE("balanced_rows_plan evens out a zipf-like load the even split piles on rank 0") {
  // Row i (of the first 1000 of 10000) is looked up about 10000/(i+1) times; W = 8.
  Kjt k;
  k.num_features = 1;
  for (int64_t i = 0; i < 1000; ++i)
    for (int64_t n = 0; n < 10000 / (i + 1); ++n) k.values.push_back(i);
  k.lengths = {int64_t(k.values.size())};
  const Plan base = plan_of(8, {table("t", 10000, {"f"})});
  RowHistogram h(base);  // 4096 buckets of 3 rows
  h.add(k);
  const Alternative b = balanced_rows_plan(base, h);
  const double even = imbalance_of(routed(base, k)), bal = imbalance_of(routed(b.plan, k));
  INFO("even " << even << ", balanced " << bal);
  CHECK(even == doctest::Approx(8.0));  // all on rank 0
  // The hottest bucket (rows 0..2: 10000 + 5000 + 3333 ids) alone is 1.96 x the mean.
  CHECK(bal < 2.0);
  CHECK(bal < even / 4);
  for (const ShardSpec& s : b.plan.tables[0].shards) CHECK(s.rows >= 1);
  check_round_trip(b);
}

TEST_CASE("resplit_batch: W = 2 -> 4, 1 and 2, weighted, by hand") {
  // docs/semantics.md §3.4's batch: rank 0 f0 [1,7],[5] f1 [],[4,0,2]; rank 1 f0 [9],[0,3]
  // f1 [5],[]. Global f0 bags [1,7],[5],[9],[0,3]; f1 [],[4,0,2],[5],[].
  Kjt r0 = kjt_of({{{1, 7}, {5}}, {{}, {4, 0, 2}}}, false, true);
  Kjt r1 = kjt_of({{{9}, {0, 3}}, {{5}, {}}}, false, true);
  for (Kjt* k : {&r0, &r1}) {
    k->values_type = IndexType::i32;
    k->lengths_type = IndexType::i32;
    k->mean_divisor = {MeanDivisor::count, MeanDivisor::weights};
  }
  const std::vector<const Kjt*> in = {&r0, &r1};
  const std::vector<Kjt> four = resplit_batch(in, 4);
  REQUIRE(four.size() == 4);
  const std::vector<std::vector<int64_t>> lengths = {{2, 0}, {1, 3}, {1, 1}, {2, 0}};
  const std::vector<std::vector<int64_t>> values = {{1, 7}, {5, 4, 0, 2}, {9, 5}, {0, 3}};
  for (size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(four[r].num_features == 2);
    CHECK(four[r].lengths == lengths[r]);
    CHECK(four[r].values == values[r]);
    std::vector<float> w;
    for (int64_t id : values[r]) w.push_back(float(id) + 0.5f);
    CHECK(four[r].weights == w);
    CHECK(four[r].weighted);
    CHECK_FALSE(four[r].is_vbe());
    CHECK(four[r].values_type == IndexType::i32);
    CHECK(four[r].lengths_type == IndexType::i32);
    CHECK(four[r].mean_divisor == r0.mean_divisor);
  }
  const std::vector<Kjt> one = resplit_batch(in, 1);
  REQUIRE(one.size() == 1);
  CHECK(one[0].lengths == std::vector<int64_t>{2, 1, 1, 2, 0, 3, 1, 0});
  CHECK(one[0].values == std::vector<int64_t>{1, 7, 5, 9, 0, 3, 4, 0, 2, 5});
  const std::vector<Kjt> same = resplit_batch(in, 2);
  for (size_t r = 0; r < 2; ++r) {
    CHECK(same[r].lengths == in[r]->lengths);
    CHECK(same[r].values == in[r]->values);
    CHECK(same[r].weights == in[r]->weights);
    CHECK(same[r].stride_per_feature.empty());
  }
  // Back from 4 to 2 gives the original ranks.
  std::vector<const Kjt*> back;
  for (const Kjt& k : four) back.push_back(&k);
  CHECK(resplit_batch(back, 2)[1].values == r1.values);

  CHECK_THROWS_WITH_AS(resplit_batch(in, 3),
                       "re-split: the global batch of 4 samples does not divide by world size 3",
                       UsageError);
  CHECK_THROWS_AS(resplit_batch(in, 0), UsageError);
  CHECK_THROWS_AS(resplit_batch({}, 2), UsageError);
  Kjt odd = r1;
  odd.weighted = false;
  odd.weights.clear();
  CHECK_THROWS_AS(resplit_batch({&r0, &odd}, 2), Error);
  Kjt short_values = r1;
  short_values.values.pop_back();
  short_values.weights.pop_back();
  CHECK_THROWS_AS(resplit_batch({&r0, &short_values}, 2), Error);
}

TEST_CASE("resplit_batch: VBE bags split as evenly as possible, the first ranks one more") {
  // rank 0: f0 [1],[2,3]; f1 [4]. rank 1: f0 [5]; f1 [6],[],[7,8].
  // Global f0 [1],[2,3],[5] (3 bags); f1 [4],[6],[],[7,8] (4 bags).
  const Kjt r0 = kjt_of({{{1}, {2, 3}}, {{4}}}, true);
  const Kjt r1 = kjt_of({{{5}}, {{6}, {}, {7, 8}}}, true);
  const std::vector<const Kjt*> in = {&r0, &r1};

  const std::vector<Kjt> two = resplit_batch(in, 2);  // f0 2,1; f1 2,2
  CHECK(two[0].stride_per_feature == std::vector<int64_t>{2, 2});
  CHECK(two[0].lengths == std::vector<int64_t>{1, 2, 1, 1});
  CHECK(two[0].values == std::vector<int64_t>{1, 2, 3, 4, 6});
  CHECK(two[1].stride_per_feature == std::vector<int64_t>{1, 2});
  CHECK(two[1].lengths == std::vector<int64_t>{1, 0, 2});
  CHECK(two[1].values == std::vector<int64_t>{5, 7, 8});

  const std::vector<Kjt> three = resplit_batch(in, 3);  // f0 1,1,1; f1 2,1,1
  CHECK(three[0].stride_per_feature == std::vector<int64_t>{1, 2});
  CHECK(three[0].values == std::vector<int64_t>{1, 4, 6});
  CHECK(three[1].stride_per_feature == std::vector<int64_t>{1, 1});
  CHECK(three[1].lengths == std::vector<int64_t>{2, 0});
  CHECK(three[1].values == std::vector<int64_t>{2, 3});
  CHECK(three[2].lengths == std::vector<int64_t>{1, 2});
  CHECK(three[2].values == std::vector<int64_t>{5, 7, 8});

  const std::vector<Kjt> five = resplit_batch(in, 5);  // f0 1,1,1,0,0; f1 1,1,1,1,0
  CHECK(five[3].stride_per_feature == std::vector<int64_t>{0, 1});
  CHECK(five[3].values == std::vector<int64_t>{7, 8});
  CHECK(five[4].stride_per_feature == std::vector<int64_t>{0, 0});
  CHECK(five[4].lengths.empty());
  CHECK(five[4].values.empty());

  // One VBE rank makes the batch VBE: a non-VBE rank's B_{s,f} is its B.
  const Kjt flat = kjt_of({{{9}}, {{9, 9}}}, false);
  const std::vector<Kjt> mixed = resplit_batch({&r0, &flat}, 2);  // f0 3 bags, f1 2 bags
  CHECK(mixed[0].stride_per_feature == std::vector<int64_t>{2, 1});
  CHECK(mixed[1].stride_per_feature == std::vector<int64_t>{1, 1});
  CHECK(mixed[1].values == std::vector<int64_t>{9, 9, 9});
}
