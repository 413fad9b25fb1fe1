// Capture format v1: write -> read round trips for every dataset kind and dtype, the writer's
// temp-file behaviour, and the layout details of capture-format.md (chunking, bf16 attribute).
#include <doctest/doctest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "capture/capture.hpp"
#include "common/hash.hpp"
#include "synth/synth.hpp"
#include "test_capture_util.hpp"
#include "test_engine_util.hpp"

using namespace dynemb;
using namespace dynemb::testcap;

namespace {

void check_same_tensor(const std::optional<EmbTensor>& a, const std::optional<EmbTensor>& b) {
  REQUIRE(a.has_value() == b.has_value());
  if (!a) return;
  CHECK(a->dtype == b->dtype);
  CHECK(a->shape == b->shape);
  REQUIRE(a->data.size() == b->data.size());
  for (size_t i = 0; i < a->data.size(); ++i) REQUIRE(f32_bits(a->data[i]) == f32_bits(b->data[i]));
}

void check_same_batch(const Batch& a, const Batch& b) {
  CHECK(a.index == b.index);
  REQUIRE(a.ranks.size() == b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    CAPTURE(r);
    const Kjt &x = a.ranks[r].kjt, &y = b.ranks[r].kjt;
    CHECK(x.num_features == y.num_features);
    CHECK(x.lengths == y.lengths);
    CHECK(x.values == y.values);
    CHECK(x.weighted == y.weighted);
    CHECK(x.weights == y.weights);
    CHECK(x.stride_per_feature == y.stride_per_feature);
    CHECK(x.lengths_type == y.lengths_type);
    CHECK(x.values_type == y.values_type);
    REQUIRE(a.ranks[r].ctx.has_value() == b.ranks[r].ctx.has_value());
    if (a.ranks[r].ctx) test::check_same_context(*a.ranks[r].ctx, *b.ranks[r].ctx);
    check_same_tensor(a.ranks[r].local_embs, b.ranks[r].local_embs);
    check_same_tensor(a.ranks[r].output, b.ranks[r].output);
  }
}

void roundtrip(const Plan& plan, const std::vector<Batch>& batches, std::optional<uint64_t> seed,
               const WriterOptions& wopt = {}) {
  TempDir dir;
  const std::string path = dir.file("rt.h5");
  {
    CaptureWriter w(path, plan, seed, wopt);
    for (const Batch& b : batches) w.write_batch(b);
    w.commit();
  }
  CaptureReader rd(path);
  CHECK(rd.world_size() == plan.world_size);
  CHECK(rd.num_batches() == static_cast<int64_t>(batches.size()));
  CHECK(rd.plan_text() == plan.source_text);
  CHECK(rd.oracle_seed() == seed);
  for (const Batch& b : batches) check_same_batch(b, rd.read_batch(plan, b.index));
}

}  // namespace

TEST_CASE("round trip: sequence, int64 and int32 ids/lengths, every ctx field, fp32/fp16/bf16") {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (IndexType it : {IndexType::i64, IndexType::i32}) {
      CAPTURE(to_string(dt));
      CAPTURE(to_string(it));
      Plan plan = make_plan(ModuleKind::sequence, 3, {{"t0", 10, 4, dt}, {"t1", 7, 4, dt}});
      std::vector<Batch> batches;
      for (int64_t k = 0; k < 2; ++k) {
        // unequal batch per rank (B = 3, 2, 0) and one VBE rank in batch 1
        batches.push_back(make_batch(plan, k, {3, 2, 0}, /*vbe_rank=*/k == 1 ? 0 : -1, it,
                                     /*weighted=*/false, /*seed=*/11 + k));
      }
      roundtrip(plan, batches, 42);
    }
  }
}

TEST_CASE("round trip: pooled, weighted, VBE 1-D tensors, codec output float32") {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(to_string(dt));
    Plan plan = make_plan(ModuleKind::pooled, 2, {{"a", 9, 3, dt}, {"b", 5, 2, dt}},
                          /*comm=*/dt == DType::f32 ? DType::f32 : DType::bf16);
    std::vector<Batch> batches;
    batches.push_back(make_batch(plan, 0, {4, 3}, -1, IndexType::i64, true, 5));
    batches.push_back(make_batch(plan, 1, {4, 3}, 1, IndexType::i64, true, 6));  // VBE rank 1
    roundtrip(plan, batches, std::nullopt);
  }
}

TEST_CASE("round trip: variable-length strings (h5py style) and uint64 seed above 2^63") {
  Plan plan = make_plan(ModuleKind::sequence, 2, {{"t0", 10, 2, DType::f32}});
  WriterOptions o;
  o.fixed_length_strings = false;
  roundtrip(plan, {make_batch(plan, 0, {2, 2}, -1, IndexType::i64, false, 1)},
            0xfedcba9876543210ULL, o);
}

