// Plan loader: every check of plan-format.md, each with a broken plan whose finding is
// asserted by message AND line:col; the RW even split of docs/semantics.md §2; and every
// shipped plan in plans/ validates clean.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "plan/plan.hpp"

using namespace dynemb;

namespace {

// Findings at "LINE:COL" of the given severity.
std::vector<Diagnostic> at(const PlanLoadResult& r, int line, int col,
                           Severity s = Severity::error) {
  std::vector<Diagnostic> v;
  for (const Diagnostic& d : r.findings)
    if (d.loc.line == line && d.loc.col == col && d.severity == s) v.push_back(d);
  return v;
}

int count(const PlanLoadResult& r, Severity s) {
  int n = 0;
  for (const Diagnostic& d : r.findings) n += d.severity == s;
  return n;
}

std::string dump(const PlanLoadResult& r) {
  std::string s;
  for (const Diagnostic& d : r.findings) s += d.str() + "\n";
  return s;
}

// Exactly one error, at line:col, whose str() contains `text`.
void expect_error(const std::string& yaml, int line, int col, const std::string& text) {
  const PlanLoadResult r = parse_plan(yaml, "plan.yaml");
  INFO(dump(r));
  CHECK_FALSE(r.ok());
  CHECK_FALSE(r.plan.has_value());
  CHECK(count(r, Severity::error) == 1);
  const auto hits = at(r, line, col);
  REQUIRE(hits.size() == 1);
  CHECK(hits[0].str().find(text) != std::string::npos);
}

// The common head of the test plans; tables follow from line 5.
const std::string kHead =
    "format_version: 1\n"  // 1
    "world_size: 4\n"      // 2
    "module: sequence\n"   // 3
    "tables:\n";           // 4

const std::string kValid = kHead +
                           "  - name: t0\n"             // 5
                           "    num_embeddings: 10\n"   // 6
                           "    embedding_dim: 2\n"     // 7
                           "    features: [f0]\n"       // 8
                           "  - name: t1\n"             // 9
                           "    num_embeddings: 5\n"    // 10
                           "    embedding_dim: 2\n"     // 11
                           "    features: [f1, f2]\n";  // 12

}  // namespace

TEST_CASE("RW block size and even split: docs/semantics.md §2 examples") {
  CHECK(rw_block_size(10, 4) == 3);
  CHECK(rw_even_shard_rows(10, 4) == std::vector<int64_t>{3, 3, 3, 1});
  CHECK(rw_block_size(5, 4) == 2);
  CHECK(rw_even_shard_rows(5, 4) == std::vector<int64_t>{2, 2, 1, 0});
  CHECK(rw_block_size(12, 4) == 3);
  CHECK(rw_even_shard_rows(12, 4) == std::vector<int64_t>{3, 3, 3, 3});
  // ec-bench-criteo: 64-bit sizes, the last rank short by 5 rows.
  const auto big = rw_even_shard_rows(177944275, 8);
  CHECK(rw_block_size(177944275, 8) == 22243035);
  CHECK(big[0] == 22243035);
  CHECK(big[7] == 177944275 - 7 * int64_t{22243035});
}

TEST_CASE("a valid plan loads, keeps its text and derives features in sharding order") {
  const PlanLoadResult r = parse_plan(kValid, "plan.yaml");
  INFO(dump(r));
  REQUIRE(r.ok());
  CHECK(r.findings.empty());
  const Plan& p = *r.plan;
  CHECK(p.source_text == kValid);
  CHECK(p.path == "plan.yaml");
  CHECK(p.world_size == 4);
  CHECK(p.module == ModuleKind::sequence);
  CHECK(p.comm_precision == DType::f32);
  CHECK(p.bounds_check == BoundsCheck::error);
  REQUIRE(p.features.size() == 3);
  CHECK(p.features[0].name == "f0");
  CHECK(p.features[0].block_size == 3);
  CHECK(p.features[1].name == "f1");
  CHECK(p.features[1].table == 1);
  CHECK(p.features[1].block_size == 2);
  CHECK(p.features[2].name == "f2");
  CHECK(p.sum_dim == 2);
  CHECK(p.tables[0].loc.line == 5);
  CHECK(p.tables[0].loc.col == 5);
  CHECK(shard_rows_per_rank(p.tables[1], 4) == std::vector<int64_t>{2, 2, 1, 0});
}

