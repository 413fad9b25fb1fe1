// Malformed captures: each must give a CaptureError naming the file, the HDF5 path of the
// first problem and what is wrong (capture-format.md, cli.md "trouble", exit 2).
#include <doctest/doctest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "capture/capture.hpp"
#include "test_capture_util.hpp"

using namespace dynemb;
using namespace dynemb::testcap;

namespace {

// A good capture: sequence, W=2, two features, D=4, every optional part, 2 batches.
struct Good {
  TempDir dir;
  Plan plan =
      make_plan(ModuleKind::sequence, 2, {{"t0", 10, 4, DType::f32}, {"t1", 7, 4, DType::f32}});
  std::string path = dir.file("good.h5");
  std::vector<Batch> batches;
  Good() {
    CaptureWriter w(path, plan, 3);
    for (int64_t k = 0; k < 2; ++k) {
      batches.push_back(make_batch(plan, k, {3, 4}, -1, IndexType::i64, true, 20 + k));
      w.write_batch(batches.back());
    }
    w.commit();
  }
};

void mutate(const std::string& path, const std::function<void(hid_t)>& fn) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  fn(f);
  REQUIRE(H5Fclose(f) >= 0);
}

// Replaces the dataset at `p` by one of `type` and `dims`, filled with `fill`.
void replace(hid_t f, const std::string& p, hid_t type, std::vector<hsize_t> dims,
             int64_t fill = 0) {
  if (H5Lexists(f, p.c_str(), H5P_DEFAULT) > 0) REQUIRE(H5Ldelete(f, p.c_str(), H5P_DEFAULT) >= 0);
  hid_t sp = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t d = H5Dcreate2(f, p.c_str(), type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(d >= 0);
  hsize_t n = 1;
  for (hsize_t x : dims) n *= x;
  if (n > 0) {
    std::vector<double> buf(n, static_cast<double>(fill));
    REQUIRE(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0);
  }
  H5Dclose(d);
  H5Sclose(sp);
}

void set_int_attr(hid_t f, const char* obj, const char* name, int64_t v) {
  hid_t o = H5Oopen(f, obj, H5P_DEFAULT);
  if (H5Aexists(o, name) > 0) H5Adelete(o, name);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(o, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a);
  H5Sclose(sp);
  H5Oclose(o);
}

void set_str_attr(hid_t f, const char* obj, const char* name, const std::string& v) {
  hid_t o = H5Oopen(f, obj, H5P_DEFAULT);
  if (H5Aexists(o, name) > 0) H5Adelete(o, name);
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, v.size());
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(o, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, t, v.data());
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
  H5Oclose(o);
}

// Opens and reads every batch; expects the first error at `h5path` with `fragment`.
void expect_error(const std::string& file, const Plan& plan, const std::string& h5path,
                  const std::string& fragment) {
  CAPTURE(h5path);
  CAPTURE(fragment);
  try {
    CaptureReader r(file);
    for (int64_t k = 0; k < r.num_batches(); ++k) r.read_batch(plan, k);
  } catch (const CaptureError& e) {
    CAPTURE(std::string(e.what()));
    CHECK(e.file() == file);
    CHECK(e.h5path() == h5path);
    CHECK(e.message().find(fragment) != std::string::npos);
    // The one-line form the CLI prints: "file:/h5/path: message"
    CHECK(std::string(e.what()).rfind(file + ":" + h5path + ": ", 0) == 0);
    return;
  }
  FAIL("no CaptureError");
}

const std::string kR1 = "/batches/0/rank1";

}  // namespace

TEST_CASE("the good capture reads cleanly (baseline for every mutation below)") {
  Good g;
  CaptureReader r(g.path);
  CHECK(r.num_batches() == 2);
  CHECK(r.read_batch(g.plan, 1).ranks[1].kjt.lengths == g.batches[1].ranks[1].kjt.lengths);
}