TEST_CASE("round trip: /tables/<name>/weight in fp32, fp16 and bf16") {
  TempDir dir;
  const std::string path = dir.file("w.h5");
  Plan plan =
      make_plan(ModuleKind::pooled, 2,
                {{"a", 5, 3, DType::f32}, {"b", 4, 2, DType::f16}, {"c", 3, 2, DType::bf16}});
  std::vector<std::vector<float>> w;
  for (const TableConfig& t : plan.tables) {
    std::vector<float> v(static_cast<size_t>(t.num_embeddings * t.embedding_dim));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(static_cast<int>(i * 37 % 256) - 128) / 64.0f;
    w.push_back(v);
  }
  {
    CaptureWriter wr(path, plan, std::nullopt);
    for (size_t t = 0; t < plan.tables.size(); ++t)
      wr.write_table_weight(plan.tables[t].name, plan.tables[t].data_type,
                            plan.tables[t].num_embeddings, plan.tables[t].embedding_dim, w[t]);
    wr.write_batch(make_batch(plan, 0, {1, 1}, -1, IndexType::i64, false, 3));
    wr.commit();
  }
  CaptureReader rd(path);
  CHECK(rd.weight_tables() == std::vector<std::string>{"a", "b", "c"});
  for (size_t t = 0; t < plan.tables.size(); ++t)
    CHECK(rd.read_table_weight(plan.tables[t]) == w[t]);
  // Weights win over the (absent) oracle: a DenseSource serves table b's row 2.
  auto src = open_embedding_source(rd, plan);
  REQUIRE(src);
  float row[2];
  src->row(1, 2, row, 2);
  CHECK(row[0] == w[1][4]);
  CHECK(row[1] == w[1][5]);
}

TEST_CASE("open_embedding_source: oracle only, nothing, weights without oracle for every table") {
  TempDir dir;
  Plan plan = make_plan(ModuleKind::sequence, 2, {{"t0", 10, 2, DType::f32}});
  const std::string a = dir.file("a.h5"), b = dir.file("b.h5");
  {
    CaptureWriter w(a, plan, 99);
    w.write_batch(make_batch(plan, 0, {1, 1}, -1, IndexType::i64, false, 3));
    w.commit();
  }
  {
    CaptureWriter w(b, plan, std::nullopt);
    w.write_batch(make_batch(plan, 0, {1, 1}, -1, IndexType::i64, false, 3));
    w.commit();
  }
  CaptureReader ra(a), rb(b);
  auto src = open_embedding_source(ra, plan);
  REQUIRE(src);
  CHECK(src->oracle_seed() == std::optional<uint64_t>(99));
  float v[2];
  src->row(0, 7, v, 2);
  CHECK(v[1] == oracle_value(oracle_table_seed(99, 0), 7, 1));
  CHECK(open_embedding_source(rb, plan) == nullptr);
}

TEST_CASE("writer: temp name while writing, renamed on commit, removed without commit") {
  TempDir dir;
  const std::string path = dir.file("c.h5");
  Plan plan = make_plan(ModuleKind::sequence, 2, {{"t0", 10, 2, DType::f32}});
  std::string temp;
  {
    CaptureWriter w(path, plan, 1);
    temp = w.temp_path();
    CHECK(temp.rfind(path + ".tmp-" + std::to_string(::getpid()) + "-", 0) == 0);
    CHECK(file_exists(temp));
    CHECK_FALSE(file_exists(path));
    w.write_batch(make_batch(plan, 0, {2, 2}, -1, IndexType::i64, false, 1));
  }  // no commit: an abandoned capture never appears under the target name
  CHECK_FALSE(file_exists(temp));
  CHECK_FALSE(file_exists(path));
  {
    CaptureWriter w(path, plan, 1);
    w.write_batch(make_batch(plan, 0, {2, 2}, -1, IndexType::i64, false, 1));
    w.commit();
  }
  CHECK(file_exists(path));
  CHECK_FALSE(file_exists(temp));
  // Out-of-order batches are refused.
  CaptureWriter w(dir.file("d.h5"), plan, 1);
  CHECK_THROWS_AS(w.write_batch(make_batch(plan, 3, {2, 2}, -1, IndexType::i64, false, 1)),
                  CaptureError);
}

