#include "capture/h5string.hpp"

#include <fmt/format.h>
#include <sys/types.h>

#include <cstring>
#include <mutex>

#include "capture/h5chunks.hpp"
#include "capture/h5util.hpp"

namespace dynemb::h5 {

// ------------------------------------------------------------------------------- RawFile

RawFile RawFile::open_path(const std::string& path) {
  RawFile r;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    r.file_.reset(f, &std::fclose);
    if (fseeko(f, 0, SEEK_END) == 0) {
      const off_t end = ftello(f);
      r.size_ = end > 0 ? static_cast<uint64_t>(end) : 0;
    }
  }
  return r;
}

RawFile RawFile::from_image(const void* image, size_t size) {
  RawFile r;
  const auto* p = static_cast<const unsigned char*>(image);
  r.image_ = std::make_shared<const std::vector<unsigned char>>(p, p + size);
  r.size_ = size;
  return r;
}

bool RawFile::read(uint64_t offset, void* buf, size_t n) const {
  if (offset > size_ || n > size_ - offset) return false;
  if (image_) {
    std::memcpy(buf, image_->data() + offset, n);
    return true;
  }
  return file_ && fseeko(file_.get(), static_cast<off_t>(offset), SEEK_SET) == 0 &&
         std::fread(buf, 1, n, file_.get()) == n;
}

