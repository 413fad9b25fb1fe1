// The CPU backend that keeps (make_cpu_backend(threads, true)): what a step may keep
// (Place::kept, keep()) stays in the backend, one tensor per role and rank, as a device
// backend keeps it on its device; a kept tensor comes back as its dtype and shape alone; the
// comparator and the output dists read the kept tensor a TensorRef names. On the example of
// docs/semantics.md (W=2, t0 10x2 on f0, t1 6x2 on f1, E_t(g) = [100t + g, 100t + g + 0.5]).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "engine/reference.hpp"
#include "test_engine_util.hpp"

using namespace dynemb;
using namespace dynemb::test;
using V = std::vector<int64_t>;

namespace {

Plan example_plan(ModuleKind m) {
  return make_plan(2, m, {table("t0", 10, 2, {"f0"}), table("t1", 6, 2, {"f1"})});
}
std::vector<Kjt> example_kjts() {
  return {make_kjt(2, {2, 1, 0, 3}, {1, 7, 5, 4, 0, 2}), make_kjt(2, {1, 2, 1, 0}, {9, 0, 3, 5})};
}
std::shared_ptr<DenseSource> example_source(const Plan& p, float shift = 0.0f) {
  return formula_source(p, [shift](int t, int64_t g, int64_t c) {
    return static_cast<float>(100 * t + g) + (c ? 0.5f : 0.0f) + shift;
  });
}
const TileCompare kExact{Tolerance::exact(), 4, 10};

// The tensor a Kept names, as a step hands it on: dtype and shape, no data.
Tensor kept_as(const EmbTensor& like, Kept k) {
  return Tensor{EmbTensor{like.dtype, like.shape, {}}, k};
}

// Mismatching elements over the tiles of a comparison.
int64_t mismatches(const std::vector<TileDiff>& tiles) {
  int64_t n = 0;
  for (const TileDiff& t : tiles) n += t.stats.mismatches;
  return n;
}

// Runs the module's dist of `p` on `local` (host or kept), outputs at `place`, in rank order.
std::vector<Tensor> dist(const Plan& p, Backend& be, const std::vector<TensorRef>& local,
                         const DerivedBatch& d, Place place) {
  std::vector<const ShardingContext*> cp;
  for (const DerivedRank& r : d.ranks) cp.push_back(&r.ctx);
  std::vector<Tensor> out;
  const OutputSink sink = [&](int r, Tensor&& t) {
    CHECK(r == int(out.size()));
    out.push_back(std::move(t));
  };
  if (p.module == ModuleKind::sequence)
    RwSequenceEmbeddingDist(p).forward(be, local, cp, place, sink);
  else
    RwPooledEmbeddingDist(p).forward(be, 0, local, cp, place, sink);
  return out;
}

}  // namespace

