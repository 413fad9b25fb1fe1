// lib/capture/h5util: the one checked read of an integer attribute. Attributes of every
// dataspace and type are written with the HDF5 C API; the read must accept exactly one
// integer of 1..8 bytes (scalar or a one-element array) with its real value and sign, and
// refuse anything else, saying what it is, without writing past its 8-byte value.
#include <doctest/doctest.h>
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "capture/h5util.hpp"
#include "common/error.hpp"
#include "test_capture_util.hpp"

namespace {

using dynemb::h5::AttrRead;
using dynemb::h5::IntValue;
using dynemb::testcap::TempDir;

// Attribute `name` of `obj`: `n` elements (-1: scalar, -2: null dataspace) of `type`, the
// bytes of `data` (n x the type's size, or one element for a scalar).
void put(hid_t obj, const char* name, hid_t type, int n, const void* data) {
  hid_t sp;
  if (n == -1) {
    sp = H5Screate(H5S_SCALAR);
  } else if (n == -2) {
    sp = H5Screate(H5S_NULL);
  } else {
    const hsize_t dims[1] = {hsize_t(n)};
    sp = H5Screate_simple(1, dims, nullptr);
  }
  hid_t a = H5Acreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(a >= 0);
  if (n != -2 && n != 0) REQUIRE(H5Awrite(a, type, data) >= 0);
  H5Aclose(a);
  H5Sclose(sp);
}

struct Got {
  AttrRead r;
  IntValue v;
  std::string why;
};
Got read(hid_t obj, const char* name) {
  Got g;
  g.v.bits = 0xDEADBEEF;
  g.r = dynemb::h5::read_int_attr(obj, name, g.v, g.why);
  return g;
}

}  // namespace

TEST_CASE("h5util: read_int_attr reads one integer, refuses every other form before reading") {
  TempDir tmp;
  const std::string path = tmp.file("a.h5");
  dynemb::h5::quiet();
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(f >= 0);
  const int64_t i64 = -7, one[1] = {5};
  const uint64_t u64max = UINT64_MAX, big = (uint64_t(1) << 63) + 5;
  const int32_t i32 = 42;
  const uint8_t u8 = 200;
  const unsigned char be16[2] = {0x01, 0x02};  // big-endian int16 bytes: the value 258
  std::vector<uint64_t> sixteen(16, 0x4141414141414141ULL);
  const double d = 1.0;
  put(f, "i64", H5T_STD_I64LE, -1, &i64);
  put(f, "one", H5T_STD_I64LE, 1, one);
  put(f, "u64max", H5T_STD_U64LE, -1, &u64max);
  put(f, "big", H5T_STD_U64LE, -1, &big);
  put(f, "i32", H5T_STD_I32LE, -1, &i32);
  put(f, "u8", H5T_STD_U8LE, -1, &u8);
  put(f, "be16", H5T_STD_I16BE, -1, be16);
  put(f, "arr16", H5T_STD_U64LE, 16, sixteen.data());
  put(f, "arr2", H5T_STD_U64LE, 2, sixteen.data());
  put(f, "arr0", H5T_STD_I64LE, 0, nullptr);
  put(f, "null", H5T_STD_I64LE, -2, nullptr);
  put(f, "f64", H5T_IEEE_F64LE, -1, &d);
  {
    hid_t s = H5Tcopy(H5T_C_S1);
    H5Tset_size(s, 16);
    put(f, "str", s, -1, "4141414141414141");
    H5Tclose(s);
    hid_t c = H5Tcreate(H5T_COMPOUND, 16);
    H5Tinsert(c, "a", 0, H5T_STD_I64LE);
    H5Tinsert(c, "b", 8, H5T_STD_I64LE);
    put(f, "cmpd", c, -1, sixteen.data());
    H5Tclose(c);
    // A 16-byte integer: HDF5 allows it; the 8-byte value could not hold it.
    hid_t wide = H5Tcopy(H5T_STD_U64LE);
    REQUIRE(H5Tset_size(wide, 16) >= 0);
    put(f, "u128", wide, -1, sixteen.data());
    H5Tclose(wide);
  }

  Got g = read(f, "i64");
  CHECK(g.r == AttrRead::ok);
  CHECK(g.v.is_signed);
  CHECK(g.v.as_int64() == -7);
  CHECK(g.v.str() == "-7");
  g = read(f, "one");
  CHECK(g.r == AttrRead::ok);
  CHECK(g.v.as_int64() == 5);
  g = read(f, "u64max");
  CHECK(g.r == AttrRead::ok);
  CHECK_FALSE(g.v.is_signed);
  CHECK_FALSE(g.v.fits_int64());
  CHECK(g.v.bits == UINT64_MAX);
  CHECK(g.v.str() == "18446744073709551615");
  g = read(f, "big");
  CHECK(g.r == AttrRead::ok);
  CHECK(g.v.str() == "9223372036854775813");
  g = read(f, "i32");
  CHECK(g.r == AttrRead::ok);
  CHECK(g.v.as_int64() == 42);
  g = read(f, "u8");
  CHECK(g.r == AttrRead::ok);
  CHECK(g.v.str() == "200");
  CHECK(g.v.fits_int64());
  g = read(f, "be16");
  CHECK(g.r == AttrRead::ok);
  CHECK(g.v.as_int64() == 0x0102);

  g = read(f, "absent");
  CHECK(g.r == AttrRead::missing);
  CHECK(g.v.bits == 0xDEADBEEF);  // untouched

  const std::vector<std::pair<const char*, const char*>> bad = {
      {"arr16", "is uint64 array of shape [16], want one integer"},
      {"arr2", "is uint64 array of shape [2], want one integer"},
      {"arr0", "is int64 array of shape [0], want one integer"},
      {"null", "is null dataspace (no value), want one integer"},
      {"f64", "is float64, want one integer"},
      {"str", "is string, want one integer"},
      {"cmpd", "is compound, want one integer"},
      {"u128", "is uint128, want one integer"},
  };
  for (const auto& [name, why] : bad) {
    CAPTURE(name);
    g = read(f, name);
    CHECK(g.r == AttrRead::bad);
    CHECK(g.why == why);
    CHECK(g.v.bits == 0xDEADBEEF);  // nothing read
  }

  // The project's error: file, path and attribute named; out of int64's range refused.
  CHECK(*dynemb::h5::int64_attr(f, "i32", "x.h5", "/") == 42);
  CHECK_FALSE(dynemb::h5::int64_attr(f, "absent", "x.h5", "/").has_value());
  try {
    (void)dynemb::h5::int64_attr(f, "arr16", "x.h5", "/");
    FAIL("no error");
  } catch (const dynemb::CaptureError& e) {
    CHECK(std::string(e.what()) ==
          "x.h5:/: attribute 'arr16' is uint64 array of shape [16], want one integer");
  }
  try {
    (void)dynemb::h5::int64_attr(f, "u64max", "x.h5", "/");
    FAIL("no error");
  } catch (const dynemb::CaptureError& e) {
    CHECK(std::string(e.what()) ==
          "x.h5:/: attribute 'u64max' = 18446744073709551615 is out of range (above 2^63 - 1)");
  }
  CHECK(dynemb::h5::int_attr_value(f, "u64max", "x.h5", "/")->bits == UINT64_MAX);
  H5Fclose(f);
}
