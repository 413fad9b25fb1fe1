// --tolerance parsing, ulp distance, NaN-aware acceptance, the default per plan, and the
// element diff (counts, first mismatches with coordinates, max abs / rel error).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "common/error.hpp"
#include "engine/tolerance.hpp"
#include "replay/diff.hpp"

using namespace dynemb;

namespace {
float next_up(float x) {
  return std::nextafter(x, std::numeric_limits<float>::infinity());
}
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

Plan plan_of(ModuleKind m, int64_t W, DType data, DType comm) {
  Plan p;
  p.world_size = W;
  p.module = m;
  p.comm_precision = comm;
  TableConfig t;
  t.name = "t0";
  t.num_embeddings = 10;
  t.embedding_dim = 2;
  t.data_type = data;
  t.features = {"f0"};
  p.tables.push_back(t);
  p.finalize();
  return p;
}
}  // namespace

TEST_CASE("parse_tolerance accepts the three forms and prints them back") {
  CHECK(parse_tolerance("exact").kind == Tolerance::Kind::exact);
  CHECK(parse_tolerance("exact").str() == "exact");
  const Tolerance u = parse_tolerance("ulp:2");
  CHECK(u.kind == Tolerance::Kind::ulp);
  CHECK(u.ulps == 2);
  CHECK(u.str() == "ulp:2");
  const Tolerance r = parse_tolerance("rtol:1e-3,atol:0.5");
  CHECK(r.kind == Tolerance::Kind::rel);
  CHECK(r.rtol == doctest::Approx(1e-3));
  CHECK(r.atol == 0.5);
  CHECK(parse_tolerance(r.str()).rtol == r.rtol);
  CHECK(parse_tolerance("ulp:0").ulps == 0);
}

TEST_CASE("parse_tolerance rejects bad text with a UsageError naming it") {
  for (const char* bad : {"", "EXACT", "ulp:", "ulp:-1", "ulp:1.5", "ulp:x", "ulp:99999999999",
                          "rtol:1", "rtol:1,", "rtol:1,atol:", "rtol:-1,atol:0", "rtol:nan,atol:0",
                          "rtol:1,atol:inf", "rtol:1x,atol:0", "atol:1,rtol:1", "ulp2"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_tolerance(bad), doctest::Contains("--tolerance"), UsageError);
  }
}

TEST_CASE("ulp_distance counts representable floats between two values") {
  CHECK(ulp_distance(1.0f, 1.0f) == 0);
  CHECK(ulp_distance(1.0f, next_up(1.0f)) == 1);
  CHECK(ulp_distance(next_up(next_up(1.0f)), 1.0f) == 2);
  CHECK(ulp_distance(0.0f, -0.0f) == 0);
  const float tiny = std::numeric_limits<float>::denorm_min();
  CHECK(ulp_distance(-tiny, tiny) == 2);  // across zero: -tiny, 0, +tiny
  CHECK(ulp_distance(std::numeric_limits<float>::max(), kInf) == 1);
  // 1.0 is 0x3f800000: that many steps from +0, and twice that to -1.0.
  CHECK(ulp_distance(1.0f, -1.0f) == 2 * int64_t{0x3f800000});
}

TEST_CASE("exact, ulp and rtol acceptance; NaN equals only NaN") {
  const Tolerance ex = Tolerance::exact(), u1 = Tolerance::ulp(1), rel = Tolerance::rel(1e-3, 0.0),
                  abs = Tolerance::rel(0.0, 0.5);
  CHECK(ex.accepts(1.0f, 1.0f));
  CHECK(ex.accepts(0.0f, -0.0f));
  CHECK_FALSE(ex.accepts(next_up(1.0f), 1.0f));  // one ulp is caught in exact mode
  CHECK(u1.accepts(next_up(1.0f), 1.0f));
  CHECK_FALSE(u1.accepts(next_up(next_up(1.0f)), 1.0f));
  CHECK(rel.accepts(1025.0f, 1024.0f));  // 1 <= 1e-3 * 1024
  CHECK_FALSE(rel.accepts(1026.0f, 1024.0f));
  CHECK(abs.accepts(0.5f, 0.0f));
  CHECK_FALSE(abs.accepts(0.5625f, 0.0f));
  for (const Tolerance& t : {ex, u1, rel, abs, Tolerance::rel(1e9, 1e9)}) {
    CAPTURE(t.str());
    CHECK(t.accepts(kNaN, kNaN));
    CHECK(t.accepts(-kNaN, kNaN));
    CHECK_FALSE(t.accepts(kNaN, 1.0f));
    CHECK_FALSE(t.accepts(1.0f, kNaN));
    CHECK(t.accepts(kInf, kInf));
    CHECK_FALSE(t.accepts(-kInf, kInf));
    CHECK_FALSE(t.accepts(std::numeric_limits<float>::max(), kInf));  // 1 ulp, still not inf
  }
}

