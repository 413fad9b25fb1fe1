// Coordinates of flat indices in the tensors' own terms, on the worked examples of
// docs/semantics.md (§3.4 inputs, §4.3 post-all-to-all KJT, §7.2 variable batch).
#include <doctest/doctest.h>

#include "replay/coords.hpp"

using namespace dynemb;

namespace {
// f0: hash 10, f1: hash 6, W=2 (§3.4); dims d0, d1.
Plan two_feature_plan(ModuleKind m, int64_t d0, int64_t d1) {
  Plan p;
  p.world_size = 2;
  p.module = m;
  TableConfig t0, t1;
  t0.name = "t0";
  t0.num_embeddings = 10;
  t0.embedding_dim = d0;
  t0.features = {"f0"};
  t1.name = "t1";
  t1.num_embeddings = 6;
  t1.embedding_dim = d1;
  t1.features = {"f1"};
  p.tables = {t0, t1};
  p.finalize();
  return p;
}

// Rank 0 of §3.4: f0 = [1,7],[5]; f1 = [],[4,0,2].
Kjt rank0_kjt() {
  Kjt k;
  k.num_features = 2;
  k.lengths = {2, 1, 0, 3};
  k.values = {1, 7, 5, 4, 0, 2};
  return k;
}
}  // namespace

TEST_CASE("KjtIndex locates ids by feature, sample and position") {
  const KjtIndex ix(rank0_kjt());
  CHECK(ix.offsets == std::vector<int64_t>{0, 2, 3, 3, 6});
  const IdPosition p1 = ix.locate(1);  // id 7: f0, sample 0, position 1
  CHECK(p1.feature == 0);
  CHECK(p1.sample == 0);
  CHECK(p1.position == 1);
  const IdPosition p4 = ix.locate(4);  // id 0: f1 sample 1 position 1 (f1 sample 0 is empty)
  CHECK(p4.feature == 1);
  CHECK(p4.sample == 1);
  CHECK(p4.position == 1);

  Kjt vbe;  // §7.2 rank 1: f0 = [0],[],[8] (B=3), f1 = [2,3] (B=1)
  vbe.num_features = 2;
  vbe.stride_per_feature = {3, 1};
  vbe.lengths = {1, 0, 1, 2};
  vbe.values = {0, 8, 2, 3};
  const KjtIndex vx(vbe);
  CHECK(vx.locate(1).feature == 0);
  CHECK(vx.locate(1).sample == 2);
  CHECK(vx.locate(3).feature == 1);
  CHECK(vx.locate(3).sample == 0);
  CHECK(vx.locate(3).position == 1);
}

TEST_CASE("sequence output [N_r, D]: feature, sample, position, column") {
  const Plan p = two_feature_plan(ModuleKind::sequence, 2, 2);
  const TensorLayout l = TensorLayout::sequence_output(p, rank0_kjt());
  // Element 9 = row 4 (id 0 of f1, sample 1, position 1), column 1.
  CHECK(to_string(l(9)) == "feature f1, sample 1, position 1, column 1");
  CHECK(l(9)[0].value == 1);
  CHECK(to_string(l(2)) == "feature f0, sample 0, position 1, column 0");
  CHECK(to_string(l(4)) == "feature f0, sample 1, position 0, column 0");
}

TEST_CASE("pooled output [B_r, sum_D]: sample, feature, column within the feature") {
  const Plan p = two_feature_plan(ModuleKind::pooled, 2, 3);
  const TensorLayout l = TensorLayout::pooled_output(p);
  CHECK(to_string(l(7)) == "sample 1, feature f1, column 0");  // row 1, column 2 of 5
  CHECK(to_string(l(1)) == "sample 0, feature f0, column 1");
  CHECK(to_string(l(9)) == "sample 1, feature f1, column 2");
}

TEST_CASE("pooled VBE output 1-D [f][b][d]: feature, sample, column") {
  const Plan p = two_feature_plan(ModuleKind::pooled, 2, 3);
  // §7.2 rank 1 output (9 elements): f0 B=3 (6), f1 B=1 (3).
  const TensorLayout l = TensorLayout::pooled_vbe_output(p, {3, 1});
  CHECK(to_string(l(5)) == "feature f0, sample 2, column 1");
  CHECK(to_string(l(7)) == "feature f1, sample 0, column 1");
  // A feature with no samples on this rank is skipped.
  const TensorLayout e = TensorLayout::pooled_vbe_output(p, {0, 2});
  CHECK(to_string(e(0)) == "feature f1, sample 0, column 0");
  CHECK(to_string(e(4)) == "feature f1, sample 1, column 1");
}

TEST_CASE("local_embs layouts: (feature, source rank, sample, position) and pooled rows") {
  const Plan seq = two_feature_plan(ModuleKind::sequence, 2, 2);
  // §4.3 rank 0 after recat: f0 = [1,0,0,2], f1 = [0,2,0,0], B = [2,2].
  const TensorLayout l = TensorLayout::sequence_local_embs(seq, {1, 0, 0, 2, 0, 2, 0, 0}, {2, 2});
  CHECK(to_string(l(0)) == "feature f0, source_rank 0, sample 0, position 0, column 0");
  CHECK(to_string(l(5)) == "feature f0, source_rank 1, sample 1, position 1, column 1");
  CHECK(to_string(l(6)) == "feature f1, source_rank 0, sample 1, position 0, column 0");

  const Plan pooled = two_feature_plan(ModuleKind::pooled, 2, 3);
  const TensorLayout pl = TensorLayout::pooled_local_embs(pooled, {2, 3});
  CHECK(to_string(pl(5 * 3 + 4)) == "source_rank 1, sample 1, feature f1, column 2");

  // §7.2 rank 0 local 1-D: [s0: f0 B=2, f1 B=1 | s1: f0 B=3, f1 B=1] = 4+3+6+3 = 16.
  const TensorLayout vl = TensorLayout::pooled_vbe_local_embs(pooled, {{2, 1}, {3, 1}});
  CHECK(to_string(vl(3)) == "source_rank 0, feature f0, sample 1, column 1");
  CHECK(to_string(vl(4)) == "source_rank 0, feature f1, sample 0, column 0");
  CHECK(to_string(vl(14)) == "source_rank 1, feature f1, sample 0, column 1");
}
