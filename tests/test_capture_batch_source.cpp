// BatchSource (batch_source.hpp): a batch read whole, keeping going past a damaged rank with the
// troubles a replay records, read ahead on another thread, its shapes alone, rows of it.
#include "capture/batch_source.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <hdf5.h>

#include <filesystem>
#include <functional>

#include "test_capture_util.hpp"

using namespace dynemb;
using namespace dynemb::testcap;

namespace {

// A sequence capture, W = 3, every optional part and keys, 3 batches; in `folder` when given
// (a folder "rank7": a rank that the file's path, not the dataset's, names).
struct Fixture {
  TempDir dir;
  Plan plan =
      make_plan(ModuleKind::sequence, 3, {{"t0", 10, 4, DType::f32}, {"t1", 7, 4, DType::f32}});
  std::string path;
  explicit Fixture(const std::string& folder = "") {
    if (!folder.empty()) std::filesystem::create_directory(dir.file(folder));
    path = dir.file(folder.empty() ? "cap.h5" : folder + "/cap.h5");
    CaptureWriter w(path, plan, 3);
    for (int64_t k = 0; k < 3; ++k) {
      Batch b = make_batch(plan, k, {3, 4, 2}, -1, IndexType::i64, true, 40 + k);
      for (RankBatch& rb : b.ranks) rb.keys = std::vector<std::string>{"f_t0", "f_t1"};
      w.write_batch(b);
    }
    w.commit();
  }
  void mutate(const std::function<void(hid_t)>& fn) const {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(f >= 0);
    fn(f);
    REQUIRE(H5Fclose(f) >= 0);
  }
};

// Replaces the dataset at `p` by a float64 one of `dims`, zeros.
void replace(hid_t f, const std::string& p, std::vector<hsize_t> dims) {
  if (H5Lexists(f, p.c_str(), H5P_DEFAULT) > 0) REQUIRE(H5Ldelete(f, p.c_str(), H5P_DEFAULT) >= 0);
  hid_t sp = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t d = H5Dcreate2(f, p.c_str(), H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(d >= 0);
  hsize_t n = 1;
  for (hsize_t x : dims) n *= x;
  std::vector<double> buf(n, 0.0);
  if (n > 0)
    REQUIRE(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0);
  H5Dclose(d);
  H5Sclose(sp);
}

// Every field of a batch as text: equal texts, equal batches.
std::string dump(const std::optional<Batch>& b) {
  if (!b) return "nullopt";
  std::string s = fmt::format("batch {}\n", b->index);
  const auto ints = [](const auto& v) { return fmt::format("[{}]", fmt::join(v, ",")); };
  const auto tensor = [&](const std::optional<EmbTensor>& t) {
    if (!t) return std::string("-");
    return fmt::format("{} {} {}", int(t->dtype), ints(t->shape), ints(t->data));
  };
  for (const RankBatch& rb : b->ranks) {
    const Kjt& k = rb.kjt;
    s += fmt::format("kjt {} {} {} {} {} {} {}\n", ints(k.lengths), ints(k.values), ints(k.weights),
                     ints(k.stride_per_feature), k.mean_divisor.size(), int(k.lengths_type),
                     int(k.values_type));
    if (rb.ctx) {
      const ShardingContext& c = *rb.ctx;
      const auto opt = [&](const auto& o) { return o ? ints(*o) : std::string("-"); };
      s += fmt::format("ctx {} {} {} {} {} {} {}\n", opt(c.input_splits), opt(c.output_splits),
                       opt(c.batch_size_per_rank), opt(c.sparse_features_recat),
                       opt(c.unbucketize_permute), opt(c.lengths_after_input_dist),
                       c.lengths_after_input_dist_cols);
    } else {
      s += "ctx -\n";
    }
    s += "local " + tensor(rb.local_embs) + "\noutput " + tensor(rb.output) + "\nmodule " +
         tensor(rb.module_output) + "\n";
    s +=
        "keys " + (rb.keys ? fmt::format("{}", fmt::join(*rb.keys, ",")) : std::string("-")) + "\n";
  }
  return s;
}

std::string dump(const std::vector<ReadTrouble>& ts) {
  std::string s;
  for (const ReadTrouble& t : ts)
    s += fmt::format("{} {} {} {}\n", t.batch, t.rank, t.stage, t.message);
  return s;
}

// The replay's reading before BatchSource (replay_trouble.cpp, read_batch_keeping_going with
// record_trouble's rank_in): the reference for the troubles' messages and order.
int old_rank_in(const std::string& text) {
  const size_t at = text.find("/rank");
  if (at == std::string::npos) return -1;
  size_t i = at + 5, n = 0;
  int r = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9' && n < 9) {
    r = r * 10 + (text[i] - '0');
    ++i;
    ++n;
  }
  return n == 0 ? -1 : r;
}

BatchRead old_read(const CaptureReader& reader, const Plan& plan, int64_t k) {
  BatchRead out;
  const auto record = [&](int rank, const std::string& msg) {
    out.troubles.push_back({k, rank >= 0 ? rank : old_rank_in(msg), "capture", msg});
  };
  try {
    out.batch = reader.read_batch(plan, k);
    return out;
  } catch (const Error&) {
  }
  ReadParts kjt_only;
  kjt_only.ctx = kjt_only.local_embs = kjt_only.output = false;
  try {
    reader.read_batch(plan, k, kjt_only);
  } catch (const Error& e) {
    record(-1, e.what());
    return out;
  }
  const size_t W = size_t(plan.world_size);
  ReadParts good;
  good.ranks.assign(W, 1);
  for (size_t r = 0; r < W; ++r) {
    ReadParts one;
    one.ranks.assign(W, 0);
    one.ranks[r] = 1;
    try {
      reader.read_batch(plan, k, one);
      continue;
    } catch (const Error& e) {
      record(int(r), std::string(e.what()) +
                         " (this rank's ctx/, local_embs and output are left out of the replay)");
    }
    good.ranks[r] = 0;
  }
  try {
    out.batch = reader.read_batch(plan, k, good);
  } catch (const Error& e) {
    record(-1, e.what());
  }
  return out;
}

// What a batch source reads of batch k, with and without read-ahead, against the old path.
void expect_as_old(const Fixture& fx, int64_t k) {
  CaptureReader reader(fx.path);
  const BatchRead want = old_read(reader, fx.plan, k);
  BatchSource plain(reader, fx.plan, {0, false});
  const BatchRead got = plain.read(k);
  CHECK(dump(got.troubles) == dump(want.troubles));
  CHECK(dump(got.batch) == dump(want.batch));
  BatchSource ahead(reader, fx.plan, {1, false});
  ahead.read_ahead(k);
  const BatchRead got_ahead = ahead.read(k);
  CHECK(dump(got_ahead.troubles) == dump(want.troubles));
  CHECK(dump(got_ahead.batch) == dump(want.batch));
}

}  // namespace