TEST_CASE("Diagnostic::str is GCC style, exact") {
  const std::string y = kHead +
                        "  - name: t0\n"
                        "    num_embeddings: 10\n"
                        "    embedding_dim: 2\n"
                        "    features: [f0]\n"
                        "  - name: t1\n"
                        "    num_embeddings: 5\n"
                        "    embedding_dim: 0\n"  // line 11, value at col 20
                        "    features: [f1]\n";
  const PlanLoadResult r = parse_plan(y, "plan.yaml");
  REQUIRE(r.findings.size() == 1);
  CHECK(r.findings[0].str() ==
        "plan.yaml:11:20: error: tables[1].embedding_dim: must be >= 1, got 0");
  CHECK_THROWS_AS(load_plan_or_throw(y, "plan.yaml"), PlanError);
  try {
    load_plan_or_throw(y, "plan.yaml");
  } catch (const PlanError& e) {
    CHECK(e.loc().line == 11);
    CHECK(e.loc().col == 20);
    CHECK(std::string(e.what()) ==
          "plan.yaml:11:20: error: tables[1].embedding_dim: must be >= 1, got 0");
  }
  CHECK(load_plan_or_throw(kValid, "x.yaml").features.size() == 3);
}

TEST_CASE("syntax errors carry yaml-cpp's mark") {
  expect_error("format_version: 1\nworld_size: [1, 2\nmodule: sequence\n", 3, 7,
               "YAML syntax error: end of sequence flow not found");
  expect_error("format_version: 1\n  world_size: 2\n", 2, 13,
               "YAML syntax error: illegal map value");
  expect_error(kValid + "---\nformat_version: 1\n", 13, 1, "a plan is one YAML document");
  expect_error("", 1, 1, "the plan is empty");
  expect_error("# only a comment\n", 1, 1, "the plan is empty");
  expect_error("just a string\n", 1, 1, "expected a mapping, got a scalar");
}

TEST_CASE("unknown keys, with a did-you-mean suggestion") {
  // A misspelt required key: the unknown key itself, and the table reported as lacking it.
  const std::string y = kHead +
                        "  - name: t0\n"            // 5
                        "    num_embeddings: 10\n"  // 6
                        "    embeding_dim: 2\n"     // 7: key at col 5
                        "    features: [f0]\n";
  const PlanLoadResult r = parse_plan(y, "plan.yaml");
  INFO(dump(r));
  CHECK(count(r, Severity::error) == 2);
  REQUIRE(at(r, 7, 5).size() == 1);
  CHECK(at(r, 7, 5)[0].str() ==
        "plan.yaml:7:5: error: tables[0].embeding_dim: unknown key 'embeding_dim'; did you "
        "mean 'embedding_dim'? (valid keys: name, num_embeddings, embedding_dim, data_type, "
        "pooling, dist_type, features, shards)");
  REQUIRE(at(r, 5, 5).size() == 1);
  CHECK(at(r, 5, 5)[0].message == "missing required key 'embedding_dim'");

  // Far from every valid key: no suggestion.
  const PlanLoadResult r2 = parse_plan(kValid + "colour: red\n", "plan.yaml");
  REQUIRE(at(r2, 13, 1).size() == 1);
  CHECK(at(r2, 13, 1)[0].message.find("unknown key 'colour' (valid keys:") == 0);
  // Inside a shard's flow mapping: the misspelt key, and the shard that lacks `rows`.
  const PlanLoadResult r3 = parse_plan(kHead +
                                           "  - name: t0\n"
                                           "    num_embeddings: 2\n"
                                           "    embedding_dim: 2\n"
                                           "    features: [f0]\n"
                                           "    shards:\n"
                                           "      - {rank: 0, row_offset: 0, rows: 1}\n"
                                           "      - {rank: 1, row_offset: 1, rows: 1}\n"
                                           "      - {rank: 2, row_offset: 2, rows: 0}\n"
                                           "      - {rank: 3, row_offset: 2, row: 0}\n",  // 13
                                       "plan.yaml");
  INFO(dump(r3));
  CHECK(count(r3, Severity::error) == 2);
  REQUIRE(at(r3, 13, 34).size() == 1);
  CHECK(at(r3, 13, 34)[0].message.find("unknown key 'row'; did you mean 'rows'?") == 0);
  REQUIRE(at(r3, 13, 9).size() == 1);
  CHECK(at(r3, 13, 9)[0].str() ==
        "plan.yaml:13:9: error: tables[0].shards[3]: missing required key 'rows'");
}

