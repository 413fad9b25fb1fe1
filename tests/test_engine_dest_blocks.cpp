// Replay one destination rank at a time (engine/dest_blocks.hpp), against the whole batch's
// dist over random plans and batches.
#include <doctest/doctest.h>

#include <optional>
#include <random>

#include "engine/dest_blocks.hpp"
#include "engine/dist_checks.hpp"
#include "engine/ops.hpp"
#include "test_engine_util.hpp"

using namespace dynemb;
using namespace dynemb::test;

namespace {

bool uni_bit(std::mt19937_64& rng) {
  return std::uniform_int_distribution<int>(0, 1)(rng) == 1;
}

}  // namespace

// A replay one destination at a time (engine/dest_blocks.hpp) rests on three facts, checked
// here over random plans and batches, codecs included: the blocks of every destination cover
// each sender's local_embs exactly once; the block of (s, d) is the lookup of the bags source
// rank d sent to s (lookup_kjt_from), bit for bit; and d's output from its blocks alone is the
// whole dist's output of d, bit for bit; and for a pooled batch, so are rows [r0, r1) of them.
TEST_CASE("property: one destination's blocks give its output, over 500 random batches") {
  std::mt19937_64 rng(20261204);
  auto be = make_cpu_backend(2);
  int seen_unequal = 0, seen_vbe = 0, seen_codec = 0, seen_rows = 0;
  for (int iter = 0; iter < 500; ++iter) {
    Case c = random_case(rng);
    Plan& p = c.plan;
    if (uni_bit(rng)) p.comm_precision = uni_bit(rng) ? DType::f16 : DType::bf16;
    CAPTURE(iter);
    const OracleSource oracle(rng(), p);
    const std::vector<const Kjt*> kp = ptrs(c.kjts);
    const DerivedBatch der = derive_input_dist(p, kp);
    const std::vector<EmbTensor> local = derive_local_embs(p, der, oracle, *be, iter);
    const std::vector<EmbTensor> whole = run_sharded(p, c.kjts, oracle, *be, iter);
    const int64_t W = p.world_size;
    std::vector<const EmbTensor*> lp;
    std::vector<const ShardingContext*> cp;
    for (int64_t r = 0; r < W; ++r) {
      lp.push_back(&local[size_t(r)]);
      cp.push_back(&der.ranks[size_t(r)].ctx);
    }
    const bool pooled = p.module == ModuleKind::pooled, vbe = der.variable_batch;
    std::optional<SequenceDistCheck> seq;
    std::optional<PooledDistCheck> pchk;
    if (pooled)
      pchk = check_pooled_dist(p, vbe, lp, cp);
    else
      seq = check_sequence_dist(p, lp, cp);
    if (seq)  // the one-walk maker gives every destination's block as the per-destination one
      for (int64_t s = 0; s < W; ++s) {
        const std::optional<std::vector<DestBlock>> all =
            sequence_blocks(seq->senders[size_t(s)], p.seq_dim());
        REQUIRE(all);
        REQUIRE(int64_t(all->size()) == W);
        for (int64_t d = 0; d < W; ++d) {
          const std::optional<DestBlock> one =
              sequence_block(seq->senders[size_t(s)], d, p.seq_dim());
          REQUIRE(one);
          CHECK((*all)[size_t(d)].ranges == one->ranges);
          CHECK((*all)[size_t(d)].shape == one->shape);
          CHECK((*all)[size_t(d)].starts == one->starts);
        }
      }
    std::vector<std::vector<int>> covered(static_cast<size_t>(W));
    for (int64_t s = 0; s < W; ++s) covered[size_t(s)].assign(local[size_t(s)].data.size(), 0);
    for (int64_t d = 0; d < W; ++d) {
      CAPTURE(d);
      std::vector<EmbTensor> blocks;
      for (int64_t s = 0; s < W; ++s) {
        CAPTURE(s);
        std::optional<DestBlock> b = pooled
                                         ? pooled_block(*pchk, s, d, p.sum_dim, vbe)
                                         : sequence_block(seq->senders[size_t(s)], d, p.seq_dim());
        REQUIRE(b);  // derived contexts send in increasing row order
        {            // the piece's id count, without making it
          const LookupKjt& lk = der.ranks[size_t(s)].lookup_kjt;
          const LookupKjtIndex ix = lookup_kjt_index(lk);
          CHECK(lookup_kjt_from_ids(lk, ix, d, 0, INT64_MAX) ==
                int64_t(lookup_kjt_from(lk, ix, d, 0, INT64_MAX).values.size()));
          CHECK(lookup_kjt_from_ids(lk, ix, d, 1, 2) ==
                int64_t(lookup_kjt_from(lk, ix, d, 1, 2).values.size()));
        }
        const EmbTensor want =
            be->lookup(p, int(s), lookup_kjt_from(der.ranks[size_t(s)].lookup_kjt, d), oracle,
                       Place::host)
                .t;
        REQUIRE(want.shape == b->shape);
        EmbTensor got{local[size_t(s)].dtype, b->shape, std::vector<float>(size_t(b->numel()))};
        for (int64_t e = 0; e < b->numel(); ++e) {
          const int64_t at = b->to_whole(e);
          REQUIRE(at < int64_t(local[size_t(s)].data.size()));
          ++covered[size_t(s)][size_t(at)];
          got.data[size_t(e)] = local[size_t(s)].data[size_t(at)];
        }
        REQUIRE(bit_equal(got, want));
        blocks.push_back(std::move(got));
      }
      if (pooled && !vbe) {  // rows [r0, r1) of d alone: the same rows of its output
        const int64_t B = blocks[0].rows();
        const int64_t r0 = B ? int64_t(rng() % uint64_t(B)) : 0;
        const int64_t r1 = B ? r0 + 1 + int64_t(rng() % uint64_t(B - r0)) : 0;
        std::vector<EmbTensor> part;
        for (int64_t s = 0; s < W; ++s) {
          const DestBlock b = block_rows(pooled_block(*pchk, s, d, p.sum_dim, false), r0, r1);
          const EmbTensor want =
              be->lookup(p, int(s), lookup_kjt_from(der.ranks[size_t(s)].lookup_kjt, d, r0, r1),
                         oracle, Place::host)
                  .t;
          REQUIRE(want.shape == b.shape);
          EmbTensor got{want.dtype, b.shape, std::vector<float>(size_t(b.numel()))};
          for (int64_t e = 0; e < b.numel(); ++e)
            got.data[size_t(e)] = local[size_t(s)].data[size_t(b.to_whole(e))];
          REQUIRE(bit_equal(got, want));
          part.push_back(std::move(got));
        }
        const EmbTensor out = destination_output(p, *be, d, part, cp, vbe, Place::host).t;
        const int64_t C = p.sum_dim;
        const EmbTensor& w = whole[size_t(d)];
        REQUIRE(bit_equal(
            out,
            EmbTensor{w.dtype, {r1 - r0, C}, {w.data.begin() + r0 * C, w.data.begin() + r1 * C}}));
        ++seen_rows;
      }
      const EmbTensor out = destination_output(p, *be, d, blocks, cp, vbe, Place::host).t;
      REQUIRE(bit_equal(out, whole[size_t(d)]));
    }
    for (int64_t s = 0; s < W; ++s)
      for (int n : covered[size_t(s)]) REQUIRE(n == 1);
    bool unequal = false;
    for (const Kjt& k : c.kjts) unequal = unequal || k.stride() != c.kjts[0].stride();
    seen_unequal += unequal;
    seen_vbe += c.kjts[0].is_vbe();
    seen_codec += p.comm_precision != DType::f32;
  }
  CHECK(seen_unequal > 100);
  CHECK(seen_vbe > 50);
  CHECK(seen_codec > 100);
  CHECK(seen_rows > 500);
}
