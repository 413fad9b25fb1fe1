// lib/load's pure pieces: TrafficMatrix sums, imbalance, the Space-Saving summary's guarantees,
// batch grouping, the critical-path estimate, and one batch of the worked example of
// docs/semantics.md §3.4 through PlanAccumulator (counts worked out by hand there).
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <random>

#include "load/compute.hpp"
#include "load/space_saving.hpp"

using namespace dynemb;
using namespace dynemb::load;

TEST_CASE("TrafficMatrix: sent and received leave the diagonal out, total keeps it") {
  TrafficMatrix m(3);
  // bytes[s][d]
  const int64_t v[3][3] = {{5, 1, 2}, {3, 7, 4}, {0, 6, 9}};
  for (int s = 0; s < 3; ++s)
    for (int d = 0; d < 3; ++d) m.add(s, d, v[s][d]);
  CHECK(m.sent() == std::vector<int64_t>{3, 7, 6});
  CHECK(m.received() == std::vector<int64_t>{3, 7, 6});
  m.add(0, 2, 10);
  CHECK(m.sent() == std::vector<int64_t>{13, 7, 6});
  CHECK(m.received() == std::vector<int64_t>{3, 7, 16});
  CHECK(m.total() == 47);
  TrafficMatrix sum;
  sum.add(m);
  sum.add(m);
  CHECK(sum.at(0, 2) == 24);
  CHECK(sum.total() == 94);
}

TEST_CASE("imbalance: max/mean, W when one rank has everything, 0 when nothing") {
  CHECK(imbalance({4, 4, 4, 4}) == 1.0);
  CHECK(imbalance({12, 0, 0, 0}) == 4.0);
  CHECK(imbalance({3, 1}) == doctest::Approx(1.5));
  CHECK(imbalance({0, 0, 0}) == 0.0);
  CHECK(imbalance({}) == 0.0);
}

TEST_CASE("critical path: the busiest rank's larger direction off the diagonal") {
  TrafficMatrix m(2);
  m.add(0, 0, 1000000000);  // a local copy: not on the link
  m.add(0, 1, 125000000);   // 1 Gbit
  m.add(1, 0, 250000000);   // 2 Gbit
  CHECK(critical_path_seconds(m, 1.0) == doctest::Approx(2.0));
  CHECK(critical_path_seconds(m, 100.0) == doctest::Approx(0.02));
  CHECK(link_seconds(125, 1e-6) == doctest::Approx(1.0));
}

TEST_CASE("batch groups: at most max columns") {
  CHECK(batch_group_size(10, 1024) == 1);
  CHECK(batch_group_size(1024, 1024) == 1);
  CHECK(batch_group_size(1025, 1024) == 2);
  CHECK(batch_group_size(5000, 1024) == 5);
}

TEST_CASE("Space-Saving: exact while the distinct rows fit, bounded after") {
  SpaceSaving ss(4);
  // table 0 rows 7 (x5), 3 (x2), 9 (x1); table 1 row 7 (x4): four distinct, all exact.
  for (int i = 0; i < 5; ++i) ss.add(0, 7, 1);
  ss.add(0, 3, 2);
  ss.add(1, 7, 3);
  ss.add(0, 9, 1);
  ss.add(1, 7, 1);
  auto top = ss.top(10);
  REQUIRE(top.size() == 4);
  CHECK((top[0].table == 0 && top[0].row == 7 && top[0].count == 5 && top[0].overcount == 0));
  CHECK((top[1].table == 1 && top[1].row == 7 && top[1].count == 4 && top[1].overcount == 0));
  CHECK((top[2].table == 0 && top[2].row == 3 && top[2].count == 2 && top[2].overcount == 0));
  CHECK((top[3].table == 0 && top[3].row == 9 && top[3].count == 1 && top[3].overcount == 0));
  CHECK(ss.floor() == 0);
  // A fifth row: the least (table 0 row 9, count 1) is dropped and bounds every row not kept;
  // the new row's count is exact (nothing had been dropped before it came).
  ss.add(2, 100, 3);
  top = ss.top(10);
  REQUIRE(top.size() == 4);
  CHECK(ss.floor() == 1);
  CHECK((top[2].table == 2 && top[2].row == 100 && top[2].count == 3 && top[2].overcount == 0));
  // A sixth enters with the floor: count 1 + 1, overcount 1; it ties with row 3 (count 2) and
  // loses on the key, so it is dropped and the floor becomes 2.
  ss.add(3, 5, 1);
  CHECK(ss.floor() == 2);
  CHECK(ss.top(10).back().row == 3);
  // Row 9 again: 2 + 4 = 6 with overcount 2 (its true count, 5, is inside [4, 6]).
  ss.add(0, 9, 4);
  top = ss.top(10);
  CHECK((top[0].table == 0 && top[0].row == 9 && top[0].count == 6 && top[0].overcount == 2));
  CHECK(ss.top(2).size() == 2);
}