TEST_CASE("duplicate keys are reported at the second occurrence") {
  expect_error(kValid + "world_size: 8\n", 13, 1, "duplicate key 'world_size' (first at line 2:1)");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"  // 6
                   "    embedding_dim: 2\n"
                   "    num_embeddings: 12\n"  // 8
                   "    features: [f0]\n",
               8, 5, "duplicate key 'num_embeddings' (first at line 6:5)");
  // In a flow mapping.
  const std::string flow =
      "format_version: 1\nworld_size: 1\nmodule: sequence\ntables:\n"
      "  - {name: t0, num_embeddings: 4, embedding_dim: 2, features: [f0], name: t1}\n";
  expect_error(flow, 5, 69, "duplicate key 'name' (first at line 5:6)");
  // A non-string key.
  expect_error(kValid + "[a, b]: 1\n", 13, 1, "a mapping key must be a plain string, got a list");
}

TEST_CASE("missing required keys are reported at the parent mapping") {
  expect_error(
      "format_version: 1\nworld_size: 4\ntables:\n  - name: t0\n    num_embeddings: 3\n"
      "    embedding_dim: 2\n    features: [f0]\n",
      1, 1, "error: missing required key 'module'");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n"
                   "  -   name: t1\n"  // line 9, mapping starts at col 7
                   "      embedding_dim: 2\n",
               9, 7, "tables[1]: missing required keys 'num_embeddings', 'features'");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 4\n"
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n"
                   "    shards:\n"
                   "      - {rank: 0, rows: 1}\n",  // line 10, mapping at the brace
               10, 9, "tables[0].shards[0]: missing required key 'row_offset'");
}

TEST_CASE("wrong types point at the value") {
  expect_error(
      "format_version: 1\nworld_size: four\nmodule: sequence\ntables:\n  - name: t0\n"
      "    num_embeddings: 3\n    embedding_dim: 2\n    features: [f0]\n",
      2, 13, "world_size: expected an integer, got 'four'");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: \"10\"\n"  // quoted: a string, not a number
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n",
               6, 21, "tables[0].num_embeddings: expected an integer, got the quoted string '10'");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2.5\n"
                   "    features: [f0]\n",
               7, 20, "tables[0].embedding_dim: expected an integer, got '2.5'");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2\n"
                   "    features: f0\n",
               8, 15, "tables[0].features: expected a list, got a scalar");
  expect_error(kHead +
                   "  - name: [t0]\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n",
               5, 11, "tables[0].name: expected a string, got a list");
  expect_error("format_version: 1\nworld_size: 4\nmodule: sequence\ntables: {a: 1}\n", 4, 9,
               "tables: expected a list, got a mapping");
  // An empty value is reported at its key.
  expect_error(
      "format_version: 1\nworld_size:\nmodule: sequence\ntables:\n  - name: t0\n"
      "    num_embeddings: 3\n    embedding_dim: 2\n    features: [f0]\n",
      2, 1, "world_size: expected an integer, got null (no value)");
}

TEST_CASE("out-of-range values, 64-bit values and format_version") {
  expect_error(
      "format_version: 1\nworld_size: 0\nmodule: sequence\ntables:\n  - name: t0\n"
      "    num_embeddings: 3\n    embedding_dim: 2\n    features: [f0]\n",
      2, 13, "world_size: must be >= 1, got 0");
  expect_error(
      "format_version: 1\nworld_size: 100000\nmodule: sequence\ntables:\n  - name: t0\n"
      "    num_embeddings: 3\n    embedding_dim: 2\n    features: [f0]\n",
      2, 13, "world_size: must be <= 65536, got 100000");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: -3\n"
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n",
               6, 21, "tables[0].num_embeddings: must be >= 1, got -3");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 9223372036854775808\n"
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n",
               6, 21, "integer '9223372036854775808' does not fit in 64 bits");
  // Fits in int64, but rows x D x 4 bytes does not.
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 4611686018427387904\n"
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n",
               6, 21, "num_embeddings x embedding_dim x 4 bytes overflows 64 bits");
  expect_error(
      "format_version: 2\nworld_size: 4\nmodule: sequence\ntables:\n  - name: t0\n"
      "    num_embeddings: 3\n    embedding_dim: 2\n    features: [f0]\n",
      1, 17, "unsupported format_version 2 (this build reads version 1)");
  expect_error("format_version: 1\nworld_size: 4\nmodule: sequence\ntables: []\n", 4, 9,
               "tables: must have at least 1 entry");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2\n"
                   "    features: []\n",
               8, 15, "tables[0].features: must have at least 1 entry");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 2\n"
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n"
                   "    shards:\n"
                   "      - {rank: 0, row_offset: 0, rows: 1}\n"
                   "      - {rank: 1, row_offset: 1, rows: 1}\n"
                   "      - {rank: 2, row_offset: 2, rows: 0}\n"
                   "      - {rank: 4, row_offset: 2, rows: 0}\n",  // line 13
               13, 16, "tables[0].shards[3].rank: must be < world_size 4, got 4");

  // A real 64-bit table loads, with a warning naming it (rows x D >= 2^31).
  const std::string big = kHead +
                          "  - name: criteo\n"
                          "    num_embeddings: 177944275\n"  // line 6
                          "    embedding_dim: 128\n"
                          "    features: [f0]\n";
  const PlanLoadResult r = parse_plan(big, "plan.yaml");
  INFO(dump(r));
  REQUIRE(r.ok());
  CHECK(r.plan->tables[0].num_embeddings == 177944275);
  REQUIRE(r.findings.size() == 1);
  CHECK(r.findings[0].str() ==
        "plan.yaml:6:21: warning: tables[0].num_embeddings: table 'criteo' has 177944275 x 128 "
        "= 22776867200 elements (>= 2^31): kernels that index with 32 bits overflow on it");
}