namespace {

// ------------------------------------------------- the raw record, through libhdf5 safely

// Destination of the registered conversion: one opaque element per string,
// [u8 record size | 7 bytes unused | the record as stored (<= 24 bytes)].
constexpr const char* kRecordTag = "dynemb.vlen-string-record";
constexpr size_t kRecordElem = 32, kRecordAt = 8;

// A soft conversion (variable-length string -> our opaque type) that copies each element's
// raw record instead of resolving it: libhdf5 hands a conversion the elements as stored in the
// file (for attributes and datasets alike), and with this path it never touches the heap.
herr_t copy_vlen_records(hid_t src, hid_t dst, H5T_cdata_t* cdata, size_t nelmts, size_t buf_stride,
                         size_t /*bkg_stride*/, void* buf, void* /*bkg*/, hid_t /*dxpl*/) {
  switch (cdata->command) {
    case H5T_CONV_INIT: {
      if (H5Tget_class(dst) != H5T_OPAQUE || H5Tis_variable_str(src) <= 0) return -1;
      char* tag = H5Tget_tag(dst);
      const bool ours = tag && std::strcmp(tag, kRecordTag) == 0;
      H5free_memory(tag);
      if (!ours) return -1;  // someone else's opaque type: not a path of ours
      cdata->need_bkg = H5T_BKG_NO;
      return 0;
    }
    case H5T_CONV_FREE:
      return 0;
    case H5T_CONV_CONV: {
      const size_t ss = H5Tget_size(src), ds = H5Tget_size(dst);
      if (ss == 0 || ss > kRecordElem - kRecordAt || ds != kRecordElem) return -1;
      const size_t s_step = buf_stride ? buf_stride : ss, d_step = buf_stride ? buf_stride : ds;
      auto* b = static_cast<unsigned char*>(buf);
      // In place and growing (ds > ss): last element first, through a copy.
      for (size_t i = nelmts; i-- > 0;) {
        unsigned char e[kRecordElem] = {};
        e[0] = static_cast<unsigned char>(ss);
        std::memcpy(e + kRecordAt, b + i * s_step, ss);
        std::memcpy(b + i * d_step, e, ds);
      }
      return 0;
    }
  }
  return -1;
}

// The opaque memory type of one record, with the conversion registered (once per process).
Hid record_type() {
  static std::once_flag once;
  std::call_once(once, [] {
    Hid src = type_id(H5Tcopy(H5T_C_S1));
    H5Tset_size(src, H5T_VARIABLE);
    Hid dst = type_id(H5Tcreate(H5T_OPAQUE, kRecordElem));
    H5Tset_tag(dst, kRecordTag);
    H5Tregister(H5T_PERS_SOFT, "dynemb_vlen_string_record", src, dst, copy_vlen_records);
  });
  Hid t = type_id(H5Tcreate(H5T_OPAQUE, kRecordElem));
  H5Tset_tag(t, kRecordTag);
  return t;
}

// ------------------------------------------------------- the global heap, bounds-checked

uint64_t le(const unsigned char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = v << 8 | p[i];
  return v;
}

struct Geometry {
  uint64_t base = 0;  // file addresses are relative to it (the user block's size)
  size_t sizeof_addr = 8, sizeof_size = 8;
};

bool geometry(hid_t obj, Geometry& g, std::string& why) {
  Hid f = file_id(H5Iget_file_id(obj));
  Hid fcpl = f.valid() ? plist_id(H5Fget_create_plist(f)) : Hid();
  hsize_t ub = 0;
  if (!fcpl.valid() || H5Pget_sizes(fcpl, &g.sizeof_addr, &g.sizeof_size) < 0 ||
      H5Pget_userblock(fcpl, &ub) < 0)
    return why = "cannot read the file's address sizes: " + last_error(), false;
  const auto ok = [](size_t s) { return s == 2 || s == 4 || s == 8; };
  if (!ok(g.sizeof_addr) || !ok(g.sizeof_size))
    return why = fmt::format(
               "file addresses of {} bytes and lengths of {} bytes are not "
               "supported for variable-length strings",
               g.sizeof_addr, g.sizeof_size),
           false;
  g.base = ub;
  return true;
}

// Resolves one record [u32 length | heap collection address | u32 object index] to the
// string's bytes. Layout (HDF5 file format, global heap): collection = "GCOL", u8 version 1,
// 3 reserved, collection size (sizeof_size, the whole collection incl. this header); objects
// start at the header's size rounded up to 8, each [u16 index | u16 refcount | u32 reserved |
// object size (sizeof_size) | data, padded to a multiple of 8]; index 0 is the free space.
bool resolve(const unsigned char* rec, size_t rec_size, const Geometry& g, const RawFile& raw,
             std::string& out, std::string& why) {
  const auto fail = [&](const std::string& s) {
    return why = "variable-length string: " + s, false;
  };
  if (rec_size != 4 + g.sizeof_addr + 4)
    return fail(fmt::format("record of {} bytes, want {}", rec_size, 4 + g.sizeof_addr + 4));
  const uint64_t len = le(rec, 4), addr = le(rec + 4, g.sizeof_addr),
                 index = le(rec + 4 + g.sizeof_addr, 4);
  out.clear();
  if (len == 0) return true;  // empty (or nil) string: no heap object
  // libhdf5 would allocate and zero `len` bytes before looking at the heap.
  if (len > raw.size())
    return fail(fmt::format("claims {} bytes, more than the whole file holds ({} bytes): damaged",
                            len, raw.size()));
  const uint64_t at = g.base + addr;
  const size_t hdr = 8 + g.sizeof_size, hdr_aligned = (hdr + 7) & ~size_t{7};
  unsigned char h[16];
  if (addr > raw.size() || !raw.read(at, h, hdr))
    return fail(fmt::format("global heap at offset {} lies past the end of the file ({} bytes)", at,
                            raw.size()));
  if (std::memcmp(h, "GCOL", 4) != 0)
    return fail(fmt::format("no global heap collection at offset {}: damaged", at));
  if (h[4] != 1)
    return fail(fmt::format("global heap collection at offset {} has version {}, want 1", at,
                            static_cast<int>(h[4])));
  const uint64_t coll = le(h + 8, g.sizeof_size);
  if (coll < hdr_aligned || coll > raw.size() - at)
    return fail(
        fmt::format("global heap collection at offset {} claims {} bytes, past the end "
                    "of the file ({} bytes)",
                    at, coll, raw.size()));
  std::vector<unsigned char> c(static_cast<size_t>(coll));
  if (!raw.read(at, c.data(), c.size()))
    return fail(fmt::format("cannot read the global heap collection at offset {}", at));
  const size_t objhdr = 8 + g.sizeof_size;
  for (size_t p = hdr_aligned; p + objhdr <= c.size();) {
    const uint64_t idx = le(&c[p], 2), size = le(&c[p + 8], g.sizeof_size);
    if (idx == 0) break;  // the free space: no objects after it
    if (size > c.size() - p - objhdr)
      return fail(
          fmt::format("global heap object {} at offset {} claims {} bytes, past its "
                      "collection",
                      idx, at + p, size));
    if (idx == index) {
      if (len > size)
        return fail(
            fmt::format("claims {} bytes; its global heap object {} holds {}", len, index, size));
      const char* s = reinterpret_cast<const char*>(&c[p + objhdr]);
      out.assign(s, strnlen(s, static_cast<size_t>(len)));  // a C string ends at a NUL
      return true;
    }
    p += objhdr + static_cast<size_t>((size + 7) & ~uint64_t{7});
  }
  return fail(
      fmt::format("global heap object {} not found in the collection at offset {}", index, at));
}

// Reads the `count` strings of a string-typed attribute or dataset through
// `read(mem_type, buf)`; count < 0: any number up to `max_count`.
template <class Read>
bool read_strings(hid_t obj, hid_t type, hid_t space, const RawFile& raw, Read read, int64_t count,
                  int64_t max_count, std::vector<std::string>& out, std::string& why) {
  if (H5Tget_class(type) != H5T_STRING) return why = type_name(type) + ", want a string", false;
  const int64_t n = H5Sget_simple_extent_npoints(space);
  if (count >= 0 && n != count)
    return why = count == 1 ? "want a single string" : fmt::format("want {} strings", count), false;
  if (n < 0 || n > max_count)
    return why = fmt::format("{} strings, want at most {}", n, max_count), false;
  out.assign(static_cast<size_t>(n), std::string());
  if (n == 0) return true;
  if (H5Tis_variable_str(type) > 0) {
    Geometry g;
    if (!geometry(obj, g, why)) return false;
    Hid mt = record_type();
    std::vector<unsigned char> e(static_cast<size_t>(n) * kRecordElem, 0);
    if (read(mt.get(), static_cast<void*>(e.data())) < 0) return why = last_error(), false;
    for (int64_t i = 0; i < n; ++i) {
      const unsigned char* rec = &e[static_cast<size_t>(i) * kRecordElem];
      if (!resolve(rec + kRecordAt, rec[0], g, raw, out[size_t(i)], why)) return false;
    }
    return true;
  }
  // A fixed-length string is stored whole in the file (object header or data): a damaged
  // datatype can claim any size, so bound it by the file before allocating.
  const size_t size = H5Tget_size(type);
  if (size == 0 || size > raw.size() / static_cast<uint64_t>(n))
    return why = fmt::format("{} of {} bytes in a file of {} bytes: damaged",
                             n == 1 ? std::string("fixed-length string")
                                    : fmt::format("{} fixed-length strings", n),
                             size, raw.size()),
           false;
  std::vector<char> buf(size * static_cast<size_t>(n) + 1, '\0');
  Hid mt = type_id(H5Tcopy(type));
  if (read(mt.get(), static_cast<void*>(buf.data())) < 0) return why = last_error(), false;
  for (int64_t i = 0; i < n; ++i) {
    const char* s = &buf[static_cast<size_t>(i) * size];
    std::string& o = out[size_t(i)];
    o.assign(s, strnlen(s, size));  // fixed strings are NUL- or space-padded
    while (!o.empty() && o.back() == ' ') o.pop_back();
  }
  return true;
}

template <class Read>
bool read_string(hid_t obj, hid_t type, hid_t space, const RawFile& raw, Read read,
                 std::string& out, std::string& why) {
  std::vector<std::string> v;
  if (!read_strings(obj, type, space, raw, read, 1, 1, v, why)) return false;
  out = std::move(v[0]);
  return true;
}

}  // namespace

