// Property test: over seeded random plans and batches, the sharded path (input dist ->
// lookup -> output dist) equals the unsharded reference bit for bit (fp32, oracle, no codec),
// and within a derived bound with fp16/bf16 codecs or a low-precision TBE output dtype.
//
// Bound with a codec / low-precision dtype (u = unit roundoff: 2^-11 fp16, 2^-8 bf16):
//  * sequence: each element is rounded exactly once, so out == encode(ref) bit for bit and
//    |out - ref| <= u |ref|.
//  * pooled: out = fl(...fl(q(p_0) + q(p_1)) ... + q(p_{W-1})), p_d the fp32 partial sums.
//    W input roundings (codec encode or TBE output cast) and W-1 rounded adds give, to first
//    order, |out - ref| <= (2W - 1) u S <= 2 W u S with S = sum_i |w_i E_i| (/ |divisor| for
//    MEAN), the reference's own final rounding adds u S, fp32 reorderings and the MEAN division
//    add a few 2^-24 S, and fp16 subnormal rounding adds <= 2^-25 absolute per rounding:
//        |out - ref| <= (1.01 (2W + 1) u + 2^-18) S + 2W 2^-24.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "engine/ops.hpp"
#include "engine/reference.hpp"
#include "test_engine_util.hpp"

using namespace dynemb;
using namespace dynemb::test;

namespace {

struct AbsSource final : EmbeddingSource {
  const EmbeddingSource& inner;
  explicit AbsSource(const EmbeddingSource& s) : inner(s) {}
  void row(int t, uint64_t g, float* out, int64_t dim) const override {
    inner.row(t, g, out, dim);
    for (int64_t c = 0; c < dim; ++c) out[c] = std::fabs(out[c]);
  }
};

// Per output element of a pooled reference ([B, sum_D] or VBE [f][b][d]): its MEAN divisor
// (1 when the plan has no MEAN table).
std::vector<float> element_divisors(const Plan& p, const Kjt& k) {
  const std::vector<float> div = p.any_mean ? mean_divisors(p, k) : std::vector<float>{};
  auto d = [&](int64_t f, int64_t b) { return p.any_mean ? div[k.bag_begin(f) + b] : 1.0f; };
  std::vector<float> out;
  if (k.is_vbe()) {
    for (int64_t f = 0; f < k.num_features; ++f)
      for (int64_t b = 0; b < k.batch_size(f); ++b)
        for (int64_t c = 0; c < p.features[f].dim; ++c) out.push_back(d(f, b));
  } else {
    for (int64_t b = 0; b < k.stride(); ++b)
      for (int64_t f = 0; f < k.num_features; ++f)
        for (int64_t c = 0; c < p.features[f].dim; ++c) out.push_back(d(f, b));
  }
  return out;
}

}  // namespace

TEST_CASE("property: sharded == unsharded reference over 1000 random plans and batches") {
  std::mt19937_64 rng(20261202);
  auto be = make_cpu_backend(2);
  int seen_vbe = 0, seen_w1 = 0, seen_w8 = 0, seen_mean = 0, seen_unequal = 0, seen_rr = 0;
  for (int iter = 0; iter < 1000; ++iter) {
    Case c = random_case(rng);
    const Plan& p = c.plan;
    CAPTURE(iter);
    const uint64_t seed = rng();
    OracleSource oracle(seed, p);
    std::vector<EmbTensor> out = run_sharded(p, c.kjts, oracle, *be, iter);
    REQUIRE(out.size() == static_cast<size_t>(p.world_size));
    for (int r = 0; r < p.world_size; ++r) {
      CAPTURE(r);
      const EmbTensor ref = reference_output(p, r, c.kjts[r], oracle, iter);
      REQUIRE(bit_equal(out[r], ref));
    }
    seen_vbe += c.kjts[0].is_vbe();
    seen_w1 += p.world_size == 1;
    seen_w8 += p.world_size == 8;
    seen_mean += p.any_mean;
    seen_rr += p.features[0].dist_type != DistType::continuous;
    bool unequal = false;
    for (const Kjt& k : c.kjts) unequal = unequal || k.stride() != c.kjts[0].stride();
    seen_unequal += unequal;

    // Codecs and low-precision TBE output, with full-precision random dense weights.
    std::uniform_real_distribution<float> val(-2.0f, 2.0f);
    for (int variant = 0; variant < 3; ++variant) {
      Plan q = p;
      const DType lo = variant == 1 ? DType::bf16 : DType::f16;
      if (variant < 2)
        q.comm_precision = lo;
      else
        for (TableConfig& t : q.tables) t.data_type = lo;
      auto dense = formula_source(q, [&](int, int64_t, int64_t) { return val(rng); });
      // Roundrobin keys may be outside the dense table: fall back to the oracle for them.
      std::shared_ptr<const EmbeddingSource> src = dense;
      if (std::any_of(q.features.begin(), q.features.end(),
                      [](const FeatureInfo& f) { return f.dist_type != DistType::continuous; }))
        src = std::make_shared<OracleSource>(seed, q);  // exact in fp16/bf16
      std::vector<EmbTensor> o = run_sharded(q, c.kjts, *src, *be, iter);
      Plan q32 = q;  // reference in fp32 with no codec: the exact value to bound against
      q32.comm_precision = DType::f32;
      for (TableConfig& t : q32.tables) t.data_type = DType::f32;
      q32.finalize();
      const double u = lo == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
      const double W = static_cast<double>(q.world_size);
      for (int r = 0; r < q.world_size; ++r) {
        CAPTURE(r);
        CAPTURE(variant);
        const EmbTensor ref = reference_output(q32, r, c.kjts[r], *src, iter);
        REQUIRE(o[r].shape == ref.shape);
        if (q.module == ModuleKind::sequence) {
          // One rounding per element: exactly the encoded reference (TBE dtype variant:
          // the rows are already exact in the table dtype).
          for (size_t i = 0; i < ref.data.size(); ++i) {
            const float want = variant < 2 ? codec_encode(lo, ref.data[i]) : ref.data[i];
            REQUIRE(f32_bits(o[r].data[i]) == f32_bits(want));
            REQUIRE(std::fabs(o[r].data[i] - ref.data[i]) <=
                    u * std::fabs(ref.data[i]) + std::ldexp(1.0, -25));
          }
        } else {
          // S = sum |w_i E_i| per element (SUM pooling), divided by |divisor| for MEAN.
          Kjt ka = c.kjts[r];
          for (float& w : ka.weights) w = std::fabs(w);
          AbsSource abs_src(*src);
          Plan qsum = q32;
          for (TableConfig& t : qsum.tables) t.pooling = PoolingMode::sum;
          qsum.finalize();
          const EmbTensor S = reference_output(qsum, r, ka, abs_src, iter);
          const std::vector<float> div = element_divisors(q32, c.kjts[r]);
          for (size_t i = 0; i < ref.data.size(); ++i) {
            const double s = std::fabs(static_cast<double>(S.data[i]) / div[i]);
            const double bound = (1.01 * (2 * W + 1) * u + std::ldexp(1.0, -18)) * s +
                                 2 * W * std::ldexp(1.0, -24) / std::fabs(div[i]);
            REQUIRE(std::fabs(static_cast<double>(o[r].data[i]) - ref.data[i]) <= bound);
          }
        }
      }
    }
  }
  // The generator really covers the cases the acceptance lists.
  CHECK(seen_vbe > 100);
  CHECK(seen_w1 > 50);
  CHECK(seen_w8 > 50);
  CHECK(seen_mean > 100);
  CHECK(seen_unequal > 200);
  CHECK(seen_rr > 100);
}