TEST_CASE("writer: large datasets chunked <= 1 MiB with shuffle + deflate; bf16 attribute") {
  TempDir dir;
  const std::string path = dir.file("big.h5");
  Plan plan = make_plan(ModuleKind::sequence, 1, {{"t0", 100000, 300, DType::bf16}});
  Batch b = make_batch(plan, 0, {1}, -1, IndexType::i64, false, 2);
  // A local_embs of 4000 x 300 bf16 = 2.4 MB: must be split into several chunks.
  b.ranks[0].kjt.lengths = {4000};
  b.ranks[0].kjt.values.assign(4000, 5);
  b.ranks[0].ctx.reset();
  b.ranks[0].local_embs = EmbTensor::zeros(DType::bf16, {4000, 300});
  b.ranks[0].output = EmbTensor::zeros(DType::f32, {4000, 300});
  {
    CaptureWriter w(path, plan, 0);
    w.write_batch(b);
    w.commit();
  }
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  for (const char* name : {"/batches/0/rank0/local_embs", "/batches/0/rank0/output"}) {
    CAPTURE(name);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t dcpl = H5Dget_create_plist(d);
    REQUIRE(H5Pget_layout(dcpl) == H5D_CHUNKED);
    hsize_t chunk[2];
    REQUIRE(H5Pget_chunk(dcpl, 2, chunk) == 2);
    hid_t t = H5Dget_type(d);
    CHECK(chunk[0] * chunk[1] * H5Tget_size(t) <= (1u << 20));
    CHECK(chunk[1] == 300);
    CHECK(H5Pget_nfilters(dcpl) == 2);
    unsigned flags;
    size_t nelmts = 0;
    char fname[64];
    unsigned filter_config;
    CHECK(H5Pget_filter2(dcpl, 0, &flags, &nelmts, nullptr, sizeof fname, fname, &filter_config) ==
          H5Z_FILTER_SHUFFLE);
    nelmts = 0;
    CHECK(H5Pget_filter2(dcpl, 1, &flags, &nelmts, nullptr, sizeof fname, fname, &filter_config) ==
          H5Z_FILTER_DEFLATE);
    H5Tclose(t);
    H5Pclose(dcpl);
    H5Dclose(d);
  }
  // bf16 is uint16 + dtype="bfloat16"
  hid_t d = H5Dopen2(f, "/batches/0/rank0/local_embs", H5P_DEFAULT);
  hid_t t = H5Dget_type(d);
  CHECK(H5Tget_class(t) == H5T_INTEGER);
  CHECK(H5Tget_size(t) == 2);
  CHECK(H5Tget_sign(t) == H5T_SGN_NONE);
  CHECK(H5Aexists(d, "dtype") > 0);
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(f);
}

TEST_CASE("synth -> read: engine-filled parts pass every reader check, and are deterministic") {
  TempDir dir;
  for (const char* preset : {"unit-seq-w2", "odd-dims-d15"}) {
    CAPTURE(preset);
    Plan plan = preset_plan(preset);
    SynthOptions o = preset_workload(preset);
    o.batches = 2;
    o.seed = 5;
    const std::string a = dir.file(std::string(preset) + "a.h5");
    const std::string b = dir.file(std::string(preset) + "b.h5");
    synth_capture(plan, o, a);
    synth_capture(plan, o, b);
    check_capture(a);
    CaptureReader ra(a), rb(b);
    CHECK(capture_plan(ra).num_features() == 4);
    for (int64_t k = 0; k < 2; ++k)
      check_same_batch(ra.read_batch(plan, k), rb.read_batch(plan, k));
    // The stored sequence output is exactly the oracle row of each id.
    const Batch batch = ra.read_batch(plan, 1);
    const Kjt& kjt = batch.ranks[1].kjt;
    const EmbTensor& out = *batch.ranks[1].output;
    int64_t i = 0;
    for (int64_t f = 0; f < 4; ++f)
      for (int64_t bb = 0; bb < 8; ++bb)
        for (int64_t p = 0; p < kjt.lengths[f * 8 + bb]; ++p, ++i) {
          const int t = plan.features[f].table;
          for (int64_t c = 0; c < out.cols(); ++c)
            REQUIRE(out.data[i * out.cols() + c] ==
                    oracle_value(oracle_table_seed(5, t), static_cast<uint64_t>(kjt.values[i]),
                                 static_cast<uint64_t>(c)));
        }
    CHECK(i == kjt.num_ids());
  }
}