TEST_CASE("the 2^31-element warning starts exactly at 2^31") {
  auto plan = [](const char* rows) {
    return kHead + "  - name: t0\n    num_embeddings: " + rows +
           "\n    embedding_dim: 2\n    features: [f0]\n";
  };
  const PlanLoadResult below = parse_plan(plan("1073741823"), "p.yaml");  // 2^31 - 2
  CHECK(below.ok());
  CHECK(below.findings.empty());
  const PlanLoadResult edge = parse_plan(plan("1073741824"), "p.yaml");  // 2^31
  CHECK(edge.ok());
  REQUIRE(at(edge, 6, 21, Severity::warning).size() == 1);
  CHECK(at(edge, 6, 21, Severity::warning)[0].message.find("table 't0' has 1073741824 x 2") == 0);
}

TEST_CASE("enum values list the allowed ones") {
  expect_error(
      "format_version: 1\nworld_size: 4\nmodule: jagged\ntables:\n  - name: t0\n"
      "    num_embeddings: 3\n    embedding_dim: 2\n    features: [f0]\n",
      3, 9, "module: must be one of sequence, pooled; got 'jagged'");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2\n"
                   "    data_type: fp64\n"
                   "    features: [f0]\n",
               8, 16, "tables[0].data_type: must be one of fp32, fp16, bf16; got 'fp64'");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2\n"
                   "    dist_type: contiguous\n"
                   "    features: [f0]\n",
               8, 16,
               "must be one of continuous, roundrobin, hash_roundrobin; got 'contiguous'; did "
               "you mean 'continuous'?");
  expect_error(kValid + "comm_precision: int8\n", 13, 17,
               "comm_precision: must be one of fp32, fp16, bf16; got 'int8'");
  expect_error(kValid + "bounds_check: warn\n", 13, 15,
               "bounds_check: must be one of error, warn_zero_row, ignore; got 'warn'");
}

TEST_CASE("duplicate table and feature names") {
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n"
                   "  - name: t0\n"  // line 9
                   "    num_embeddings: 5\n"
                   "    embedding_dim: 2\n"
                   "    features: [f1]\n",
               9, 11, "tables[1].name: duplicate table name 't0' (first at line 5:11)");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n"
                   "  - name: t1\n"
                   "    num_embeddings: 5\n"
                   "    embedding_dim: 2\n"
                   "    features: [f1, f0]\n",  // line 12, second f0 at col 20
               12, 20, "tables[1].features[1]: duplicate feature name 'f0' (first at line 8:16)");
}

TEST_CASE("sequence plans: one common embedding_dim, no pooling key") {
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n"
                   "  - name: t1\n"
                   "    num_embeddings: 5\n"
                   "    embedding_dim: 3\n"  // line 11
                   "    features: [f1]\n",
               11, 20,
               "tables[1].embedding_dim: a sequence plan needs one common embedding_dim: 3 here, "
               "2 in tables[0] (t0)");
  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2\n"
                   "    pooling: sum\n"  // line 8
                   "    features: [f0]\n",
               8, 5, "tables[0].pooling: 'pooling' is for pooled plans only (module is sequence");
  // The same dims and pooling keys are fine in a pooled plan.
  const std::string pooled =
      "format_version: 1\nworld_size: 4\nmodule: pooled\ntables:\n"
      "  - {name: t0, num_embeddings: 10, embedding_dim: 16, "
      "pooling: mean, features: [f0]}\n"
      "  - {name: t1, num_embeddings: 5, embedding_dim: 8, "
      "features: [f1]}\n";
  const PlanLoadResult r = parse_plan(pooled, "p.yaml");
  INFO(dump(r));
  REQUIRE(r.ok());
  CHECK(r.plan->sum_dim == 24);
  CHECK(r.plan->any_mean);
  CHECK(r.plan->features[1].column_offset == 16);
}