TEST_CASE("rank_of_h5path: the rank a dataset path names") {
  CHECK(rank_of_h5path("/batches/3/rank1/ctx/input_splits") == 1);
  CHECK(rank_of_h5path("/batches/3/rank12") == 12);
  CHECK(rank_of_h5path("/batches/0/rank0/lengths") == 0);
  CHECK(rank_of_h5path("/batches/3") == -1);
  CHECK(rank_of_h5path("/") == -1);
  CHECK(rank_of_h5path("/batches/3/rankx/lengths") == -1);
  CHECK(rank_of_h5path("/batches/3/rank1x/lengths") == -1);
  CHECK(rank_of_h5path("/tables/rank1/weight") == -1);
  CHECK(rank_of_h5path("/batches//rank1") == -1);
}

TEST_CASE("a clean batch reads as read_batch does, with no trouble, ahead or not") {
  Fixture fx;
  CaptureReader reader(fx.path);
  for (int64_t k = 0; k < 3; ++k) {
    const std::string want = dump(reader.read_batch(fx.plan, k));
    BatchSource src(reader, fx.plan, {});
    const BatchRead got = src.read(k);
    CHECK(got.troubles.empty());
    CHECK(dump(got.batch) == want);
    CHECK(got.batch->ranks[1].keys.has_value());
  }
  // Each batch read ahead while the one before is taken; a read-ahead of another batch than
  // the one read next is dropped.
  BatchSource src(reader, fx.plan, {1, false});
  src.read_ahead(0);
  for (int64_t k = 0; k < 3; ++k) {
    const BatchRead got = src.read(k);
    if (k + 1 < 3) src.read_ahead(k + 1);
    CHECK(got.troubles.empty());
    CHECK(dump(got.batch) == dump(reader.read_batch(fx.plan, k)));
  }
  src.read_ahead(2);
  CHECK(dump(src.read(1).batch) == dump(reader.read_batch(fx.plan, 1)));
}

