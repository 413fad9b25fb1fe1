// Small RAII + error helpers over the HDF5 C API, private to lib/capture.
// HDF5's automatic error printing is turned off; a failed call becomes a CaptureError that
// names the file, the HDF5 path and HDF5's own innermost message.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"

namespace dynemb::h5 {

// The link info H5Literate / H5Lvisit hand their callbacks (their "2" forms from 1.12 on).
#if H5_VERSION_GE(1, 12, 0)
using LinkInfo = H5L_info2_t;
#else
using LinkInfo = H5L_info_t;
#endif

// Turns off HDF5's automatic error printing on this thread's default stack (idempotent).
void quiet();

// HDF5's innermost error description of the last failed call ("" when none).
std::string last_error();

// An owned hid_t with the close function of its kind.
class Hid {
 public:
  using CloseFn = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, CloseFn close) : id_(id), close_(close) {}
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  operator hid_t() const { return id_; }
  // Gives up ownership (the caller closes it and checks the result).
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_ = -1;
  CloseFn close_ = nullptr;
};

inline Hid file_id(hid_t id) {
  return Hid(id, H5Fclose);
}
inline Hid group_id(hid_t id) {
  return Hid(id, H5Gclose);
}
inline Hid dset_id(hid_t id) {
  return Hid(id, H5Dclose);
}
inline Hid space_id(hid_t id) {
  return Hid(id, H5Sclose);
}
inline Hid type_id(hid_t id) {
  return Hid(id, H5Tclose);
}
inline Hid attr_id(hid_t id) {
  return Hid(id, H5Aclose);
}
inline Hid plist_id(hid_t id) {
  return Hid(id, H5Pclose);
}

// IEEE binary16, little-endian (the type numpy/h5py use for float16).
Hid make_f16_type();

// Opens `path` read-only for libhdf5, telling "cannot open file: <errno's reason>" (missing,
// permission denied), "is a directory", "not an HDF5 file" and "cannot open as HDF5
// (truncated or damaged?)" apart before libhdf5's generic message; each a CaptureError(path,
// "/", ...). Turns off HDF5's error printing on this thread first.
Hid open_file_read_only(const std::string& path);

// True when `path` (absolute, "/a/b") exists as a link in `file`, checking each component.
bool exists(hid_t file, const std::string& path);

// Integer or string attribute helpers; nullopt-style via `found`.
bool has_attr(hid_t obj, const char* name);

// Bytes a compact dataset (its data inside the object header) stores, -1 for other layouts.
// libhdf5 1.10 copies the extent's bytes from compact data without comparing them with this
// (out of bounds, or from NULL, when it is shorter: found by fuzz_capture), so readers check.
int64_t compact_stored_bytes(hid_t dset);
// The same with the dataset's creation property list given (H5Dget_create_plist copies it).
int64_t compact_stored_bytes(hid_t dset, hid_t dcpl);

// Human name of a dataset's element type: "int32", "uint16", "float16", "float32", ...
std::string type_name(hid_t type);

// What an attribute or dataset holds, for messages: "int64", "uint64 array of shape [16]",
// "string", "float64 array of shape [0]", "null dataspace (no value)".
std::string describe(hid_t type, hid_t space);

// One integer attribute value with its signedness, whatever its width in the file (1..8
// bytes): `bits` is the value as uint64 (unsigned) or an int64's two's complement (signed).
struct IntValue {
  uint64_t bits = 0;
  bool is_signed = true;
  bool fits_int64() const { return is_signed || bits <= uint64_t(INT64_MAX); }
  int64_t as_int64() const { return static_cast<int64_t>(bits); }
  std::string str() const;  // the real value in decimal ("18446744073709551615", "-3")
};

enum class AttrRead { ok, missing, bad };

// THE read of an integer attribute (the capture reader and merge both use it): before any
// byte is read, its dataspace must hold exactly one element (scalar, or simple of one point)
// and its type must be an integer class of 1..8 bytes, so the read fills one 8-byte value
// whatever the file claims. `bad` with `why` ("is uint64 array of shape [16], want one
// integer", "is string, want one integer", "is unreadable: ...") otherwise.
AttrRead read_int_attr(hid_t obj, const char* name, IntValue& out, std::string& why);

// read_int_attr with the project's error: nullopt when missing; CaptureError(file, path,
// "attribute 'NAME' is ...") when it is not one integer, or (int64_attr) an unsigned value that
// int64 cannot hold.
std::optional<IntValue> int_attr_value(hid_t obj, const char* name, const std::string& file,
                                       const std::string& path);
std::optional<int64_t> int64_attr(hid_t obj, const char* name, const std::string& file,
                                  const std::string& path);

}  // namespace dynemb::h5