TEST_CASE("shards: the ceil rule, with which rank gets which ids") {
  const std::string head =
      "format_version: 1\nworld_size: 2\nmodule: sequence\ntables:\n"
      "  - name: t1\n"
      "    num_embeddings: 6\n"
      "    embedding_dim: 2\n"
      "    features: [f1]\n"
      "    shards:\n";  // shards from line 10
  // Contiguous and covering, but [4,2] instead of the ceil rule's [3,3]: both ranks differ.
  const PlanLoadResult r = parse_plan(head +
                                          "      - {rank: 0, row_offset: 0, rows: 4}\n"
                                          "      - {rank: 1, row_offset: 4, rows: 2}\n",
                                      "plan.yaml");
  INFO(dump(r));
  CHECK(count(r, Severity::error) == 2);
  REQUIRE(at(r, 10, 40).size() == 1);
  CHECK(at(r, 10, 40)[0].str() ==
        "plan.yaml:10:40: error: tables[0].shards[0].rows: training routes ids [0,3) to rank 0 "
        "(blk=3), but shards give rank 0 rows [0,4); the ceil rule (docs/semantics.md §2) gives "
        "rows per rank [3,3]");
  REQUIRE(at(r, 11, 40).size() == 1);
  CHECK(at(r, 11, 40)[0].message ==
        "training routes ids [3,6) to rank 1 (blk=3), but shards give rank 1 rows [4,6)");

  // docs/semantics.md §2: N=5, W=4 is [2,2,1,0]; an "even-looking" [2,1,1,1] is wrong from rank 1.
  const std::string w4 =
      "format_version: 1\nworld_size: 4\nmodule: sequence\ntables:\n"
      "  - name: t0\n    num_embeddings: 5\n    embedding_dim: 2\n"
      "    features: [f0]\n    shards:\n"
      "      - {rank: 0, row_offset: 0, rows: 2}\n"   // 10
      "      - {rank: 1, row_offset: 2, rows: 1}\n"   // 11
      "      - {rank: 2, row_offset: 3, rows: 1}\n"   // 12
      "      - {rank: 3, row_offset: 4, rows: 1}\n";  // 13
  const PlanLoadResult r4 = parse_plan(w4, "plan.yaml");
  INFO(dump(r4));
  CHECK(count(r4, Severity::error) == 2);
  REQUIRE(at(r4, 11, 40).size() == 1);
  CHECK(at(r4, 11, 40)[0].message ==
        "training routes ids [2,4) to rank 1 (blk=2), but shards give rank 1 rows [2,3); the "
        "ceil rule (docs/semantics.md §2) gives rows per rank [2,2,1,0]");
  REQUIRE(at(r4, 13, 40).size() == 1);
  CHECK(at(r4, 13, 40)[0].message ==
        "training routes no ids to rank 3 (blk=2), but shards give rank 3 rows [4,5)");
  CHECK(at(r4, 12, 40).empty());  // rank 2 has 1 row in both

  // Shards equal to the ceil rule (here listed out of rank order) are fine.
  const PlanLoadResult ok = parse_plan(head +
                                           "      - {rank: 1, row_offset: 3, rows: 3}\n"
                                           "      - {rank: 0, row_offset: 0, rows: 3}\n",
                                       "plan.yaml");
  INFO(dump(ok));
  REQUIRE(ok.ok());
  CHECK(ok.findings.empty());
  CHECK(shard_rows_per_rank(ok.plan->tables[0], 2) == std::vector<int64_t>{3, 3});
}