TEST_CASE("a rank whose ctx/ or local_embs cannot be read loses them: one trouble each, rank r") {
  Fixture fx;
  fx.mutate([](hid_t f) {
    replace(f, "/batches/1/rank0/ctx/input_splits", {3});  // float64, want int64
    replace(f, "/batches/1/rank2/local_embs", {1, 1});     // wrong shape and dtype
  });
  expect_as_old(fx, 1);
  CaptureReader reader(fx.path);
  BatchSource src(reader, fx.plan, {});
  const BatchRead got = src.read(1);
  REQUIRE(got.troubles.size() == 2);
  CHECK(got.troubles[0].rank == 0);
  CHECK(got.troubles[0].batch == 1);
  CHECK(got.troubles[0].stage == "capture");
  CHECK(got.troubles[0].message.rfind(fx.path + ":/batches/1/rank0/ctx/input_splits: ", 0) == 0);
  CHECK(got.troubles[1].rank == 2);
  CHECK(got.troubles[1].message.rfind(fx.path + ":/batches/1/rank2/local_embs: ", 0) == 0);
  CHECK(got.troubles[1].message.find("(this rank's ctx/, local_embs and output are left out of "
                                     "the replay)") != std::string::npos);
  REQUIRE(got.batch);
  // The damaged ranks keep their KJT alone; rank 1 is whole.
  const Batch whole = reader.read_batch(fx.plan, 0);
  for (int r : {0, 2}) {
    const RankBatch& rb = got.batch->ranks[size_t(r)];
    CHECK(!rb.ctx);
    CHECK(!rb.local_embs);
    CHECK(!rb.output);
    CHECK(!rb.keys);
    CHECK(!rb.kjt.values.empty());
  }
  const RankBatch& ok = got.batch->ranks[1];
  CHECK(ok.ctx);
  CHECK(ok.local_embs);
  CHECK(ok.output);
  CHECK(ok.keys);
  // The batches around it are untouched.
  CHECK(src.read(0).troubles.empty());
  CHECK(src.read(2).troubles.empty());
  CHECK(dump(src.read(0).batch) == dump(whole));
}

TEST_CASE("unreadable KJTs lose the batch: one trouble, the rank of the dataset") {
  Fixture fx;
  fx.mutate([](hid_t f) {
    replace(f, "/batches/2/rank0/ctx/input_splits", {3});
    replace(f, "/batches/2/rank1/lengths", {5});  // float64 lengths
  });
  expect_as_old(fx, 2);
  CaptureReader reader(fx.path);
  BatchSource src(reader, fx.plan, {});
  const BatchRead got = src.read(2);
  CHECK(!got.batch);
  REQUIRE(got.troubles.size() == 1);
  CHECK(got.troubles[0].rank == 1);
  std::string want;
  try {
    reader.read_batch(fx.plan, 2);
  } catch (const CaptureError& e) {
    want = e.what();
  }
  CHECK(want.rfind(fx.path + ":/batches/2/rank1/lengths: ", 0) == 0);
  CHECK(got.troubles[0].message == want);
}

TEST_CASE("a rank's keys that cannot be read lose the batch, not only the rank's parts") {
  Fixture fx;
  fx.mutate([](hid_t f) {
    replace(f, "/batches/0/rank0/local_embs", {1});  // rank 0's part: alone, a rank trouble
    replace(f, "/batches/0/rank2/keys", {2});        // not strings: the batch's trouble
  });
  expect_as_old(fx, 0);
  CaptureReader reader(fx.path);
  BatchSource src(reader, fx.plan, {});
  const BatchRead got = src.read(0);
  CHECK(!got.batch);
  REQUIRE(got.troubles.size() == 1);
  CHECK(got.troubles[0].rank == 2);
  CHECK(got.troubles[0].message.rfind(fx.path + ":/batches/0/rank2/keys: ", 0) == 0);
}

