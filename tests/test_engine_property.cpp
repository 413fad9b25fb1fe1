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

#include <algorithm>
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

namespace {

// Uneven RW shards (input_dist inference) routed independently of the engine: the shard whose
// rows hold x (an empty shard holds none), else rank x % W with local x / W, x the unsigned id.
struct Routed {
  int64_t dest;
  uint64_t local;  // the unsigned local row
};
Routed route_by_shards(const TableConfig& t, int64_t W, int64_t id, IndexType vt) {
  const uint64_t x = vt == IndexType::i32 ? uint64_t(uint32_t(id)) : static_cast<uint64_t>(id);
  for (const ShardSpec& s : t.shards)
    if (s.rows > 0 && x >= uint64_t(s.row_offset) && x < uint64_t(s.row_offset + s.rows))
      return {s.rank, x - uint64_t(s.row_offset)};
  return {int64_t(x % uint64_t(W)), x / uint64_t(W)};
}

// The oracle, with row `zero_row[t]` of table t all zeros (the row an id reads when its shard
// is empty under bounds_check ignore).
struct ZeroRowSource final : EmbeddingSource {
  const EmbeddingSource& inner;
  std::vector<int64_t> zero_row;  // [T], -1: none
  ZeroRowSource(const EmbeddingSource& s, std::vector<int64_t> z)
      : inner(s), zero_row(std::move(z)) {}
  void row(int t, uint64_t g, float* out, int64_t dim) const override {
    if (zero_row[size_t(t)] >= 0 && g == uint64_t(zero_row[size_t(t)])) {
      std::fill(out, out + dim, 0.0f);
      return;
    }
    inner.row(t, g, out, dim);
  }
};

}  // namespace

TEST_CASE("property: uneven shards of an inference plan, sharded == unsharded over 500 cases") {
  std::mt19937_64 rng(20261206);
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto be = make_cpu_backend(2);
  int seen_uneven = 0, seen_empty_shard = 0, seen_past = 0, seen_pooled = 0, seen_i32 = 0;
  for (int iter = 0; iter < 500; ++iter) {
    CAPTURE(iter);
    Case c = random_case(rng);
    // Each continuous table (but some) split into random row ranges, empty ones included.
    Plan p = c.plan;
    p.input_dist = InputDist::inference;
    const int64_t W = p.world_size;
    for (TableConfig& t : p.tables) {
      if (t.dist_type != DistType::continuous || uni(0, 5) == 0) continue;
      std::vector<int64_t> cut{0, t.num_embeddings};
      for (int64_t r = 1; r < W; ++r) cut.push_back(uni(0, t.num_embeddings));
      std::sort(cut.begin(), cut.end());
      for (int64_t r = 0; r < W; ++r) {
        ShardSpec s;
        s.rank = r;
        s.row_offset = cut[size_t(r)];
        s.rows = cut[size_t(r) + 1] - cut[size_t(r)];
        t.shards.push_back(s);
        seen_empty_shard += s.rows == 0;
      }
    }
    p.finalize();
    for (const TableConfig& t : p.tables) seen_uneven += routes_by_shards(p, t);
    seen_pooled += p.module == ModuleKind::pooled;
    seen_i32 += c.kjts[0].values_type == IndexType::i32;

    // The expected unsharded result: each id of a table that routes by shards replaced by the
    // row it reads (its shard's first row when past its shard under ignore, the table's extra
    // zero row when that shard is empty), looked up under the even split of tables one row
    // longer; the bucketize must send each id where route_by_shards does.
    Plan q = p;
    q.input_dist = InputDist::training;
    std::vector<int64_t> zero_row(p.tables.size(), -1);
    for (size_t t = 0; t < q.tables.size(); ++t) {
      if (!routes_by_shards(p, p.tables[t])) continue;
      zero_row[t] = q.tables[t].num_embeddings++;
      q.tables[t].shards.clear();
    }
    q.finalize();
    std::vector<Kjt> mapped = c.kjts;
    const DerivedBatch d = derive_input_dist(p, ptrs(c.kjts));
    for (int64_t s = 0; s < W; ++s) {
      Kjt& k = mapped[size_t(s)];
      const BucketizedKjt& b = d.ranks[size_t(s)].bucketized;
      const std::vector<int64_t> ids_of = k.length_per_key();
      int64_t i = 0;
      for (int64_t f = 0; f < k.num_features; ++f) {
        const FeatureInfo& fi = p.features[size_t(f)];
        const TableConfig& t = p.tables[size_t(fi.table)];
        for (const int64_t e = i + ids_of[size_t(f)]; i < e; ++i) {
          if (!routes_by_shards(p, t)) continue;
          const Routed rt = route_by_shards(t, W, k.values[size_t(i)], k.values_type);
          REQUIRE(b.dest_rank[size_t(i)] == rt.dest);
          const int64_t local = b.new_values[size_t(b.unbucketize_permute[size_t(i)])];
          REQUIRE(local == index_store(rt.local, k.values_type));
          const ShardSpec& sh = t.shards[size_t(rt.dest)];
          if (rt.local < uint64_t(sh.rows)) {
            k.values[size_t(i)] = sh.row_offset + int64_t(rt.local);
            continue;
          }
          REQUIRE(p.bounds_check == BoundsCheck::ignore);
          k.values[size_t(i)] = sh.rows > 0 ? sh.row_offset : zero_row[size_t(fi.table)];
          seen_past += 1;
        }
      }
    }
    const uint64_t seed = rng();
    OracleSource oracle(seed, p);
    const ZeroRowSource src(oracle, zero_row);
    std::vector<EmbTensor> out = run_sharded(p, c.kjts, oracle, *be, iter);
    REQUIRE(out.size() == static_cast<size_t>(W));
    for (int r = 0; r < W; ++r) {
      CAPTURE(r);
      REQUIRE(bit_equal(out[size_t(r)], reference_output(q, r, mapped[size_t(r)], src, iter)));
      REQUIRE(bit_equal(out[size_t(r)], reference_output(p, r, c.kjts[size_t(r)], oracle, iter)));
    }
  }
  // The generator covers what the rule has to get right.
  CHECK(seen_uneven > 300);
  CHECK(seen_empty_shard > 100);
  CHECK(seen_past > 100);
  CHECK(seen_pooled > 100);
  CHECK(seen_i32 > 100);
}