TEST_CASE("input_dist inference: uneven continuous shards are routed by their offsets") {
  const std::string head =
      "format_version: 1\nworld_size: 2\nmodule: sequence\ninput_dist: inference\ntables:\n"
      "  - name: t1\n"
      "    num_embeddings: 6\n"
      "    embedding_dim: 2\n"
      "    features: [f1]\n"
      "    shards:\n";  // shards from line 11
  // [4,2] breaks the ceil rule; the inference input dist routes by the offsets: no finding.
  const PlanLoadResult r = parse_plan(head +
                                          "      - {rank: 0, row_offset: 0, rows: 4}\n"
                                          "      - {rank: 1, row_offset: 4, rows: 2}\n",
                                      "plan.yaml");
  INFO(dump(r));
  REQUIRE(r.ok());
  CHECK(r.findings.empty());
  CHECK(r.plan->input_dist == InputDist::inference);
  CHECK(routes_by_shards(*r.plan, r.plan->tables[0]));
  CHECK(engine_routing_gap(*r.plan) ==
        "table 't1' has uneven explicit shards under input_dist inference, which the GPU "
        "bucketize (one block size per feature, docs/semantics.md §2) cannot route");
  // finalize gives the feature the shards' offsets, then the table's rows.
  CHECK(r.plan->features[0].bucketize_pos == std::vector<int64_t>{0, 4, 6});
  CHECK(rank_rows(r.plan->features[0], 1).first == 4);
  CHECK(rank_rows(r.plan->features[0], 1).rows == 2);
  // Still one cover of [0, num_embeddings), in rank order.
  expect_error(head +
                   "      - {rank: 0, row_offset: 0, rows: 4}\n"
                   "      - {rank: 1, row_offset: 4, rows: 3}\n",
               12, 40, "shards cover rows [0,7) but num_embeddings is 6");
  // The default, and a value that is not one.
  const PlanLoadResult t = parse_plan(kValid, "plan.yaml");
  REQUIRE(t.ok());
  CHECK(t.plan->input_dist == InputDist::training);
  expect_error("format_version: 1\nworld_size: 2\nmodule: sequence\ninput_dist: inferense\n" +
                   kValid.substr(kHead.size() - 8),
               4, 13,
               "must be one of training, inference; got 'inferense'; did you mean 'inference'?");
}

TEST_CASE("shards: one per rank, contiguous, non-overlapping, covering") {
  const std::string head =
      "format_version: 1\nworld_size: 2\nmodule: sequence\ntables:\n"
      "  - name: t1\n"
      "    num_embeddings: 6\n"
      "    embedding_dim: 2\n"
      "    features: [f1]\n"
      "    shards:\n";  // the list starts at line 10, col 7
  expect_error(head + "      - {rank: 0, row_offset: 0, rows: 6}\n", 10, 7,
               "tables[0].shards: expected exactly one shard per rank 0..1 (world_size 2), got 1; "
               "no shard for rank 1");
  // Two shards for rank 0: at the second rank value, plus the count error for rank 1.
  {
    const PlanLoadResult r = parse_plan(head +
                                            "      - {rank: 0, row_offset: 0, rows: 3}\n"
                                            "      - {rank: 0, row_offset: 3, rows: 3}\n",
                                        "plan.yaml");
    INFO(dump(r));
    REQUIRE(at(r, 11, 16).size() == 1);
    CHECK(at(r, 11, 16)[0].message == "rank 0 has a second shard (first at line 10:16)");
    REQUIRE(at(r, 10, 7).size() == 1);
    CHECK(at(r, 10, 7)[0].message.find("no shard for rank 1") != std::string::npos);
  }
  expect_error(head +
                   "      - {rank: 0, row_offset: 0, rows: 3}\n"
                   "      - {rank: 1, row_offset: 4, rows: 2}\n",
               11, 31,
               "tables[0].shards[1].row_offset: rows [3,4) are in no shard: rank 0 ends at row 3, "
               "rank 1 starts at row 4");
  expect_error(head +
                   "      - {rank: 0, row_offset: 0, rows: 3}\n"
                   "      - {rank: 1, row_offset: 2, rows: 4}\n",
               11, 31, "rank 1's rows [2,6) overlap rank 0's, which end at row 3");
  expect_error(head +
                   "      - {rank: 0, row_offset: 1, rows: 3}\n"
                   "      - {rank: 1, row_offset: 4, rows: 2}\n",
               10, 31, "rank 0's shard must start at row 0, got row_offset 1");
  expect_error(head +
                   "      - {rank: 0, row_offset: 0, rows: 3}\n"
                   "      - {rank: 1, row_offset: 3, rows: 2}\n",
               11, 40,
               "tables[0].shards[1].rows: shards cover rows [0,5) but num_embeddings is 6 (rows "
               "[5,6) are in no shard)");
  expect_error(head +
                   "      - {rank: 0, row_offset: 0, rows: 3}\n"
                   "      - {rank: 1, row_offset: 3, rows: 4}\n",
               11, 40, "shards cover rows [0,7) but num_embeddings is 6");
  expect_error(head +
                   "      - {rank: 0, row_offset: 0, rows: -1}\n"
                   "      - {rank: 1, row_offset: 0, rows: 6}\n",
               10, 40, "tables[0].shards[0].rows: must be >= 0, got -1");
}