TEST_CASE("keeping CPU backend: lookups kept per rank, shapes handed back, compared where kept") {
  const Plan p = example_plan(ModuleKind::sequence);
  const std::vector<Kjt> k = example_kjts();
  auto src = example_source(p);
  const DerivedBatch d = derive_input_dist(p, ptrs(k));
  auto keeping = make_cpu_backend(2, true);
  auto host = make_cpu_backend(2);
  const LookupKjt& l0 = d.ranks[0].lookup_kjt;
  const LookupKjt& l1 = d.ranks[1].lookup_kjt;

  // A backend that keeps nothing makes host tensors whatever is asked.
  const Tensor h0 = host->lookup(p, 0, l0, *src, Place::kept);
  CHECK_FALSE(h0.kept.has_value());
  CHECK(h0.t.shape == V{5, 2});
  CHECK(h0.t.data == std::vector<float>{1, 1.5, 0, 0.5, 3, 3.5, 100, 100.5, 102, 102.5});
  CHECK_FALSE(host->keep(h0.t, 0).has_value());
  // Asked for the host, the keeping one hands the tensor over too.
  const Tensor kh = keeping->lookup(p, 0, l0, *src, Place::host);
  CHECK_FALSE(kh.kept.has_value());
  CHECK(kh.t.data == h0.t.data);

  const Tensor k0 = keeping->lookup(p, 0, l0, *src, Place::kept);
  REQUIRE(k0.kept.has_value());
  CHECK(k0.kept->role == Kept::Role::lookup);
  CHECK(k0.kept->rank == 0);
  CHECK(k0.t.shape == V{5, 2});
  CHECK(k0.t.dtype == DType::f32);
  CHECK(k0.t.data.empty());
  CHECK(k0.numel() == 10);
  const TensorRef r0(k0);
  CHECK(r0.host == nullptr);
  CHECK(r0.n == 10);

  Comparator& cmp = keeping->comparator();
  // The kept tensor is the lookup: equal to the host one, to the lookup made again, and one
  // changed element of the host side is one mismatch, with the kept value reported as got.
  REQUIRE(cmp.compare(r0, h0.t, kExact).has_value());
  CHECK(cmp.compare(r0, h0.t, kExact)->empty());
  CHECK(cmp.compare_lookup(r0, p, 0, l0, *src, kExact)->empty());
  EmbTensor off = h0.t;
  off.data[6] = 99.0f;  // row 3 column 0: 100 kept
  const std::optional<std::vector<TileDiff>> one = cmp.compare(r0, off, kExact);
  REQUIRE(one.has_value());
  CHECK(mismatches(*one) == 1);
  REQUIRE(one->size() == 1);
  CHECK((*one)[0].begin == 4);
  REQUIRE((*one)[0].got.size() == 4);
  CHECK((*one)[0].got == std::vector<float>{3, 3.5, 100, 100.5});
  CHECK((*one)[0].want == std::vector<float>{3, 3.5, 99, 100.5});
  // Rank 1's lookup is kept beside rank 0's, not over it.
  const Tensor k1 = keeping->lookup(p, 1, l1, *src, Place::kept);
  REQUIRE(k1.kept.has_value());
  CHECK(k1.kept->rank == 1);
  CHECK(cmp.compare(k1, host->lookup(p, 1, l1, *src, Place::host).t, kExact)->empty());
  CHECK(cmp.compare(r0, h0.t, kExact)->empty());
  // Kept against kept: rank 0's and rank 1's lookups differ.
  CHECK(mismatches(*cmp.compare(r0, k1, kExact)) > 0);
  // A reference of another element count names nothing kept: nullopt, no read past the end.
  CHECK_FALSE(cmp.compare(TensorRef::span(off.data.data(), 8), r0, kExact).has_value());

  // The next lookup kept for rank 0 replaces the first: a source shifted by 1000 everywhere.
  auto shifted = example_source(p, 1000.0f);
  const Tensor k0b = keeping->lookup(p, 0, l0, *shifted, Place::kept);
  REQUIRE(k0b.kept.has_value());
  CHECK(mismatches(*cmp.compare(r0, h0.t, kExact)) == 10);
  CHECK(cmp.compare_lookup(r0, p, 0, l0, *shifted, kExact)->empty());

  // keep(): a host tensor kept as rank 0's input, beside its lookup, and compared with it.
  EmbTensor captured = h0.t;
  captured.data[1] = -7.0f;
  const std::optional<Kept> in0 = keeping->keep(captured, 0);
  REQUIRE(in0.has_value());
  CHECK(in0->role == Kept::Role::input);
  CHECK(in0->rank == 0);
  const Tensor i0 = kept_as(captured, *in0);
  CHECK(mismatches(*cmp.compare(i0, h0.t, kExact)) == 1);
  CHECK(mismatches(*cmp.compare_lookup(i0, p, 0, l0, *src, kExact)) == 1);
  CHECK(mismatches(*cmp.compare(i0, k0b, kExact)) == 10);  // the lookup kept is the shifted one
  // Not kept: a rank with no input kept names nothing.
  CHECK_FALSE(cmp.compare(kept_as(captured, Kept{Kept::Role::input, 1}), h0.t, kExact));
}

