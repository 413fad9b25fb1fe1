// The read floor (read_floor.hpp): one untimed walk that lists the datasets and sizes the
// buffer, then the timed reads.
#include "capture/read_floor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <set>
#include <vector>

#include "capture/capture_internal.hpp"
#include "capture/h5chunks.hpp"
#include "capture/h5string.hpp"
#include "capture/h5util.hpp"
#include "capture/watchdog.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"

namespace dynemb {

using h5::Hid;

namespace {

// One dataset to read: its absolute path, its logical bytes, and whether it holds
// variable-length strings (read by h5string's reader, not into the buffer).
struct FloorDataset {
  std::string path;
  uint64_t bytes = 0;
  bool vlen_string = false;
};

// The object's identity in its file, so a dataset with two hard links is read once (h5py's
// visititems, which bench/h5py_read.py counts with, visits each object once).
std::string object_key(hid_t obj) {
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info{};
  if (H5Oget_info3(obj, &info, H5O_INFO_BASIC) < 0) return "";
  return std::string(reinterpret_cast<const char*>(&info.token), sizeof(info.token));
#else
  H5O_info_t info{};
  if (H5Oget_info2(obj, &info, H5O_INFO_BASIC) < 0) return "";
  return std::to_string(info.addr);
#endif
}

// The capture being read stays named for the CLI's crash handler until the walk is done.
struct BeingRead {
  explicit BeingRead(const std::string& p) : path(p) { capture_detail::note_capture_open(p); }
  ~BeingRead() { capture_detail::note_capture_closed(path); }
  std::string path;
};

}  // namespace

ReadFloor read_floor(const std::string& path, int threads) {
  const BeingRead being_read(path);
  Hid fid = [&] {
    const capture_detail::OpenWatchdog watchdog(path);
    return h5::open_file_read_only(path);
  }();
  auto fail = [&](const std::string& where, const std::string& msg) {
    throw CaptureError(path, where, msg);
  };
  std::vector<std::string> names;
  if (std::string why; !h5::hard_link_names(fid, names, why)) fail("/", why);

  // The walk (not timed): which datasets, their sizes, and the header damage that would have
  // libhdf5 1.10 read out of bounds or allocate what the file does not hold (the capture
  // reader's own guards: capture_detail::header_trouble).
  ReadFloor r;
  r.threads = threads > 0 ? threads : hardware_threads();
  std::vector<FloorDataset> sets;
  std::set<std::string> seen;
  for (const std::string& name : names) {
    const std::string where = "/" + name;
    Hid obj(H5Oopen(fid, name.c_str(), H5P_DEFAULT), H5Oclose);
    if (!obj.valid()) fail(where, "cannot open: " + h5::last_error());
    if (H5Iget_type(obj) != H5I_DATASET) continue;
    if (const std::string key = object_key(obj); !key.empty() && !seen.insert(key).second) continue;
    Hid type = h5::type_id(H5Dget_type(obj));
    Hid space = h5::space_id(H5Dget_space(obj));
    if (!type.valid() || !space.valid()) fail(where, "unreadable header: " + h5::last_error());
    const hssize_t numel = H5Sget_simple_extent_npoints(space);
    const size_t es = H5Tget_size(type);
    if (numel < 0 || es == 0) fail(where, "unreadable extent or type: " + h5::last_error());
    FloorDataset d{where, 0, H5Tis_variable_str(type) > 0};
    if (!d.vlen_string && H5Tdetect_class(type, H5T_VLEN) > 0)
      fail(where, "holds variable-length sequences, which the read floor does not read");
    std::vector<hsize_t> extent(size_t(std::max(0, H5Sget_simple_extent_ndims(space))));
    if (!extent.empty()) H5Sget_simple_extent_dims(space, extent.data(), nullptr);
    const std::vector<int64_t> dims(extent.begin(), extent.end());
    Hid dcpl = h5::plist_id(H5Dget_create_plist(obj));
    if (std::string why =
            capture_detail::header_trouble(fid, obj, type, dcpl.valid() ? dcpl.get() : -1, dims);
        !why.empty())
      fail(where, why);
    d.bytes = uint64_t(numel) * es;
    const uint64_t stored = H5Dget_storage_size(obj);
    r.datasets += 1;
    r.logical_bytes += d.bytes;
    r.stored_bytes += stored;
    if (!d.vlen_string) r.largest_bytes = std::max(r.largest_bytes, d.bytes);
    sets.push_back(std::move(d));
  }
  // Value-initialised: its pages are touched here, not inside the timed reads.
  std::vector<unsigned char> buf(size_t(r.largest_bytes));
  const h5::RawFile raw = h5::RawFile::open_path(path);

  const auto t0 = std::chrono::steady_clock::now();
  for (const FloorDataset& d : sets) {
    Hid ds = h5::dset_id(H5Dopen2(fid, d.path.c_str(), H5P_DEFAULT));
    if (!ds.valid()) fail(d.path, "not a readable dataset: " + h5::last_error());
    std::string why;
    if (d.vlen_string) {
      std::string one;
      std::vector<std::string> many;
      Hid space = h5::space_id(H5Dget_space(ds));
      const bool ok = H5Sget_simple_extent_ndims(space) == 1
                          ? h5::read_string_list_dataset(ds, raw, INT64_MAX, many, why)
                          : h5::read_string_dataset(ds, raw, one, why);
      if (!ok) fail(d.path, why);
      continue;
    }
    if (d.bytes == 0) continue;
    h5::ChunkTrouble trouble;
    if (h5::read_chunks_parallel(ds, buf.data(), d.bytes, r.threads, &trouble)) continue;
    if (!trouble.what.empty()) fail(d.path, trouble.what);
    // Declined (not chunked, chunks never written, another filter): libhdf5's own read, of a
    // chunked dataset only after its chunks are checked (h5chunks.hpp says why).
    if (!h5::check_chunks(ds, why)) fail(d.path, why);
    Hid type = h5::type_id(H5Dget_type(ds));
    if (H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
      fail(d.path, "read failed: " + h5::last_error());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace dynemb