TEST_CASE("non-continuous tables: shard count and ranks only, and a warning") {
  const std::string head =
      "format_version: 1\nworld_size: 2\nmodule: sequence\ntables:\n"
      "  - name: t1\n"
      "    num_embeddings: 6\n"
      "    embedding_dim: 2\n"
      "    dist_type: hash_roundrobin\n"
      "    features: [f1]\n"
      "    shards:\n";  // key at line 10 col 5, list at line 11 col 7
  // Capacities [5,5] break the ceil rule and overlap as ranges: no error, one warning.
  const PlanLoadResult r = parse_plan(head +
                                          "      - {rank: 0, row_offset: 0, rows: 5}\n"
                                          "      - {rank: 1, row_offset: 0, rows: 5}\n",
                                      "plan.yaml");
  INFO(dump(r));
  REQUIRE(r.ok());
  REQUIRE(r.findings.size() == 1);
  CHECK(r.findings[0].str() ==
        "plan.yaml:10:5: warning: tables[0].shards: dist_type hash_roundrobin does not route ids "
        "by row ranges: row_offset is ignored and shard rows are only per-rank capacities");
  CHECK(shard_rows_per_rank(r.plan->tables[0], 2) == std::vector<int64_t>{5, 5});
  // The count is still checked.
  const PlanLoadResult r2 =
      parse_plan(head + "      - {rank: 1, row_offset: 0, rows: 5}\n", "plan.yaml");
  INFO(dump(r2));
  REQUIRE(at(r2, 11, 7).size() == 1);
  CHECK(at(r2, 11, 7)[0].message.find("no shard for rank 0") != std::string::npos);
}

TEST_CASE("mixed dist_types: a note; mixed data_types: an error") {
  const std::string mixed = kHead +
                            "  - name: t0\n"
                            "    num_embeddings: 10\n"
                            "    embedding_dim: 2\n"
                            "    features: [f0]\n"
                            "  - name: t1\n"
                            "    num_embeddings: 5\n"
                            "    embedding_dim: 2\n"
                            "    dist_type: roundrobin\n"  // line 12
                            "    features: [f1]\n";
  const PlanLoadResult r = parse_plan(mixed, "plan.yaml");
  INFO(dump(r));
  REQUIRE(r.ok());
  REQUIRE(r.findings.size() == 1);
  CHECK(r.findings[0].str() ==
        "plan.yaml:12:16: note: tables[1].dist_type: plan mixes dist_types: continuous (t0); "
        "roundrobin (t1); each feature is routed by its own table's dist_type");
  CHECK(r.plan->features[1].dist_type == DistType::roundrobin);

  expect_error(kHead +
                   "  - name: t0\n"
                   "    num_embeddings: 10\n"
                   "    embedding_dim: 2\n"
                   "    features: [f0]\n"
                   "  - name: t1\n"
                   "    num_embeddings: 5\n"
                   "    embedding_dim: 2\n"
                   "    data_type: bf16\n"  // line 12
                   "    features: [f1]\n",
               12, 16,
               "tables[1].data_type: all tables must share one data_type (the output dist "
               "receives one tensor): bf16 here, fp32 in tables[0] (t0)");
}

TEST_CASE("hostile YAML: deep nesting, aliases, huge input") {
  std::string deep = "format_version: 1\nx: ";
  for (int i = 0; i < 100000; ++i) deep += "{a: ";
  const PlanLoadResult r = parse_plan(deep, "plan.yaml");
  INFO(dump(r));
  REQUIRE(r.findings.size() == 1);
  // The root mapping is level 1, so the 64th '{' (at col 4 + 4*63) opens level 65.
  CHECK(r.findings[0].str() ==
        "plan.yaml:2:256: error: YAML nesting deeper than 64 levels; refusing it");
  // Unclosed flow sequences: the same cap, one finding, no crash.
  const PlanLoadResult r2 = parse_plan("x: " + std::string(100000, '['), "plan.yaml");
  INFO(dump(r2));
  REQUIRE(r2.findings.size() == 1);
  CHECK(r2.findings[0].message == "YAML nesting deeper than 64 levels; refusing it");

  expect_error("a: &x [1, *x]\n", 1, 11, "alias refers to an anchor that encloses it");
  // Aliases are followed without being expanded.
  const PlanLoadResult al = parse_plan(
      "format_version: 1\nworld_size: &w 2\nmodule: sequence\ntables:\n"
      "  - {name: t0, num_embeddings: *w, embedding_dim: 4, features: [f0]}\n",
      "p.yaml");
  INFO(dump(al));
  REQUIRE(al.ok());
  CHECK(al.plan->tables[0].num_embeddings == 2);

  // A flat mapping of many keys: fast (no quadratic duplicate search), findings capped.
  std::string flat = kValid;
  for (int i = 0; i < 50000; ++i) flat += "k" + std::to_string(i) + ": 1\n";
  flat += "k7: 2\n";
  const PlanLoadResult fr = parse_plan(flat, "plan.yaml");
  REQUIRE(fr.findings.size() == 1001);
  CHECK(fr.findings[0].str().find("plan.yaml:13:1: error: k0: unknown key 'k0'") == 0);
  CHECK(fr.findings[1000].str() ==
        "plan.yaml: note: 49001 more findings not shown (at most 1000 are reported)");

  const std::string huge(17u << 20, '#');
  expect_error(huge, 1, 1, "plans larger than 16 MiB are refused");
}

