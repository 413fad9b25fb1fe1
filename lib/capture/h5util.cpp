// HDF5 helpers shared by the capture reader and writer (see h5util.hpp).
#include "capture/h5util.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace dynemb::h5 {

void quiet() {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

namespace {
herr_t walk_cb(unsigned n, const H5E_error2_t* err, void* data) {
  // Walked upward: n == 0 is the innermost (most specific) error.
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err && err->desc) *out = err->desc;
  return 0;
}
}  // namespace

std::string last_error() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, &msg);
  H5Eclear2(H5E_DEFAULT);
  // The file driver's dump ("file write failed: time = ..., filename = ..., file descriptor =
  // 3, errno = 28, error message = 'No space left on device', buf = ..., ...") reduced to
  // "file write failed: No space left on device".
  const std::string key = "error message = '";
  const size_t at = msg.find(key);
  if (at != std::string::npos) {
    const size_t end = msg.find('\'', at + key.size());
    const size_t colon = msg.find(':');
    if (end != std::string::npos && colon != std::string::npos && colon < at)
      msg = msg.substr(0, colon) + ": " + msg.substr(at + key.size(), end - at - key.size());
  }
  const size_t nl = msg.find('\n');
  if (nl != std::string::npos) msg.resize(nl);
  return msg;
}

Hid make_f16_type() {
  // What numpy's float16 maps to in h5py: sign bit 15, exponent 10..14 (bias 15), mantissa 0..9.
  Hid t = type_id(H5Tcopy(H5T_IEEE_F32LE));
  H5Tset_fields(t, 15, 10, 5, 0, 10);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 15);
  return t;
}

Hid open_file_read_only(const std::string& path) {
  quiet();
  {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw CaptureError(path, "/", std::string("cannot open file: ") + std::strerror(errno));
    std::fclose(f);
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      throw CaptureError(path, "/", "is a directory, not a capture file");
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    last_error();
    throw CaptureError(path, "/", "not an HDF5 file (no HDF5 signature)");
  }
  Hid fid = file_id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!fid.valid())
    throw CaptureError(path, "/", "cannot open as HDF5 (truncated or damaged?): " + last_error());
  return fid;
}

bool exists(hid_t file, const std::string& path) {
  // One H5Lexists of the whole path: it resolves every intermediate component and fails
  // (negative, rather than 0) when one is missing or is not a group, which is "no" here too.
  // (Asking each prefix in turn costs a link lookup per level per prefix: quadratic in the
  // depth, and the capture's rank groups hold hundreds of links each.)
  const htri_t r = H5Lexists(file, path.c_str(), H5P_DEFAULT);
  if (r < 0) H5Eclear2(H5E_DEFAULT);
  return r > 0;
}

bool has_attr(hid_t obj, const char* name) {
  const htri_t r = H5Aexists(obj, name);
  if (r < 0) H5Eclear2(H5E_DEFAULT);
  return r > 0;
}

int64_t compact_stored_bytes(hid_t dset) {
  Hid dcpl = plist_id(H5Dget_create_plist(dset));
  return compact_stored_bytes(dset, dcpl.valid() ? dcpl.get() : H5I_INVALID_HID);
}

int64_t compact_stored_bytes(hid_t dset, hid_t dcpl) {
  if (dcpl < 0 || H5Pget_layout(dcpl) != H5D_COMPACT) return -1;
  return static_cast<int64_t>(H5Dget_storage_size(dset));
}

std::string type_name(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  const std::string bits = std::to_string(size * 8);
  switch (cls) {
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + bits;
    case H5T_FLOAT:
      return "float" + bits;
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_VLEN:
      return "vlen";
    case H5T_ARRAY:
      return "array";
    default:
      return "type class " + std::to_string(static_cast<int>(cls));
  }
}

std::string describe(hid_t type, hid_t space) {
  const H5S_class_t cls = H5Sget_simple_extent_type(space);
  if (cls == H5S_NULL) return "null dataspace (no value)";
  const std::string t = type_name(type);
  if (cls == H5S_SCALAR) return t;
  if (cls != H5S_SIMPLE) return t + " of an unreadable dataspace";
  const int nd = H5Sget_simple_extent_ndims(space);
  if (nd < 0 || nd > H5S_MAX_RANK) return t + " of an unreadable dataspace";
  std::vector<hsize_t> d(static_cast<size_t>(nd));
  if (nd > 0) H5Sget_simple_extent_dims(space, d.data(), nullptr);
  return fmt::format("{} array of shape [{}]", t, fmt::join(d, ", "));
}

std::string IntValue::str() const {
  return is_signed ? std::to_string(static_cast<int64_t>(bits)) : std::to_string(bits);
}

AttrRead read_int_attr(hid_t obj, const char* name, IntValue& out, std::string& why) {
  if (!has_attr(obj, name)) return AttrRead::missing;
  Hid a = attr_id(H5Aopen(obj, name, H5P_DEFAULT));
  if (!a.valid()) return why = "is unreadable: " + last_error(), AttrRead::bad;
  Hid t = type_id(H5Aget_type(a));
  Hid sp = space_id(H5Aget_space(a));
  if (!t.valid() || !sp.valid()) return why = "is unreadable: " + last_error(), AttrRead::bad;
  // Exactly one element: a scalar, or a simple dataspace of one point (h5py's shape (1,)).
  const H5S_class_t cls = H5Sget_simple_extent_type(sp);
  const bool one =
      cls == H5S_SCALAR || (cls == H5S_SIMPLE && H5Sget_simple_extent_npoints(sp) == 1);
  const size_t size = H5Tget_size(t);
  if (!one || H5Tget_class(t) != H5T_INTEGER || size < 1 || size > 8)
    return why = "is " + describe(t, sp) + ", want one integer", AttrRead::bad;
  // The value's stored bytes are in the object header: a damaged message can claim fewer.
  if (H5Aget_storage_size(a) < size)
    return why = fmt::format("stores {} bytes, want {} for one {}: damaged",
                             static_cast<uint64_t>(H5Aget_storage_size(a)), size, type_name(t)),
           AttrRead::bad;
  out.is_signed = H5Tget_sign(t) != H5T_SGN_NONE;
  herr_t st;
  if (out.is_signed) {
    int64_t v = 0;
    st = H5Aread(a, H5T_NATIVE_INT64, &v);
    out.bits = static_cast<uint64_t>(v);
  } else {
    uint64_t v = 0;
    st = H5Aread(a, H5T_NATIVE_UINT64, &v);
    out.bits = v;
  }
  if (st < 0) return why = "is unreadable: " + last_error(), AttrRead::bad;
  return AttrRead::ok;
}

std::optional<IntValue> int_attr_value(hid_t obj, const char* name, const std::string& file,
                                       const std::string& path) {
  IntValue v;
  std::string why;
  switch (read_int_attr(obj, name, v, why)) {
    case AttrRead::missing:
      return std::nullopt;
    case AttrRead::bad:
      throw CaptureError(file, path, fmt::format("attribute '{}' {}", name, why));
    case AttrRead::ok:
      break;
  }
  return v;
}

std::optional<int64_t> int64_attr(hid_t obj, const char* name, const std::string& file,
                                  const std::string& path) {
  const auto v = int_attr_value(obj, name, file, path);
  if (!v) return std::nullopt;
  if (!v->fits_int64())
    throw CaptureError(
        file, path,
        fmt::format("attribute '{}' = {} is out of range (above 2^63 - 1)", name, v->str()));
  return v->as_int64();
}

}  // namespace dynemb::h5
