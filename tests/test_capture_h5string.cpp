// lib/capture/h5string: strings read without libhdf5's variable-length path. Files are written
// here with the HDF5 C API (variable-length as h5py writes them, fixed-length as the tool
// does), read back, then damaged byte by byte where the raw record sits.
#include <doctest/doctest.h>
#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "capture/h5string.hpp"
#include "test_capture_util.hpp"

namespace {

using dynemb::testcap::TempDir;

hid_t vlen_type() {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

// A file with a variable-length dataset /s and attribute /.a, and a fixed-length attribute
// /.fx ("fixed", space padded to 8), after a user block of `userblock` bytes (0 or >= 512):
// heap addresses are then relative to it.
void write_file(const std::string& path, const std::string& s, const std::string& a,
                hsize_t userblock) {
  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
  if (userblock) H5Pset_userblock(fcpl, userblock);
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t t = vlen_type(), sp = H5Screate(H5S_SCALAR);
  hid_t d = H5Dcreate2(f, "s", t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const char* sp_ = s.c_str();
  REQUIRE(H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, &sp_) >= 0);
  hid_t at = H5Acreate2(f, "a", t, sp, H5P_DEFAULT, H5P_DEFAULT);
  const char* ap = a.c_str();
  REQUIRE(H5Awrite(at, t, &ap) >= 0);
  hid_t ft = H5Tcopy(H5T_C_S1);
  H5Tset_size(ft, 8);
  H5Tset_strpad(ft, H5T_STR_SPACEPAD);
  hid_t fa = H5Acreate2(f, "fx", ft, sp, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(H5Awrite(fa, ft, "fixed   ") >= 0);
  H5Aclose(fa);
  H5Tclose(ft);
  H5Aclose(at);
  H5Dclose(d);
  H5Sclose(sp);
  H5Tclose(t);
  H5Fclose(f);
  H5Pclose(fcpl);
}

struct Read {
  bool ok_s, ok_a, ok_fx;
  std::string s, a, fx, why_s, why_a;
};

Read read_file(const std::string& path, bool from_image) {
  Read r{};
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
  const dynemb::h5::RawFile raw = from_image
                                      ? dynemb::h5::RawFile::from_image(bytes.data(), bytes.size())
                                      : dynemb::h5::RawFile::open_path(path);
  CHECK(raw.size() == bytes.size());
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t d = H5Dopen2(f, "s", H5P_DEFAULT);
  std::string why;
  r.ok_s = dynemb::h5::read_string_dataset(d, raw, r.s, r.why_s);
  r.ok_a = dynemb::h5::read_string_attr(f, "a", raw, r.a, r.why_a);
  r.ok_fx = dynemb::h5::read_string_attr(f, "fx", raw, r.fx, why);
  H5Dclose(d);
  H5Fclose(f);
  return r;
}

// Offset of the dataset's raw record [u32 length | u64 heap address | u32 index].
uint64_t record_offset(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "s", H5P_DEFAULT);
  const haddr_t off = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  REQUIRE(off != HADDR_UNDEF);
  return off;
}

void patch(const std::string& path, uint64_t offset, const void* bytes, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  REQUIRE(f);
  REQUIRE(std::fseek(f, static_cast<long>(offset), SEEK_SET) == 0);
  REQUIRE(std::fwrite(bytes, 1, n, f) == n);
  std::fclose(f);
}

}  // namespace

TEST_CASE("h5string: variable- and fixed-length strings read back as written") {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string long_s(10000, 'x');  // larger than a 4 KiB heap collection
  for (hsize_t userblock : {hsize_t{0}, hsize_t{512}})
    for (bool image : {false, true})
      for (const auto& [s, a] : {std::pair<std::string, std::string>{"plan: yaml\n", "hash64"},
                                 {"", "é ü"},
                                 {long_s, std::string(300, 'y')}}) {
        CAPTURE(userblock);
        CAPTURE(image);
        TempDir tmp;
        const std::string path = tmp.file("s.h5");
        write_file(path, s, a, userblock);
        const Read r = read_file(path, image);
        CHECK(r.ok_s);
        CHECK(r.s == s);
        CHECK(r.ok_a);
        CHECK(r.a == a);
        CHECK(r.ok_fx);
        CHECK(r.fx == "fixed");
      }
}

TEST_CASE("h5string: a damaged record is an error that names the damage, libhdf5 never sees it") {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  TempDir dir;
  const std::string path = dir.file("s.h5");
  write_file(path, "the plan", "hash64", 0);
  const uint64_t off = record_offset(path);
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> good{std::istreambuf_iterator<char>(in), {}};
  in.close();
  const auto restore = [&] { patch(path, 0, good.data(), good.size()); };
  uint64_t heap = 0;
  std::memcpy(&heap, good.data() + off + 4, 8);  // little-endian host, as the file
  REQUIRE(std::memcmp(good.data() + heap, "GCOL", 4) == 0);

  SUBCASE("length beyond the file: refused before any allocation") {
    const uint32_t len = 2994737160u;
    patch(path, off, &len, 4);
    const Read r = read_file(path, false);
    CHECK_FALSE(r.ok_s);
    CHECK(r.why_s ==
          "variable-length string: claims 2994737160 bytes, more than the whole file "
          "holds (" +
              std::to_string(good.size()) + " bytes): damaged");
    CHECK(r.ok_a);  // the attribute's own record is intact
    CHECK(r.a == "hash64");
  }
  SUBCASE("length beyond its heap object") {
    const uint32_t len = 9;  // "the plan" has 8
    patch(path, off, &len, 4);
    const Read r = read_file(path, false);
    CHECK_FALSE(r.ok_s);
    CHECK(r.why_s.find("claims 9 bytes; its global heap object") != std::string::npos);
  }
  SUBCASE("heap address of something else") {
    const uint64_t addr = 0;
    patch(path, off + 4, &addr, 8);
    const Read r = read_file(path, false);
    CHECK(r.why_s == "variable-length string: no global heap collection at offset 0: damaged");
  }
  SUBCASE("heap address past the end") {
    const uint64_t addr = uint64_t{1} << 40;
    patch(path, off + 4, &addr, 8);
    const Read r = read_file(path, false);
    CHECK(r.why_s.find("lies past the end of the file") != std::string::npos);
  }
  SUBCASE("object index not in the collection") {
    const uint32_t idx = 999;
    patch(path, off + 12, &idx, 4);
    const Read r = read_file(path, false);
    CHECK(r.why_s.find("global heap object 999 not found in the collection at offset " +
                       std::to_string(heap)) != std::string::npos);
  }
  SUBCASE("collection size past the end of the file") {
    const uint64_t size = good.size();  // from `heap`, past the end
    patch(path, heap + 8, &size, 8);
    const Read r = read_file(path, false);
    CHECK(r.why_s.find("claims " + std::to_string(good.size()) + " bytes, past the end") !=
          std::string::npos);
    CHECK_FALSE(r.ok_a);  // the attribute's string is in the same collection
  }
  SUBCASE("a zero-size free-space object first (libhdf5 1.10 loops on it)") {
    // The first object slot (header 16 bytes in) becomes index 0 with size 0: nothing is
    // found after the free space, and the walk ends.
    const unsigned char zero[16] = {};
    patch(path, heap + 16, zero, sizeof zero);
    const Read r = read_file(path, false);
    CHECK_FALSE(r.ok_s);
    CHECK(r.why_s.find("not found in the collection") != std::string::npos);
  }
  restore();
  const Read r = read_file(path, false);
  CHECK(r.ok_s);
  CHECK(r.s == "the plan");
}