TEST_CASE("a trouble of the batch whose path names no rank has rank -1, whatever the file's path") {
  Fixture fx("rank7");
  const Plan w2 =
      make_plan(ModuleKind::sequence, 2, {{"t0", 10, 4, DType::f32}, {"t1", 7, 4, DType::f32}});
  CaptureReader reader(fx.path);
  BatchSource src(reader, w2, {1, false});
  src.read_ahead(1);
  const BatchRead got = src.read(1);
  CHECK(!got.batch);
  REQUIRE(got.troubles.size() == 1);
  CHECK(got.troubles[0].message ==
        fmt::format("{}:/: world_size 3 != plan world_size 2 (test-plan)", fx.path));
  // The file lies under ".../rank7/": the old path read the rank out of the text.
  CHECK(got.troubles[0].rank == -1);
  CHECK(old_read(reader, w2, 1).troubles.at(0).rank == 7);
}

TEST_CASE("fail_fast: the first Error of the batch, read ahead or not") {
  Fixture fx;
  fx.mutate([](hid_t f) {
    replace(f, "/batches/1/rank0/ctx/input_splits", {3});
    replace(f, "/batches/1/rank2/local_embs", {1, 1});
  });
  CaptureReader reader(fx.path);
  std::string want;
  try {
    reader.read_batch(fx.plan, 1);
  } catch (const CaptureError& e) {
    want = e.what();
  }
  REQUIRE(!want.empty());
  for (int ahead : {0, 1}) {
    CAPTURE(ahead);
    BatchSource src(reader, fx.plan, {ahead, true});
    src.read_ahead(1);
    std::string got;
    try {
      src.read(1);
    } catch (const CaptureError& e) {
      got = e.what();
    }
    CHECK(got == want);
    CHECK(src.read(0).troubles.empty());
  }
}

TEST_CASE("shapes: no float data, read ahead or not; nullopt on trouble") {
  Fixture fx;
  fx.mutate([](hid_t f) { replace(f, "/batches/2/rank1/output", {1, 1}); });
  CaptureReader reader(fx.path);
  ReadParts shapes;
  shapes.float_data = false;
  const std::string want = dump(reader.read_batch(fx.plan, 1, shapes));
  BatchSource src(reader, fx.plan, {});
  const std::optional<Batch> plain = src.read_shapes(1);
  REQUIRE(plain);
  CHECK(dump(plain) == want);
  CHECK(plain->ranks[0].local_embs->data.empty());
  CHECK(plain->ranks[0].local_embs->numel() > 0);
  src.shapes_ahead(1);
  CHECK(dump(src.read_shapes(1)) == want);
  src.shapes_ahead(2);
  CHECK(!src.read_shapes(2));
  src.shapes_ahead(0);  // another batch's: dropped
  CHECK(dump(src.read_shapes(1)) == want);
  BatchSource none(reader, fx.plan, {0, false});
  none.shapes_ahead(1);  // nothing started
  CHECK(dump(none.read_shapes(1)) == want);
}

TEST_CASE("rows of the captured tensors as the reader gives them, beside a read in flight") {
  Fixture fx;
  CaptureReader reader(fx.path);
  ReadParts shapes;
  shapes.float_data = false;
  const Batch b = reader.read_batch(fx.plan, 0, shapes);
  const Batch whole = reader.read_batch(fx.plan, 0);
  BatchSource src(reader, fx.plan, {});
  src.read_ahead(1);  // in flight while the rows are read
  const int64_t rows = b.ranks[1].output->rows(), D = b.ranks[1].output->cols();
  REQUIRE(rows >= 2);
  const std::vector<float> got = src.read_rows(0, 1, "output", DType::f32, {{1, rows}});
  const std::vector<float>& all = whole.ranks[1].output->data;
  CHECK(got == std::vector<float>(all.begin() + D, all.end()));
  std::vector<BatchSource::Ranges> ranges(3);
  for (size_t r = 0; r < 3; ++r)
    if (b.ranks[r].local_embs->rows() > 0) ranges[r] = {{0, b.ranks[r].local_embs->rows()}};
  const std::vector<std::vector<float>> each = src.read_rows(0, "local_embs", DType::f32, ranges);
  std::vector<int64_t> offsets;
  const std::vector<float> concat =
      src.read_rows_concat(0, "local_embs", DType::f32, ranges, offsets);
  REQUIRE(offsets.size() == 4);
  for (size_t r = 0; r < 3; ++r) {
    CHECK(each[r] == whole.ranks[r].local_embs->data);
    CHECK(std::vector<float>(concat.begin() + offsets[r], concat.begin() + offsets[r + 1]) ==
          whole.ranks[r].local_embs->data);
  }
  CHECK(dump(src.read(1).batch) == dump(reader.read_batch(fx.plan, 1)));
}