bool read_string_attr(hid_t obj, const char* name, const RawFile& raw, std::string& out,
                      std::string& why) {
  if (!has_attr(obj, name)) return why = "missing attribute", false;
  Hid a = attr_id(H5Aopen(obj, name, H5P_DEFAULT));
  if (!a.valid()) return why = "unreadable attribute: " + last_error(), false;
  Hid t = type_id(H5Aget_type(a));
  Hid sp = space_id(H5Aget_space(a));
  if (!t.valid() || !sp.valid()) return why = last_error(), false;
  return read_string(
      a, t, sp, raw, [&](hid_t mt, void* buf) { return H5Aread(a, mt, buf); }, out, why);
}

bool read_string_dataset(hid_t dset, const RawFile& raw, std::string& out, std::string& why) {
  if (!check_chunks(dset, why)) return false;  // H5Dread trusts a chunk's decoded size
  Hid t = type_id(H5Dget_type(dset));
  Hid sp = space_id(H5Dget_space(dset));
  if (!t.valid() || !sp.valid()) return why = last_error(), false;
  // One string stored compactly: its fixed size, or one raw record of a variable-length string.
  if (const int64_t stored = compact_stored_bytes(dset); stored >= 0) {
    const bool variable = H5Tis_variable_str(t) > 0;
    Geometry g;
    if (variable && !geometry(dset, g, why)) return false;
    const uint64_t want = variable ? 4 + g.sizeof_addr + 4 : H5Tget_size(t);
    if (static_cast<uint64_t>(stored) != want)
      return why =
                 fmt::format("compact string data stores {} bytes, want {}: damaged", stored, want),
             false;
  }
  return read_string(
      dset, t, sp, raw,
      [&](hid_t mt, void* buf) { return H5Dread(dset, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf); },
      out, why);
}

bool read_string_list_dataset(hid_t dset, const RawFile& raw, int64_t max_count,
                              std::vector<std::string>& out, std::string& why) {
  if (!check_chunks(dset, why)) return false;  // H5Dread trusts a chunk's decoded size
  Hid t = type_id(H5Dget_type(dset));
  Hid sp = space_id(H5Dget_space(dset));
  if (!t.valid() || !sp.valid()) return why = last_error(), false;
  if (H5Sget_simple_extent_ndims(sp) != 1) return why = "want a 1-D list of strings", false;
  return read_strings(
      dset, t, sp, raw,
      [&](hid_t mt, void* buf) { return H5Dread(dset, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf); },
      -1, max_count, out, why);
}

}  // namespace dynemb::h5