TEST_CASE("writer: a rank at a time writes write_batch's file, and refuses calls out of order") {
  TempDir dir;
  Plan plan = preset_plan("pooled-mean-mixed-dims");
  SynthOptions o = preset_workload("pooled-mean-mixed-dims");
  o.batches = 2;
  o.vbe = true;
  o.store_module_output = true;
  const std::string src = dir.file("src.h5");
  synth_capture(plan, o, src);
  CaptureReader r(src);
  const std::vector<Batch> batches = {r.read_batch(plan, 0), r.read_batch(plan, 1)};
  const std::string whole = dir.file("whole.h5"), ranks = dir.file("ranks.h5");
  {
    CaptureWriter w(whole, plan, o.seed);
    for (const Batch& b : batches) w.write_batch(b);
    w.commit();
  }
  {
    CaptureWriter w(ranks, plan, o.seed);
    for (const Batch& b : batches) {
      w.begin_batch(b.index);
      for (int64_t k = 0; k < plan.world_size; ++k) {
        w.write_rank_inputs(k, b.ranks[k]);
        w.write_rank_outputs(k, b.ranks[k]);
      }
      w.end_batch();
    }
    w.commit();
  }
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(bytes(whole).size() > 0);
  CHECK(bytes(whole) == bytes(ranks));
  CaptureWriter w(dir.file("bad.h5"), plan, o.seed);
  CHECK_THROWS_AS(w.write_rank_inputs(0, batches[0].ranks[0]), CaptureError);  // no batch
  w.begin_batch(0);
  CHECK_THROWS_AS(w.write_rank_outputs(0, batches[0].ranks[0]), CaptureError);  // inputs first
  CHECK_THROWS_AS(w.write_rank_inputs(1, batches[0].ranks[1]), CaptureError);   // rank 0 first
  CHECK_THROWS_AS(w.end_batch(), CaptureError);                                 // ranks missing
  CHECK_THROWS_AS(w.commit(), CaptureError);
}

TEST_CASE("synth: options change the right things") {
  Plan plan = preset_plan("unit-seq-w2");
  SynthOptions o = preset_workload("unit-seq-w2");
  o.batch_sizes = {8, 5};
  o.hotness = {parse_hotness("3"), parse_hotness("0"), parse_hotness("1..2"),
               parse_hotness("zipf:1.2:9")};
  o.index_type = IndexType::i32;
  o.empty_rank = 1;
  auto k = synth_kjts(plan, o, 0);
  REQUIRE(k.size() == 2);
  CHECK(k[0].lengths.size() == 32);
  CHECK(k[1].lengths.size() == 20);  // unequal batch per rank: B_1 = 5
  for (int64_t b = 0; b < 8; ++b) {
    CHECK(k[0].lengths[b] == 3);      // fixed 3
    CHECK(k[0].lengths[8 + b] == 0);  // zero-length feature
    CHECK(k[0].lengths[16 + b] >= 1);
    CHECK(k[0].lengths[16 + b] <= 2);
    CHECK(k[0].lengths[24 + b] >= 1);
    CHECK(k[0].lengths[24 + b] <= 9);
  }
  CHECK(k[1].num_ids() == 0);  // empty rank
  CHECK(k[0].values_type == IndexType::i32);
  for (int64_t v : k[0].values) CHECK((v >= 0 && v < 2047));
  o.vbe = true;
  o.weighted = true;
  o.empty_rank.reset();
  auto v = synth_kjts(plan, o, 0);
  REQUIRE(v[1].stride_per_feature.size() == 4);
  for (int64_t s : v[1].stride_per_feature) CHECK((s >= 1 && s <= 5));
  CHECK(v[0].weights.size() == v[0].values.size());
  for (float w : v[0].weights) CHECK(w * 4 == static_cast<float>(static_cast<int>(w * 4)));
  // Same seed -> same KJTs; another seed -> different ids.
  CHECK(synth_kjts(plan, o, 0)[0].values == v[0].values);
  o.seed = 1;
  CHECK(synth_kjts(plan, o, 0)[0].values != v[0].values);
  // --oob-ids: only the chosen ids change; continuous ids go negative or past the table.
  {
    SynthOptions q = preset_workload("unit-seq-w2");
    const auto base = synth_kjts(plan, q, 0);
    q.oob_fraction = 0.5;
    const auto wild = synth_kjts(plan, q, 0);
    REQUIRE(wild[0].values.size() == base[0].values.size());
    int64_t changed = 0, i = 0;
    for (int64_t f = 0; f < 4; ++f)
      for (int64_t b = 0; b < 8; ++b)
        for (int64_t p = 0; p < base[0].lengths[f * 8 + b]; ++p, ++i) {
          const int64_t v = wild[0].values[i], n = plan.features[f].hash_size;
          if (v != base[0].values[i]) {
            ++changed;
            CHECK((v < 0 || v >= n));
            CHECK(v >= -1000);
            CHECK(v < 2 * n);
          }
        }
    CHECK(changed > i / 4);
    CHECK(changed < 3 * i / 4);
    q.oob_fraction = 1.5;
    CHECK_THROWS_AS(check_synth_options(plan, q), UsageError);
  }
  CHECK_THROWS_AS(parse_hotness("5..2"), UsageError);
  CHECK_THROWS_AS(parse_hotness("x"), UsageError);
  o.hotness = {parse_hotness("1"), parse_hotness("2")};
  CHECK_THROWS_AS(check_synth_options(plan, o), UsageError);
}