TEST_CASE("default tolerance: exact where the semantics are exact") {
  CHECK(default_tolerance(plan_of(ModuleKind::sequence, 2, DType::f32, DType::f32)).str() ==
        "exact");
  CHECK(default_tolerance(plan_of(ModuleKind::pooled, 8, DType::f32, DType::f32)).str() == "exact");
  // Sequence without a codec only moves data: exact even for bf16 tables.
  CHECK(default_tolerance(plan_of(ModuleKind::sequence, 2, DType::bf16, DType::f32)).str() ==
        "exact");
  const Tolerance seq16 =
      default_tolerance(plan_of(ModuleKind::sequence, 4, DType::f32, DType::f16));
  CHECK(seq16.kind == Tolerance::Kind::rel);
  CHECK(seq16.rtol == std::ldexp(1.0, -10));
  const Tolerance pool16 =
      default_tolerance(plan_of(ModuleKind::pooled, 8, DType::f32, DType::f16));
  CHECK(pool16.rtol == 8 * std::ldexp(1.0, -10));
  CHECK(pool16.atol == 8 * std::ldexp(1.0, -10));
  CHECK(pool16.str() == "rtol:0.0078125,atol:0.0078125");  // the example --help gives
  const Tolerance poolbf =
      default_tolerance(plan_of(ModuleKind::pooled, 2, DType::bf16, DType::f16));
  CHECK(poolbf.rtol == 2 * std::ldexp(1.0, -7));
  CHECK(std::string(default_tolerance_help()).find("rtol:0.0078125,atol:0.0078125") !=
        std::string::npos);
}

TEST_CASE("diff_tensors counts all mismatches, keeps the first N with coordinates") {
  EmbTensor want = EmbTensor::zeros(DType::f32, {3, 2});
  want.data = {1.0f, 2.0f, kNaN, 4.0f, 5.0f, -8.0f};
  EmbTensor got = want;
  got.data[1] = next_up(2.0f);  // 1 ulp
  got.data[2] = kNaN;           // NaN == NaN at the same place
  got.data[3] = kNaN;           // NaN vs number
  got.data[5] = -6.0f;          // abs 2, rel 0.25
  const TensorLayout layout = TensorLayout::matrix("t", 2);

  const TensorDiff d = diff_tensors(got, want, Tolerance::exact(), layout, 2);
  CHECK(d.shape_ok);
  CHECK(d.compared == 6);
  CHECK(d.mismatches == 3);
  REQUIRE(d.first.size() == 2);
  CHECK(d.first[0].flat == 1);
  CHECK(to_string(d.first[0].where) == "index 1, row 0, col 1");
  CHECK(d.first[1].flat == 3);
  CHECK(std::isnan(d.first[1].got));
  CHECK(d.max_abs_err == 2.0);
  CHECK(d.max_rel_err == 0.25);
  CHECK(d.max_ulp == ulp_distance(-6.0f, -8.0f));

  const TensorDiff u = diff_tensors(got, want, Tolerance::ulp(1), layout, 10);
  CHECK(u.mismatches == 2);  // the 1-ulp element passes, NaN-vs-4 and -6-vs-8 do not
  CHECK(u.first[0].flat == 3);
  CHECK(u.first[1].flat == 5);

  EmbTensor other = EmbTensor::zeros(DType::f32, {2, 3});
  const TensorDiff s = diff_tensors(other, want, Tolerance::exact(), layout, 10);
  CHECK_FALSE(s.shape_ok);
  CHECK(s.shape_note == "shape [2, 3] vs [3, 2]");
  CHECK_FALSE(s.ok());
}