TEST_CASE(
    "Space-Saving: on a long skewed stream every true count is within [count - over, count]") {
  std::mt19937_64 rng(7);
  std::map<uint64_t, int64_t> truth;
  SpaceSaving ss(32);
  int64_t total = 0;
  for (int i = 0; i < 20000; ++i) {
    // Row r with probability ~ 1/(r+1): a heavy head and a long tail.
    const uint64_t r =
        static_cast<uint64_t>(std::exp(std::uniform_real_distribution<double>(0, 9)(rng)));
    const int64_t w = 1 + static_cast<int64_t>(rng() % 3);
    truth[r] += w;
    total += w;
    ss.add(0, r, w);
  }
  for (const CountedRow& c : ss.top(32)) {
    const int64_t t = truth[c.row];
    CHECK(c.count >= t);
    CHECK(c.count - c.overcount <= t);
    CHECK(c.overcount <= total / 32);
  }
  // Every row above total / capacity is kept.
  for (const auto& [row, n] : truth)
    if (n > total / 32) {
      bool found = false;
      for (const CountedRow& c : ss.top(32)) found = found || c.row == row;
      CHECK(found);
    }
}

TEST_CASE("PlanAccumulator: the worked example of docs/semantics.md §3.4") {
  const Plan plan = load_plan_or_throw(
      "format_version: 1\nworld_size: 2\nmodule: sequence\ntables:\n"
      "  - {name: a, num_embeddings: 10, embedding_dim: 2, features: [f0]}\n"
      "  - {name: b, num_embeddings: 6, embedding_dim: 2, features: [f1]}\n",
      "ex.yaml");
  Kjt k0, k1;
  k0.num_features = k1.num_features = 2;
  k0.lengths = {2, 1, 0, 3};
  k0.values = {1, 7, 5, 4, 0, 2};
  k1.lengths = {1, 2, 1, 0};
  k1.values = {9, 0, 3, 5};
  LoadOptions opt;
  opt.link_gbps = 1e-6;  // 125 bytes a second: seconds = 8 * bytes / 1000
  PlanAccumulator acc({"captured", "example", plan}, 1, opt);
  acc.add_batch(0, {&k0, &k1});
  const PlanLoad p = acc.finish();
  // rank 0 looks up a{1,0,3} b{0,2}; rank 1 a{7,5,9} b{4,5}.
  CHECK(p.total[0].ids == 5);
  CHECK(p.total[1].ids == 5);
  CHECK(p.total[0].unique_rows == 5);
  CHECK(p.total[1].unique_rows == 5);
  CHECK(p.table_ids == std::vector<int64_t>{3, 3, 2, 2});
  // Input: 4 lengths of 8 bytes to each rank, plus 8 bytes an id routed there.
  CHECK(p.input_dist.bytes == std::vector<int64_t>{32 + 24, 32 + 24, 32 + 16, 32 + 16});
  // Output (sender d -> s): ids s routed to d, times D = 2 times 4 bytes.
  CHECK(p.output_dist.bytes == std::vector<int64_t>{24, 16, 24, 16});
  CHECK(p.hottest_rank == 0);
  REQUIRE(p.batches.size() == 1);
  CHECK(p.batches[0].input_received == std::vector<int64_t>{48, 56});
  CHECK(p.batches[0].output_received == std::vector<int64_t>{24, 16});
  // Input: rank 0 sends 56, receives 48; rank 1 sends 48, receives 56: 56 bytes the worst.
  CHECK(p.input_dist_seconds == doctest::Approx(56 * 8 / 1000.0));
  CHECK(p.output_dist_seconds == doctest::Approx(24 * 8 / 1000.0));
}