TEST_CASE("keeping CPU backend: the dists read kept inputs and keep their outputs per rank") {
  for (const ModuleKind m : {ModuleKind::sequence, ModuleKind::pooled}) {
    CAPTURE(to_string(m));
    const Plan p = example_plan(m);
    const std::vector<Kjt> k = example_kjts();
    auto src = example_source(p);
    const DerivedBatch d = derive_input_dist(p, ptrs(k));
    auto keeping = make_cpu_backend(2, true);
    auto host = make_cpu_backend(2);
    const std::vector<EmbTensor> whole = run_sharded(p, k, *src, *host);
    // The outputs of the example (test_engine_examples.cpp, §6.1 and §7.1).
    if (m == ModuleKind::sequence) {
      CHECK(whole[0].data ==
            std::vector<float>{1, 1.5, 7, 7.5, 5, 5.5, 104, 104.5, 100, 100.5, 102, 102.5});
      CHECK(whole[1].data == std::vector<float>{9, 9.5, 0, 0.5, 3, 3.5, 105, 105.5});
    } else {
      CHECK(whole[0].data == std::vector<float>{8, 9, 0, 0, 5, 5.5, 306, 307.5});
      CHECK(whole[1].data == std::vector<float>{9, 9.5, 105, 105.5, 3, 4, 0, 0});
    }

    // Kept lookups in, kept outputs out: each output is rank r's, its shape alone handed over,
    // and the comparator finds it equal to the host dist's output and to the reference.
    std::vector<Tensor> kept_local;
    for (int r = 0; r < 2; ++r)
      kept_local.push_back(keeping->lookup(p, r, d.ranks[size_t(r)].lookup_kjt, *src, Place::kept));
    const std::vector<TensorRef> refs(kept_local.begin(), kept_local.end());
    for (const TensorRef& r : refs) CHECK(r.host == nullptr);
    const std::vector<Tensor> out = dist(p, *keeping, refs, d, Place::kept);
    REQUIRE(out.size() == 2);
    Comparator& cmp = keeping->comparator();
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      const Tensor& o = out[size_t(r)];
      REQUIRE(o.kept.has_value());
      CHECK(o.kept->role == Kept::Role::output);
      CHECK(o.kept->rank == r);
      CHECK(o.t.data.empty());
      CHECK(o.t.shape == whole[size_t(r)].shape);
      CHECK(cmp.compare(o, whole[size_t(r)], kExact)->empty());
      CHECK(cmp.compare_reference(o, p, r, k[size_t(r)], *src, 0, kExact)->empty());
    }
    // Kept lookups in, host outputs out: the whole dist's outputs, bit for bit.
    const std::vector<Tensor> out_host = dist(p, *keeping, refs, d, Place::host);
    for (int r = 0; r < 2; ++r) {
      CHECK_FALSE(out_host[size_t(r)].kept.has_value());
      CHECK(bit_equal(out_host[size_t(r)].t, whole[size_t(r)]));
    }

    // The dist reads what is kept, not what the host holds: rank 0's input kept with 1000
    // added to every element, rank 1's from the host, gives what the host dist gives on the
    // same two tensors, and differs from the plain output.
    const std::vector<EmbTensor> local = derive_local_embs(p, d, *src, *host, 0);
    EmbTensor plus = local[0];
    for (float& x : plus.data) x += 1000.0f;
    const std::optional<Kept> in0 = keeping->keep(plus, 0);
    REQUIRE(in0.has_value());
    const Tensor i0{EmbTensor{plus.dtype, plus.shape, {}}, *in0};
    const std::vector<Tensor> mixed = dist(p, *keeping, {TensorRef(i0), local[1]}, d, Place::host);
    const std::vector<Tensor> want = dist(p, *host, {plus, local[1]}, d, Place::host);
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(bit_equal(mixed[size_t(r)].t, want[size_t(r)].t));
    }
    CHECK_FALSE(bit_equal(mixed[0].t, whole[0]));
    // Sequence: rank 0's output rows 0, 4 and 5 come from rank 0 (ids 1, 0, 2); pooled: every
    // element of rank 0's output sums one element of rank 0's chunk.
    if (m == ModuleKind::sequence)
      CHECK(mixed[0].t.data == std::vector<float>{1001, 1001.5, 7, 7.5, 5, 5.5, 104, 104.5, 1100,
                                                  1100.5, 1102, 1102.5});
    else
      CHECK(mixed[0].t.data ==
            std::vector<float>{1008, 1009, 1000, 1000, 1005, 1005.5, 1306, 1307.5});

    // A kept input that names nothing kept (rank 1 has no input kept) is an error, not a read.
    const Tensor missing{EmbTensor{local[1].dtype, local[1].shape, {}}, Kept{Kept::Role::input, 1}};
    CHECK_THROWS_WITH_AS(dist(p, *keeping, {local[0], TensorRef(missing)}, d, Place::host),
                         doctest::Contains("local_embs of rank 1 is kept"), Error);
  }
}
