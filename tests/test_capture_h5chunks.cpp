// The chunk path of lib/capture/h5chunks: reading a shuffle+deflate dataset by raw chunks gives
// H5Dread's bytes, and writing one by raw chunks gives the very file H5Dwrite gives (edge
// chunks, 1-D and 2-D grids, several element sizes), and declines what it cannot reproduce;
// reading row ranges by raw chunks gives H5Dread's bytes of a hyperslab selection.
#include <doctest/doctest.h>
#include <hdf5.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "capture/h5chunks.hpp"
#include "capture/h5util.hpp"
#include "common/test_hooks.hpp"
#include "test_capture_util.hpp"

using namespace dynemb;
using dynemb::testcap::Lcg;
using dynemb::testcap::TempDir;

namespace {

struct Case {
  const char* name;
  hid_t file_type, mem_type;  // the same type, as the writer passes them
  size_t es;
  std::vector<hsize_t> dims, chunk;
  int level;
};

// Half the bytes small numbers (deflate shrinks them), half random (stored blocks).
std::vector<unsigned char> sample(size_t bytes, uint64_t seed) {
  Lcg g{seed};
  std::vector<unsigned char> v(bytes);
  for (size_t i = 0; i < bytes; ++i)
    v[i] =
        (i / 4096) % 2 ? static_cast<unsigned char>(g.next()) : static_cast<unsigned char>(i % 7);
  return v;
}

size_t numel(const std::vector<hsize_t>& dims) {
  size_t n = 1;
  for (hsize_t d : dims) n *= size_t(d);
  return n;
}

// An empty dataset `name` in `f` of `c`'s layout: chunked, shuffle, deflate.
h5::Hid create(hid_t f, const char* name, const Case& c, bool user_fill = false) {
  h5::Hid sp(H5Screate_simple(int(c.dims.size()), c.dims.data(), nullptr), H5Sclose);
  h5::Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_obj_track_times(dcpl, false);
  H5Pset_chunk(dcpl, int(c.chunk.size()), c.chunk.data());
  H5Pset_shuffle(dcpl);
  H5Pset_deflate(dcpl, unsigned(c.level));
  if (user_fill) {
    const std::vector<unsigned char> fill(c.es, 0x5a);
    H5Pset_fill_value(dcpl, c.file_type, fill.data());
  }
  h5::Hid d(H5Dcreate2(f, name, c.file_type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  REQUIRE(d.valid());
  return d;
}

// A file with one dataset "/x" of `c`'s layout, written with H5Dwrite (serial = true) or the
// chunk path; returns what write_chunks_parallel said (declined for the H5Dwrite file).
h5::ChunkWrite make_file(const std::string& path, const Case& c,
                         const std::vector<unsigned char>& data, bool serial, int threads = 3,
                         bool user_fill = false) {
  h5::quiet();
  h5::Hid f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  REQUIRE(f.valid());
  h5::Hid d = create(f, "x", c, user_fill);
  h5::ChunkWrite w = h5::ChunkWrite::declined;
  if (!serial) {
    std::string why;
    w = h5::write_chunks_parallel(d, c.mem_type, data.data(), data.size(), threads, why);
    CHECK_MESSAGE(w != h5::ChunkWrite::failed, why);
  }
  if (w == h5::ChunkWrite::declined)
    REQUIRE(H5Dwrite(d, c.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) >= 0);
  return w;
}

std::vector<char> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

// For each layout of `v`: a file of it written with H5Dwrite from sample(seed + i) (i: the
// layout's place in `v`), opened read-only, then fn(case, data, dataset, seed).
template <class Fn>
void for_each_file(const std::vector<Case>& v, uint64_t seed, Fn&& fn) {
  TempDir tmp;
  for (const Case& c : v) {
    const std::string name = c.name;
    CAPTURE(name);
    const std::vector<unsigned char> data = sample(numel(c.dims) * c.es, seed);
    const std::string path = tmp.file("r.h5");
    make_file(path, c, data, /*serial=*/true);
    h5::Hid f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    h5::Hid d(H5Dopen2(f, "x", H5P_DEFAULT), H5Dclose);
    REQUIRE(d.valid());
    fn(c, data, hid_t(d), seed++);
  }
}

// The layouts our writer makes (capture.cpp): chunks of ~1 MiB, so that at most one is in
// HDF5's chunk cache (1 MiB by default) at a time, or one chunk for the whole dataset.
const std::vector<Case>& cases() {
  static const std::vector<Case> v = {
      // 1-D, 1 MiB chunks, a partial last chunk
      {"i64 1-D edge", H5T_STD_I64LE, H5T_NATIVE_INT64, 8, {300001}, {131072}, 4},
      // 2-D, the chunk spans all columns (2730 rows of 96 floats), a partial last chunk
      {"f32 2-D rows edge", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, {6000, 96}, {2730, 96}, 4},
      // 2-D, rows longer than a chunk: 1 x 512 Ki chunks, a partial last column of chunks
      {"u16 2-D column edge", H5T_STD_U16LE, H5T_NATIVE_UINT16, 2, {3, 600000}, {1, 524288}, 1},
      // one chunk, exactly the extent; level 9
      {"i32 1-D one chunk", H5T_STD_I32LE, H5T_NATIVE_INT32, 4, {65536}, {65536}, 9},
      // 1-byte elements: shuffle moves nothing
      {"u8 1-D edge", H5T_STD_U8LE, H5T_NATIVE_UINT8, 1, {2500000}, {1048576}, 4},
  };
  return v;
}

// Layouts only the read path meets (from other writers): small chunks whose element counts
// are not multiples of 16 (the vector unshuffle's tail), one of fewer than 16 elements.
std::vector<Case> read_cases() {
  std::vector<Case> v = cases();
  v.push_back({"i64 1-D odd chunk", H5T_STD_I64LE, H5T_NATIVE_INT64, 8, {10007}, {1001}, 4});
  v.push_back({"f32 2-D odd chunk", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, {999, 7}, {101, 7}, 4});
  v.push_back({"u16 1-D odd chunk", H5T_STD_U16LE, H5T_NATIVE_UINT16, 2, {5003}, {517}, 1});
  v.push_back({"i32 1-D tiny chunk", H5T_STD_I32LE, H5T_NATIVE_INT32, 4, {50}, {7}, 4});
  return v;
}

}  // namespace

TEST_CASE("h5chunks: the chunk write gives H5Dwrite's file, byte for byte") {
  TempDir tmp;
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    const std::string name = c.name;
    CAPTURE(name);
    const std::vector<unsigned char> data = sample(numel(c.dims) * c.es, seed++);
    const std::string a = tmp.file("serial.h5"), b = tmp.file("chunks.h5");
    make_file(a, c, data, /*serial=*/true);
    for (int threads : {1, 3, 8}) {
      CAPTURE(threads);
      CHECK(make_file(b, c, data, /*serial=*/false, threads) == h5::ChunkWrite::written);
      const std::vector<char> fa = slurp(a), fb = slurp(b);
      CHECK(fa.size() > 0);
      CHECK(fa.size() == fb.size());
      CHECK(fa == fb);
    }
  }
}

TEST_CASE("h5chunks: the chunk read gives H5Dread's bytes") {
  for_each_file(
      read_cases(), 100,
      [](const Case& c, const std::vector<unsigned char>& data, hid_t d, uint64_t) {
        std::vector<unsigned char> via_read(data.size(), 0xee), via_chunks(data.size(), 0xee);
        REQUIRE(H5Dread(d, c.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, via_read.data()) >= 0);
        for (int threads : {1, 4}) {
          CAPTURE(threads);
          std::fill(via_chunks.begin(), via_chunks.end(), 0xee);
          CHECK(h5::read_chunks_parallel(d, via_chunks.data(), data.size(), threads));
          CHECK(via_chunks == via_read);
          CHECK(via_chunks == data);
        }
        // A wrong size is declined before anything is read.
        CHECK_FALSE(h5::read_chunks_parallel(d, via_chunks.data(), data.size() - c.es, 2));
      });
}

TEST_CASE("h5chunks: a file the chunk write made reads back through both paths") {
  TempDir tmp;
  const Case& c = cases()[2];  // a column of edge chunks
  const std::vector<unsigned char> data = sample(numel(c.dims) * c.es, 7);
  const std::string path = tmp.file("w.h5");
  REQUIRE(make_file(path, c, data, /*serial=*/false) == h5::ChunkWrite::written);
  h5::Hid f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  h5::Hid d(H5Dopen2(f, "x", H5P_DEFAULT), H5Dclose);
  std::vector<unsigned char> a(data.size()), b(data.size());
  REQUIRE(H5Dread(d, c.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.data()) >= 0);
  CHECK(a == data);
  CHECK(h5::read_chunks_parallel(d, b.data(), b.size(), 4));
  CHECK(b == data);
  // Every stored chunk is deflated (no filter skipped), the grid is full: 3 x 2 chunks.
  hsize_t n = 0;
  h5::Hid fsp(H5Dget_space(d), H5Sclose);
  REQUIRE(H5Dget_num_chunks(d, fsp, &n) >= 0);
  CHECK(n == 6);
  hsize_t off[2] = {2, 524288}, size = 0;  // the last chunk: 75712 of its 524288 inside
  unsigned mask = 7;
  REQUIRE(H5Dget_chunk_storage_size(d, off, &size) >= 0);
  std::vector<unsigned char> raw(static_cast<size_t>(size));
  REQUIRE(H5Dread_chunk(d, H5P_DEFAULT, off, &mask, raw.data()) >= 0);
  CHECK(mask == 0);
  CHECK(int(raw[0]) == 0x78);  // a zlib stream header
}

TEST_CASE("h5chunks: the chunk write declines what it cannot reproduce") {
  TempDir tmp;
  const Case& c = cases()[0];
  const std::vector<unsigned char> data = sample(numel(c.dims) * c.es, 3);
  // A user-defined fill value: H5Dwrite pads edge chunks with it.
  CHECK(make_file(tmp.file("fill.h5"), c, data, false, 2, /*user_fill=*/true) ==
        h5::ChunkWrite::declined);
  // Chunks of 128 KiB, 8 in the 1 MiB chunk cache: H5Dwrite's file order would be the
  // cache's (it keeps partial edge chunks longer), not the grid's.
  {
    const Case small{
        "u16 small chunks", H5T_STD_U16LE, H5T_NATIVE_UINT16, 2, {517, 1100}, {128, 512}, 4};
    const std::vector<unsigned char> d2 = sample(numel(small.dims) * small.es, 4);
    CHECK(make_file(tmp.file("small.h5"), small, d2, false) == h5::ChunkWrite::declined);
  }

  h5::Hid f(H5Fcreate(tmp.file("d.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  h5::Hid sp(H5Screate_simple(1, c.dims.data(), nullptr), H5Sclose);
  std::string why;
  {  // contiguous
    h5::Hid d(H5Dcreate2(f, "contig", c.file_type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
              H5Dclose);
    CHECK(h5::write_chunks_parallel(d, c.mem_type, data.data(), data.size(), 2, why) ==
          h5::ChunkWrite::declined);
  }
  h5::Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl, 1, c.chunk.data());
  {  // chunked without deflate
    h5::Hid d(H5Dcreate2(f, "plain", c.file_type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
    CHECK(h5::write_chunks_parallel(d, c.mem_type, data.data(), data.size(), 2, why) ==
          h5::ChunkWrite::declined);
  }
  H5Pset_shuffle(dcpl);
  H5Pset_deflate(dcpl, 4);
  {  // a conversion (int32 in memory), a wrong size, a dataset already written
    h5::Hid d(H5Dcreate2(f, "z", c.file_type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
    CHECK(h5::write_chunks_parallel(d, H5T_NATIVE_INT32, data.data(), data.size() / 2, 2, why) ==
          h5::ChunkWrite::declined);
    CHECK(h5::write_chunks_parallel(d, c.mem_type, data.data(), data.size() - 8, 2, why) ==
          h5::ChunkWrite::declined);
    REQUIRE(H5Dwrite(d, c.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) >= 0);
    CHECK(h5::write_chunks_parallel(d, c.mem_type, data.data(), data.size(), 2, why) ==
          h5::ChunkWrite::declined);
  }
  // The test hook DYNEMB_H5_SERIAL_WRITE=1 forces H5Dwrite; a build without hooks ignores it.
  ::setenv("DYNEMB_H5_SERIAL_WRITE", "1", 1);
  const auto w = make_file(tmp.file("env.h5"), c, data, false);
  ::unsetenv("DYNEMB_H5_SERIAL_WRITE");
  CHECK(w == (test_hooks::enabled() ? h5::ChunkWrite::declined : h5::ChunkWrite::written));
  CHECK(make_file(tmp.file("env.h5"), c, data, false) == h5::ChunkWrite::written);
}

namespace {

using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

// Layouts for the row read: chunks of whole rows, small enough for many ranges per chunk.
const std::vector<Case>& row_cases() {
  static const std::vector<Case> v = {
      // 2-D, 1000 rows in chunks of 64: a partial last chunk
      {"f32 2-D rows edge", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, {1000, 24}, {64, 24}, 4},
      // 2-D, chunk rows dividing the extent
      {"f32 2-D rows even", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, {1024, 16}, {128, 16}, 1},
      {"f64 2-D rows edge", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 8, {333, 3}, {32, 3}, 6},
      {"i64 1-D edge", H5T_STD_I64LE, H5T_NATIVE_INT64, 8, {5000}, {300}, 4},
      {"i32 1-D one chunk", H5T_STD_I32LE, H5T_NATIVE_INT32, 4, {700}, {700}, 9},
      {"u16 2-D rows edge", H5T_STD_U16LE, H5T_NATIVE_UINT16, 2, {777, 5}, {50, 5}, 4},
  };
  return v;
}

// Sorted, disjoint, non-empty ranges inside [0, n), chunk rows `R`: the whole extent, single
// rows, or a random walk of gaps (some empty: adjacent ranges) and lengths from one row to
// several chunks, so that ranges sit inside a chunk, share one and cross chunk edges.
Ranges random_ranges(Lcg& g, uint64_t n, uint64_t R) {
  Ranges rs;
  const uint64_t kind = g.next() % 8;
  if (kind == 0) return {{0, n}};
  uint64_t row = g.next() % std::min<uint64_t>(n, 2 * R);
  while (row < n) {
    uint64_t len = 1;
    const uint64_t pick = g.next() % 4;
    if (kind == 1 || pick == 0)
      len = 1;
    else if (pick == 1)
      len = 1 + g.next() % R;
    else if (pick == 2)
      len = 1 + g.next() % (3 * R);
    else
      len = R - row % R;  // up to the chunk's edge
    len = std::min(len, n - row);
    rs.emplace_back(row, row + len);
    const uint64_t gap = g.next() % 3 == 0 ? 0 : g.next() % (kind == 2 ? 4 * R : R / 2 + 1);
    row += len + gap;
  }
  return rs;
}

// H5Dread of the rows of `rs` (a hyperslab union, read in row order) into `row_bytes`-byte rows.
std::vector<unsigned char> read_rows_h5(hid_t d, const Case& c, const Ranges& rs,
                                        size_t row_bytes) {
  h5::Hid fsp(H5Dget_space(d), H5Sclose);
  H5Sselect_none(fsp);
  uint64_t rows = 0;
  std::vector<hsize_t> start(c.dims.size(), 0), count = c.dims;
  for (const auto& r : rs) {
    start[0] = r.first;
    count[0] = r.second - r.first;
    REQUIRE(H5Sselect_hyperslab(fsp, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr) >=
            0);
    rows += r.second - r.first;
  }
  const hsize_t elems = hsize_t(rows * row_bytes / c.es);
  h5::Hid msp(H5Screate_simple(1, &elems, nullptr), H5Sclose);
  std::vector<unsigned char> v(size_t(rows * row_bytes), 0xee);
  REQUIRE(H5Dread(d, c.mem_type, msp, fsp, H5P_DEFAULT, v.data()) >= 0);
  return v;
}

// The dataset "/x" of the file at `path`, opened for writing too (its file in `f`).
h5::Hid open_x(const std::string& path, h5::Hid& f) {
  f = h5::Hid(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  h5::Hid d(H5Dopen2(f, "x", H5P_DEFAULT), H5Dclose);
  REQUIRE(d.valid());
  return d;
}

}  // namespace

TEST_CASE("h5chunks: the row read gives H5Dread's bytes of the same rows") {
  for_each_file(row_cases(), 200,
                [](const Case& c, const std::vector<unsigned char>& data, hid_t d, uint64_t seed) {
                  const size_t row_bytes = data.size() / size_t(c.dims[0]);
                  Lcg g{seed * 31};
                  for (int set = 0; set < 60; ++set) {
                    const Ranges rs = random_ranges(g, c.dims[0], c.chunk[0]);
                    CAPTURE(set);
                    const std::vector<unsigned char> want = read_rows_h5(d, c, rs, row_bytes);
                    for (int threads : {1, 2, 4}) {
                      CAPTURE(threads);
                      std::vector<unsigned char> got(want.size(), 0xee);
                      CHECK(h5::read_rows_parallel(d, rs, got.data(), threads));
                      CHECK(got == want);
                    }
                  }
                });
}

TEST_CASE("h5chunks: rows of several datasets read as one stream are each dataset's rows") {
  TempDir tmp;
  const std::string path = tmp.file("m.h5");
  const std::vector<Case>& v = row_cases();
  std::vector<std::vector<unsigned char>> data;
  {
    h5::quiet();
    h5::Hid f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    for (size_t i = 0; i < v.size(); ++i) {
      data.push_back(sample(numel(v[i].dims) * v[i].es, 300 + i));
      h5::Hid d = create(f, ("x" + std::to_string(i)).c_str(), v[i]);
      REQUIRE(H5Dwrite(d, v[i].mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data[i].data()) >= 0);
    }
  }
  h5::Hid f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  std::vector<h5::Hid> ds;
  for (size_t i = 0; i < v.size(); ++i)
    ds.emplace_back(H5Dopen2(f, ("x" + std::to_string(i)).c_str(), H5P_DEFAULT), H5Dclose);
  Lcg g{77};
  for (int set = 0; set < 40; ++set) {
    CAPTURE(set);
    std::vector<std::vector<unsigned char>> want(v.size()), got(v.size());
    std::vector<h5::RowsRead> reads;
    for (size_t i = 0; i < v.size(); ++i) {
      if (g.next() % 4 == 0) continue;  // some datasets not read at all
      const Ranges rs = random_ranges(g, v[i].dims[0], v[i].chunk[0]);
      want[i] = read_rows_h5(ds[i], v[i], rs, data[i].size() / size_t(v[i].dims[0]));
      got[i].assign(want[i].size(), 0xee);
      // Half of them with the layout the caller keeps (a dataset read for many destinations).
      reads.push_back(
          {hid_t(ds[i]), rs, got[i].data(), i % 2 ? h5::readable_layout(hid_t(ds[i])) : nullptr});
    }
    for (int threads : {1, 3}) {
      CAPTURE(threads);
      CHECK(h5::read_rows_parallel(reads, threads));
      CHECK(got == want);
    }
  }
}

TEST_CASE("h5chunks: the row read declines split rows, contiguous data and bad chunks") {
  TempDir tmp;
  const Ranges all{{0, 40}}, some{{3, 5}, {17, 18}};
  std::vector<unsigned char> out(40 * 10 * 4);
  {  // chunks that split the columns
    const Case split{"f32 split", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, {40, 10}, {8, 5}, 4};
    make_file(tmp.file("split.h5"), split, sample(40 * 10 * 4, 1), /*serial=*/true);
    h5::Hid f;
    h5::Hid d = open_x(tmp.file("split.h5"), f);
    CHECK_FALSE(h5::read_rows_parallel(d, all, out.data(), 2));
    CHECK_FALSE(h5::read_rows_parallel(d, some, out.data(), 2));
  }
  {  // contiguous
    h5::Hid f(H5Fcreate(tmp.file("c.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
              H5Fclose);
    const hsize_t dims[2] = {40, 10};
    h5::Hid sp(H5Screate_simple(2, dims, nullptr), H5Sclose);
    h5::Hid d(H5Dcreate2(f, "x", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
              H5Dclose);
    REQUIRE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0);
    CHECK_FALSE(h5::read_rows_parallel(d, all, out.data(), 2));
  }
  // 40 rows in chunks of 8; chunk 2 (rows 16..23) replaced by bytes that do not inflate, then
  // by a stream that inflates to too few bytes. Ranges that miss it read it not at all.
  const Case c{"f32 rows", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, {40, 10}, {8, 10}, 4};
  const std::vector<unsigned char> data = sample(40 * 10 * 4, 2);
  const std::string path = tmp.file("bad.h5");
  make_file(path, c, data, /*serial=*/true);
  h5::Hid f;
  h5::Hid d = open_x(path, f);
  const hsize_t off[2] = {16, 0};
  std::vector<unsigned char> junk(300);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<unsigned char>(i * 37 + 11);
  REQUIRE(H5Dwrite_chunk(d, H5P_DEFAULT, 0, off, junk.size(), junk.data()) >= 0);
  const Ranges miss{{0, 3}, {5, 16}, {24, 40}}, hit{{0, 3}, {20, 21}};
  std::vector<unsigned char> got(30 * 10 * 4);
  for (int threads : {1, 4}) {
    CHECK(h5::read_rows_parallel(d, miss, got.data(), threads));
    CHECK(got == read_rows_h5(d, c, miss, 40));
    CHECK_FALSE(h5::read_rows_parallel(d, hit, got.data(), threads));
    CHECK_FALSE(h5::read_rows_parallel(d, all, out.data(), threads));
  }
  uLongf zn = compressBound(100);
  std::vector<unsigned char> z(zn);
  REQUIRE(compress2(z.data(), &zn, data.data(), 100, 4) == Z_OK);
  REQUIRE(H5Dwrite_chunk(d, H5P_DEFAULT, 0, off, zn, z.data()) >= 0);
  CHECK_FALSE(h5::read_rows_parallel(d, hit, got.data(), 2));
  // A chunk that claims more than deflate could make of 320 bytes.
  std::vector<unsigned char> big(320 * 2 + 4096);
  REQUIRE(H5Dwrite_chunk(d, H5P_DEFAULT, 0, off, big.size(), big.data()) >= 0);
  CHECK_FALSE(h5::read_rows_parallel(d, hit, got.data(), 2));
  CHECK(h5::read_rows_parallel(d, miss, got.data(), 2));
  {  // rows 0..15 written (chunks 0 and 1), the other chunks never stored: H5Dread would give
     // fill values for them, the row read declines them
    h5::Hid p = create(f, "part", c);
    h5::Hid sp(H5Screate_simple(2, c.dims.data(), nullptr), H5Sclose);
    const hsize_t start[2] = {0, 0}, count[2] = {16, 10};
    REQUIRE(H5Sselect_hyperslab(sp, H5S_SELECT_SET, start, nullptr, count, nullptr) >= 0);
    h5::Hid msp(H5Screate_simple(2, count, nullptr), H5Sclose);
    REQUIRE(H5Dwrite(p, c.mem_type, msp, sp, H5P_DEFAULT, data.data()) >= 0);
    REQUIRE(H5Dflush(p) >= 0);
    const Ranges stored{{1, 4}, {9, 16}}, unstored{{1, 4}, {30, 31}};
    std::vector<unsigned char> part(10 * 10 * 4);
    CHECK(h5::read_rows_parallel(p, stored, part.data(), 2));
    CHECK(std::equal(part.begin(), part.begin() + 3 * 40, data.begin() + 40));
    CHECK(std::equal(part.begin() + 3 * 40, part.end(), data.begin() + 9 * 40));
    CHECK_FALSE(h5::read_rows_parallel(p, unstored, part.data(), 2));
  }
}

TEST_CASE("h5chunks: a chunk whose record or decoded size is not its dataset's is named") {
  // 40 x 10 float32 in chunks of 8 rows (320 bytes, shuffle + deflate); chunk 2 (rows 16..23)
  // replaced. Every read path reports it (read_chunks_parallel, read_rows_parallel,
  // check_chunks), never decodes it into the output.
  TempDir tmp;
  const Case c{"f32 rows", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, {40, 10}, {8, 10}, 4};
  const std::vector<unsigned char> data = sample(40 * 10 * 4, 3);
  const std::string path = tmp.file("t.h5");
  make_file(path, c, data, /*serial=*/true);
  h5::Hid f;
  h5::Hid d = open_x(path, f);
  const hsize_t off[2] = {16, 0};
  const std::vector<std::pair<uint64_t, uint64_t>> hit{{17, 18}};
  std::vector<unsigned char> out(data.size());
  const std::string at = "chunk 2 (offset [16, 0]): ";
  auto expect = [&](const std::string& why) {
    for (int threads : {1, 3}) {
      h5::ChunkTrouble t;
      CHECK_FALSE(h5::read_chunks_parallel(d, out.data(), out.size(), threads, &t));
      CHECK(t.dset == d.get());
      CHECK(t.what == at + why);
      h5::ChunkTrouble r;
      CHECK_FALSE(h5::read_rows_parallel(d, hit, out.data(), threads, &r));
      CHECK(r.what == at + why);
    }
    std::string w;
    CHECK_FALSE(h5::check_chunks(d, w));
    CHECK(w == at + why);
  };
  std::string w;
  REQUIRE(h5::check_chunks(d, w));
  // deflate and shuffle skipped (mask 3) / deflate skipped (mask 2), 100 bytes stored
  std::vector<unsigned char> hundred(101, 0x41);
  REQUIRE(H5Dwrite_chunk(d, H5P_DEFAULT, 3, off, 100, hundred.data()) >= 0);
  expect("stored 100 bytes, unfiltered chunk needs 320");
  CHECK_FALSE(h5::check_chunks(d, w, /*decode_too=*/false));  // from the record alone
  // (each rewrite another size: libhdf5 1.10 keeps the old mask of a chunk rewritten in place
  // at its size)
  REQUIRE(H5Dwrite_chunk(d, H5P_DEFAULT, 2, off, 101, hundred.data()) >= 0);
  expect("stored 101 bytes, a shuffled, not deflated chunk needs 320");
  // a mask naming a third filter
  REQUIRE(H5Dwrite_chunk(d, H5P_DEFAULT, 4, off, 99, hundred.data()) >= 0);
  expect("filter mask 0x4 skips filters the dataset does not have (2 filters)");
  // valid deflate streams of 100 and of 400 bytes; bytes that are no stream
  uLongf zn = compressBound(400);
  std::vector<unsigned char> z(zn);
  REQUIRE(compress2(z.data(), &zn, data.data(), 100, 4) == Z_OK);
  REQUIRE(H5Dwrite_chunk(d, H5P_DEFAULT, 0, off, zn, z.data()) >= 0);
  expect("deflate stream decodes to 100 bytes, chunk needs 320");
  CHECK(h5::check_chunks(d, w, /*decode_too=*/false));  // the record is a deflated chunk's
  zn = compressBound(400);
  REQUIRE(compress2(z.data(), &zn, data.data(), 400, 4) == Z_OK);
  REQUIRE(H5Dwrite_chunk(d, H5P_DEFAULT, 0, off, zn, z.data()) >= 0);
  // zlib's uncompress cannot tell a longer stream from a cut one (Z_BUF_ERROR both ways);
  // libdeflate can.
#if defined(DYNEMB_HAVE_LIBDEFLATE)
  expect("deflate stream decodes to more than the 320 bytes the chunk needs");
#else
  expect("deflate stream decodes to more than the 320 bytes the chunk needs, or is cut short");
#endif
  REQUIRE(H5Dwrite_chunk(d, H5P_DEFAULT, 0, off, 100, hundred.data()) >= 0);
  expect("stored 100 bytes that are not a valid deflate stream");
}

TEST_CASE("h5chunks: the inflate library names itself and its version") {
  const std::string lib = h5::inflate_library();
#if defined(DYNEMB_HAVE_LIBDEFLATE)
  CHECK(lib.rfind("libdeflate 1.", 0) == 0);
#else
  CHECK(lib.rfind("zlib 1.", 0) == 0);
#endif
  CHECK(lib.size() > std::string("zlib 1.").size());
}

TEST_CASE("h5chunks: of several bad chunks, the first is named, however the workers ran") {
  // The stored chunks are fetched on the calling thread while the workers decode those already
  // fetched, one chunk at a time: a chunk that fails to decode and one whose record is bad (the
  // fetch stops there) must be told apart by their place, not by which worker was first.
  TempDir tmp;
  const Case c{"f32 rows", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, {40, 10}, {8, 10}, 4};
  const std::vector<unsigned char> data = sample(40 * 10 * 4, 5);
  const std::vector<unsigned char> hundred(100, 0x41);
  const std::string decode = "stored 100 bytes that are not a valid deflate stream";
  const std::string record = "stored 100 bytes, unfiltered chunk needs 320";
  struct Damage {
    hsize_t row;
    unsigned mask;  // 0: a record like a deflated chunk's, bytes no stream; 3: a bad record
  };
  const auto name = [](hsize_t row, const std::string& why) {
    return "chunk " + std::to_string(row / 8) + " (offset [" + std::to_string(row) +
           ", 0]): " + why;
  };
  const std::vector<std::pair<std::vector<Damage>, std::string>> cases{
      {{{8, 0}, {24, 0}}, name(8, decode)},     // two that do not decode
      {{{8, 0}, {24, 3}}, name(8, decode)},     // a decode failure before a bad record
      {{{8, 3}, {24, 0}}, name(8, record)},     // a bad record before a decode failure
      {{{32, 0}, {16, 0}}, name(16, decode)}};  // written in the other order
  for (size_t k = 0; k < cases.size(); ++k) {
    const std::string path = tmp.file("bad" + std::to_string(k) + ".h5");
    make_file(path, c, data, /*serial=*/true);
    h5::Hid f;
    h5::Hid d = open_x(path, f);
    for (const Damage& x : cases[k].first) {
      const hsize_t off[2] = {x.row, 0};
      REQUIRE(H5Dwrite_chunk(d, H5P_DEFAULT, x.mask, off, 100, hundred.data()) >= 0);
    }
    std::vector<unsigned char> out(data.size());
    for (int rep = 0; rep < 20; ++rep)
      for (int threads : {1, 2, 8}) {
        h5::ChunkTrouble t;
        CHECK_FALSE(h5::read_chunks_parallel(d, out.data(), out.size(), threads, &t));
        CHECK(t.what == cases[k].second);
      }
  }
}