TEST_CASE("not a capture at all") {
  TempDir d;
  const std::string text = d.file("plan.txt");
  std::ofstream(text) << "format_version: 1\n";
  Plan plan = make_plan(ModuleKind::sequence, 2, {{"t0", 10, 4, DType::f32}});
  expect_error(text, plan, "/", "not an HDF5 file");
  const std::string empty = d.file("empty.h5");
  std::ofstream(empty).close();
  expect_error(empty, plan, "/", "not an HDF5 file");
  expect_error(d.file("missing.h5"), plan, "/", "cannot open file: No such file or directory");
}

TEST_CASE("truncated file") {
  Good g;
  const auto size = std::filesystem::file_size(g.path);
  for (auto keep : {size / 2, size - 100, std::uintmax_t{2048}}) {
    CAPTURE(keep);
    const std::string t = g.dir.file("trunc.h5");
    std::filesystem::copy_file(g.path, t, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(t, keep);
    expect_error(t, g.plan, "/", "truncated file");
  }
}

TEST_CASE("wrong format, format_version, missing root attributes, missing /plan") {
  {
    Good g;
    mutate(g.path, [](hid_t f) { set_str_attr(f, "/", "format", "some-other-format"); });
    expect_error(g.path, g.plan, "/", "unknown format \"some-other-format\"");
  }
  {
    Good g;
    mutate(g.path, [](hid_t f) { set_int_attr(f, "/", "format_version", 2); });
    expect_error(g.path, g.plan, "/", "unknown format_version 2");
  }
  {
    Good g;
    mutate(g.path, [](hid_t f) { H5Adelete(f, "format"); });
    expect_error(g.path, g.plan, "/", "missing attribute 'format'");
  }
  {
    Good g;
    mutate(g.path, [](hid_t f) { set_str_attr(f, "/", "world_size", "2"); });
    expect_error(g.path, g.plan, "/", "attribute 'world_size' is string, want one integer");
  }
  {
    Good g;
    mutate(g.path, [](hid_t f) { H5Ldelete(f, "/plan", H5P_DEFAULT); });
    expect_error(g.path, g.plan, "/plan", "missing dataset");
  }
  {
    Good g;
    mutate(g.path, [](hid_t f) { set_str_attr(f, "/oracle", "kind", "md5"); });
    expect_error(g.path, g.plan, "/oracle", "unknown oracle kind \"md5\"");
  }
  {
    Good g;  // the plan says W=3, the capture W=2
    Plan p3 =
        make_plan(ModuleKind::sequence, 3, {{"t0", 10, 4, DType::f32}, {"t1", 7, 4, DType::f32}});
    expect_error(g.path, p3, "/", "world_size 2 != plan world_size 3");
  }
}

TEST_CASE("missing batch and rank groups") {
  {
    Good g;
    mutate(g.path, [](hid_t f) { H5Ldelete(f, "/batches/0/rank1", H5P_DEFAULT); });
    expect_error(g.path, g.plan, kR1, "missing group");
  }
  {
    Good g;
    mutate(g.path, [](hid_t f) { set_int_attr(f, "/", "num_batches", 3); });
    expect_error(g.path, g.plan, "/batches/2", "missing group (num_batches = 3)");
  }
  {
    Good g;
    mutate(g.path, [](hid_t f) { H5Ldelete(f, "/batches/1/rank0/values", H5P_DEFAULT); });
    expect_error(g.path, g.plan, "/batches/1/rank0/values", "missing dataset");
  }
}

TEST_CASE("KJT: lengths that do not sum to the ids, bad lengths, wrong dtypes and shapes") {
  {
    Good g;
    const Kjt& k = g.batches[0].ranks[1].kjt;
    const int64_t n = k.num_ids();
    mutate(g.path, [&](hid_t f) { replace(f, kR1 + "/values", H5T_STD_I64LE, {hsize_t(n - 1)}); });
    expect_error(g.path, g.plan, kR1 + "/lengths",
                 fmt::format("sum {} != len(values) {}", n, n - 1));
  }
  {
    Good g;
    mutate(g.path, [&](hid_t f) { replace(f, kR1 + "/lengths", H5T_IEEE_F64LE, {8}); });
    expect_error(g.path, g.plan, kR1 + "/lengths", "dtype float64, want int32 or int64");
  }
  {
    Good g;
    mutate(g.path, [&](hid_t f) { replace(f, kR1 + "/values", H5T_STD_U64LE, {3}); });
    expect_error(g.path, g.plan, kR1 + "/values", "dtype uint64, want int32 or int64");
  }
  {
    Good g;
    mutate(g.path, [&](hid_t f) { replace(f, kR1 + "/lengths", H5T_STD_I64LE, {2, 4}); });
    expect_error(g.path, g.plan, kR1 + "/lengths", "shape [2, 4], want a 1-D dataset");
  }
  {
    Good g;  // F = 2: 7 lengths cannot be key-major [F*B]
    mutate(g.path, [&](hid_t f) { replace(f, kR1 + "/lengths", H5T_STD_I64LE, {7}); });
    expect_error(g.path, g.plan, kR1 + "/lengths", "length 7 is not a multiple of F = 2");
  }
  {
    Good g;
    mutate(g.path, [&](hid_t f) { replace(f, kR1 + "/lengths", H5T_STD_I32LE, {8}, -1); });
    expect_error(g.path, g.plan, kR1 + "/lengths", "lengths[0] = -1 < 0");
  }
  {
    Good g;
    mutate(g.path, [&](hid_t f) { replace(f, kR1 + "/weights", H5T_IEEE_F64LE, {1}); });
    expect_error(g.path, g.plan, kR1 + "/weights", "dtype float64, want float32");
  }
  {
    Good g;
    const int64_t n = g.batches[0].ranks[1].kjt.num_ids();
    mutate(g.path,
           [&](hid_t f) { replace(f, kR1 + "/weights", H5T_IEEE_F32LE, {hsize_t(n + 2)}); });
    expect_error(g.path, g.plan, kR1 + "/weights",
                 fmt::format("shape [{}], want [{}] (len(values))", n + 2, n));
  }
  {
    Good g;  // VBE strides that claim a huge batch: refused before anything is allocated
    mutate(g.path, [&](hid_t f) {
      replace(f, kR1 + "/stride_per_feature", H5T_STD_I64LE, {2}, int64_t(1) << 40);
    });
    expect_error(g.path, g.plan, kR1 + "/stride_per_feature", "out of range");
  }
  {
    Good g;
    mutate(g.path,
           [&](hid_t f) { replace(f, kR1 + "/stride_per_feature", H5T_STD_I64LE, {3}, 1); });
    expect_error(g.path, g.plan, kR1 + "/stride_per_feature", "shape [3], want [2] (F");
  }
  {
    Good g;  // strides 1+1 = 2 bags, but lengths has 8 entries
    mutate(g.path,
           [&](hid_t f) { replace(f, kR1 + "/stride_per_feature", H5T_STD_I64LE, {2}, 1); });
    expect_error(g.path, g.plan, kR1 + "/lengths", "length 8 != sum(stride_per_feature) 2");
  }
}

TEST_CASE("an extent no capture can have is refused before allocating") {
  Good g;
  const std::string p = kR1 + "/lengths";
  mutate(g.path, [&](hid_t f) {
    H5Ldelete(f, p.c_str(), H5P_DEFAULT);
    hsize_t dims[1] = {hsize_t(1) << 40}, chunk[1] = {1024};
    hid_t sp = H5Screate_simple(1, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);  // chunks are allocated lazily: the file stays small
    hid_t d = H5Dcreate2(f, p.c_str(), H5T_STD_I64LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    REQUIRE(d >= 0);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(sp);
  });
  expect_error(g.path, g.plan, p, "extent [1099511627776] is implausibly large");
}

TEST_CASE("an extent under the cap that the file does not store is refused before allocating") {
  // Found by fuzz_capture: 2^33 int64 values (64 GiB) claimed, a few KB stored. The reader
  // must not size a buffer from the claim; the 2^38-byte cap alone let this through.
  Good g;
  const std::string p = kR1 + "/values";
  mutate(g.path, [&](hid_t f) {
    H5Ldelete(f, p.c_str(), H5P_DEFAULT);
    hsize_t dims[1] = {hsize_t(1) << 33}, chunk[1] = {4096};
    hid_t sp = H5Screate_simple(1, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    hid_t d = H5Dcreate2(f, p.c_str(), H5T_STD_I64LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    REQUIRE(d >= 0);
    // One chunk written: 32 KiB stored, far below 64 GiB / 1100.
    std::vector<int64_t> one(4096, 1);
    hsize_t start[1] = {0}, count[1] = {4096};
    hid_t fs = H5Dget_space(d);
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, count, nullptr);
    hid_t ms = H5Screate_simple(1, count, nullptr);
    REQUIRE(H5Dwrite(d, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, one.data()) >= 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(sp);
  });
  expect_error(g.path, g.plan, p,
               "extent [8589934592] claims 6.87e+10 bytes but the file stores only 32768 bytes");
}

TEST_CASE("ctx: wrong shape of every field, wrong dtypes, bad flag") {
  Good probe;
  const int64_t W = 2, F = 2;
  const int64_t n = probe.batches[0].ranks[1].kjt.num_ids();
  const int64_t sum_b = 3 + 4;
  struct Case {
    const char* field;
    hid_t type;
    std::vector<hsize_t> dims;
    std::string msg;
  };
  const std::vector<Case> cases = {
      {"input_splits", H5T_STD_I64LE, {3}, "shape [3], want [2] (W)"},
      {"output_splits", H5T_STD_I64LE, {1}, "shape [1], want [2] (W)"},
      {"batch_size_per_rank", H5T_STD_I64LE, {2, 1}, "shape [2, 1], want [2] (W)"},
      {"batch_size_per_rank_per_feature",
       H5T_STD_I64LE,
       {2, 3},
       "shape [2, 3], want [2, 2] (W, F)"},
      {"sparse_features_recat",
       H5T_STD_I32LE,
       {5},
       fmt::format("shape [5], want [{}] (F*W) or [{}]", F * W, F * sum_b)},
      {"unbucketize_permute",
       H5T_STD_I64LE,
       {hsize_t(n + 1)},
       fmt::format("shape [{}], want [{}] (N_r = len(values))", n + 1, n)},
      {"lengths_after_input_dist",
       H5T_STD_I64LE,
       {2, hsize_t(sum_b + 1)},
       fmt::format("shape [2, {}], want [2, {}] (F, sum_s B_s)", sum_b + 1, sum_b)},
      {"lengths_after_input_dist",
       H5T_STD_I64LE,
       {hsize_t(F * sum_b)},
       fmt::format("shape [{}], want [2, {}] (F, sum_s B_s)", F * sum_b, sum_b)},
      // dtypes: int64 fields must be int64, the recat int32
      {"input_splits", H5T_STD_I32LE, {2}, "dtype int32, want int64"},
      {"unbucketize_permute", H5T_IEEE_F32LE, {hsize_t(n)}, "dtype float32, want int64"},
      {"sparse_features_recat", H5T_STD_I64LE, {4}, "dtype int64, want int32"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.field);
    Good g;
    const std::string p = kR1 + "/ctx/" + c.field;
    mutate(g.path, [&](hid_t f) { replace(f, p, c.type, c.dims); });
    expect_error(g.path, g.plan, p, c.msg);
  }
  // The expanded recat (per bag, F * sum_s B_s) is accepted.
  {
    Good g;
    mutate(g.path, [&](hid_t f) {
      replace(f, kR1 + "/ctx/sparse_features_recat", H5T_STD_I32LE, {hsize_t(F * sum_b)});
    });
    CaptureReader r(g.path);
    CHECK(r.read_batch(g.plan, 0).ranks[1].ctx->sparse_features_recat->size() == size_t(F * sum_b));
  }
  {
    Good g;
    mutate(g.path, [&](hid_t f) {
      set_int_attr(f, (kR1 + "/ctx").c_str(), "variable_batch_per_feature", 2);
    });
    expect_error(g.path, g.plan, kR1 + "/ctx", "variable_batch_per_feature = 2, want 0 or 1");
  }
}

TEST_CASE("local_embs and output: wrong shapes and dtypes") {
  Good probe;
  const int64_t n = probe.batches[0].ranks[1].kjt.num_ids();
  const int64_t routed = probe.batches[0].ranks[1].local_embs->rows();
  {
    Good g;
    mutate(g.path, [&](hid_t f) {
      replace(f, kR1 + "/local_embs", H5T_IEEE_F32LE, {hsize_t(routed + 1), 4});
    });
    expect_error(g.path, g.plan, kR1 + "/local_embs",
                 fmt::format("shape [{}, 4], want [{}, 4] (ids routed to this rank, D)", routed + 1,
                             routed));
  }
  {
    Good g;
    mutate(g.path, [&](hid_t f) { replace(f, kR1 + "/output", H5T_IEEE_F32LE, {hsize_t(n), 5}); });
    expect_error(g.path, g.plan, kR1 + "/output",
                 fmt::format("shape [{}, 5], want [{}, 4] (N_r = len(values), D)", n, n));
  }
  {
    Good g;
    mutate(g.path, [&](hid_t f) { replace(f, kR1 + "/output", H5T_IEEE_F64LE, {hsize_t(n), 4}); });
    expect_error(g.path, g.plan, kR1 + "/output",
                 "dtype float64, want float32, float16 or bfloat16");
  }
  {
    Good g;  // a uint16 dataset without dtype="bfloat16" is not bf16
    mutate(g.path, [&](hid_t f) { replace(f, kR1 + "/output", H5T_STD_U16LE, {hsize_t(n), 4}); });
    expect_error(g.path, g.plan, kR1 + "/output", "dtype uint16, want float32");
  }
  {
    Good g;  // fp32 plan: an fp16 local_embs contradicts data_type
    mutate(g.path, [&](hid_t f) {
      hid_t h = H5Tcopy(H5T_IEEE_F32LE);
      H5Tset_fields(h, 15, 10, 5, 0, 10);
      H5Tset_size(h, 2);
      H5Tset_ebias(h, 15);
      replace(f, kR1 + "/local_embs", h, {hsize_t(routed), 4});
      H5Tclose(h);
    });
    expect_error(g.path, g.plan, kR1 + "/local_embs",
                 "dtype float16, want float32 (plan data_type fp32)");
  }
}

TEST_CASE("check_capture: tables, override plans") {
  Good g;
  check_capture(g.path, &g.plan);
  Plan other =
      make_plan(ModuleKind::sequence, 2, {{"t0", 10, 8, DType::f32}, {"t1", 7, 8, DType::f32}});
  try {
    check_capture(g.path, &other);
    FAIL("no error");
  } catch (const CaptureError& e) {
    CHECK(e.h5path() == "/plan");
    CHECK(e.message().find("feature 'f_t0' has dim 4 in the capture, 8 in the plan given") !=
          std::string::npos);
  }
  mutate(g.path, [&](hid_t f) {
    H5Gclose(H5Gcreate2(f, "/tables", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Gclose(H5Gcreate2(f, "/tables/zzz", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    replace(f, "/tables/zzz/weight", H5T_IEEE_F32LE, {2, 4});
  });
  try {
    check_capture(g.path, &g.plan);
    FAIL("no error");
  } catch (const CaptureError& e) {
    CHECK(e.h5path() == "/tables/zzz");
    CHECK(e.message() == "no table 'zzz' in the plan");
  }
  mutate(g.path, [&](hid_t f) {
    H5Ldelete(f, "/tables/zzz", H5P_DEFAULT);
    H5Gclose(H5Gcreate2(f, "/tables/t1", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    replace(f, "/tables/t1/weight", H5T_IEEE_F32LE, {6, 4});
  });
  try {
    check_capture(g.path, &g.plan);
    FAIL("no error");
  } catch (const CaptureError& e) {
    CHECK(e.h5path() == "/tables/t1/weight");
    CHECK(e.message() == "shape [6, 4], want [7, 4] (num_embeddings, embedding_dim)");
  }
}