TEST_CASE("load_plan_file: unreadable paths throw Error") {
  CHECK_THROWS_AS(load_plan_file("/nonexistent/plan.yaml"), Error);
  CHECK_THROWS_WITH_AS(load_plan_file(DYNEMB_SOURCE_DIR "/plans"),
                       doctest::Contains("it is a directory"), Error);
}

TEST_CASE("every shipped plan validates clean") {
  struct Expect {
    const char* file;
    int64_t world_size;
    ModuleKind module;
    size_t num_features;
    int64_t dim;  // sequence: the common D; pooled: sum_D
    int warnings, notes;
  };
  const Expect expect[] = {
      {"unit-seq-w2.yaml", 2, ModuleKind::sequence, 4, 128, 0, 0},
      {"unit-seq-w8.yaml", 8, ModuleKind::sequence, 4, 128, 0, 0},
      {"unit-pooled-w8.yaml", 8, ModuleKind::pooled, 4, 512, 0, 0},
      {"odd-dims.yaml", 2, ModuleKind::sequence, 4, 129, 0, 0},
      {"odd-dims-d15.yaml", 2, ModuleKind::sequence, 4, 15, 0, 0},
      {"ec-bench-criteo.yaml", 8, ModuleKind::sequence, 26, 128, 1, 0},
      {"hstu-e2e.yaml", 16, ModuleKind::sequence, 1, 128, 0, 0},
      {"mixed-dist-types.yaml", 4, ModuleKind::sequence, 5, 64, 0, 1},
      {"pooled-mean-mixed-dims.yaml", 4, ModuleKind::pooled, 4, 72, 0, 0},
  };
  size_t shipped = 0;
  for (const auto& e : std::filesystem::directory_iterator(DYNEMB_SOURCE_DIR "/plans"))
    shipped += e.path().extension() == ".yaml";
  CHECK(shipped == std::size(expect));  // a new plan needs a line here

  for (const Expect& x : expect) {
    const PlanLoadResult r = load_plan_file(std::string(DYNEMB_SOURCE_DIR "/plans/") + x.file);
    INFO(x.file, "\n", dump(r));
    REQUIRE(r.ok());
    CHECK(count(r, Severity::warning) == x.warnings);
    CHECK(count(r, Severity::note) == x.notes);
    const Plan& p = *r.plan;
    CHECK(p.world_size == x.world_size);
    CHECK(p.module == x.module);
    CHECK(p.features.size() == x.num_features);
    CHECK(p.sum_dim == x.dim);
    CHECK(p.data_type() == DType::f32);
  }
  // The unit presets have a num_embeddings that W does not divide (an uneven last shard).
  const Plan w8 = *load_plan_file(DYNEMB_SOURCE_DIR "/plans/unit-seq-w8.yaml").plan;
  CHECK(shard_rows_per_rank(w8.tables[3], 8) == std::vector<int64_t>{3, 3, 3, 3, 3, 2, 0, 0});
  const Plan criteo = *load_plan_file(DYNEMB_SOURCE_DIR "/plans/ec-bench-criteo.yaml").plan;
  CHECK(criteo.tables.size() == 1);
  CHECK(criteo.features[25].name == "cat_25");
  CHECK(criteo.features[25].block_size == 22243035);
  const Plan hstu = *load_plan_file(DYNEMB_SOURCE_DIR "/plans/hstu-e2e.yaml").plan;
  CHECK(hstu.features[0].dist_type == DistType::hash_roundrobin);
}
