// Capture format v1 reader (docs/capture-format.md) over the HDF5 C API: the file's root,
// /tables and one batch at a time, every shape checked against the plan before anything is
// allocated from it.
#include "capture/capture.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <thread>

#include "capture/capture_internal.hpp"
#include "capture/h5chunks.hpp"
#include "capture/h5string.hpp"
#include "capture/h5util.hpp"
#include "capture/watchdog.hpp"
#include "common/hash.hpp"
#include "common/memory.hpp"
#include "common/parallel.hpp"
#include "common/trace.hpp"
#include "engine/ops.hpp"

namespace dynemb {

using capture_detail::dtype_h5_name;
using capture_detail::shape_str;
using h5::Hid;

namespace {

std::string read_string_attr_or(hid_t obj, const char* name, const h5::RawFile& raw,
                                const std::string& dflt) {
  std::string s, why;
  return h5::read_string_attr(obj, name, raw, s, why) ? s : dflt;  // false when missing
}

// Element type of a float dataset as docs/capture-format.md encodes it; nullopt for any other.
std::optional<DType> float_dtype_of(hid_t dset, hid_t type, const h5::RawFile& raw) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT && size == 4) return DType::f32;
  if (cls == H5T_FLOAT && size == 2) return DType::f16;
  if (cls == H5T_INTEGER && size == 2 && H5Tget_sign(type) == H5T_SGN_NONE &&
      read_string_attr_or(dset, "dtype", raw, "") == "bfloat16")
    return DType::bf16;
  return std::nullopt;
}

std::string element_name(hid_t dset, hid_t type, const h5::RawFile& raw) {
  auto f = float_dtype_of(dset, type, raw);
  return f ? dtype_h5_name(*f) : h5::type_name(type);
}

// Kjt geometry, computed here so lib/capture needs no engine object code for it.
int64_t kjt_batch_size(const Kjt& k, int64_t f) {
  if (k.is_vbe()) return k.stride_per_feature[f];
  return k.num_features > 0 ? k.num_bags() / k.num_features : 0;
}
// B, or max_f B_f for VBE (what EmbeddingCollection pads to).
int64_t kjt_stride(const Kjt& k) {
  if (!k.is_vbe()) return kjt_batch_size(k, 0);
  int64_t m = 0;
  for (int64_t b : k.stride_per_feature) m = std::max(m, b);
  return m;
}
int64_t kjt_bag_begin(const Kjt& k, int64_t f) {
  if (!k.is_vbe()) return f * kjt_batch_size(k, 0);
  int64_t s = 0;
  for (int64_t i = 0; i < f; ++i) s += k.stride_per_feature[i];
  return s;
}

}  // namespace

// ------------------------------------------------------------------------------- reader

namespace capture_detail {

std::string header_trouble(hid_t fid, hid_t dset, hid_t type, hid_t dcpl,
                           const std::vector<int64_t>& dims) {
  // A damaged header can claim any extent: refuse what no capture holds (> 2^38 bytes in
  // one dataset of one rank) before anything is allocated from it.
  constexpr double kMaxBytes = 274877906944.0;  // 2^38
  double bytes = static_cast<double>(H5Tget_size(type));
  for (int64_t x : dims) bytes *= static_cast<double>(x);
  if (bytes > kMaxBytes)
    return fmt::format("extent {} is implausibly large ({:.3g} bytes)", shape_str(dims), bytes);
  // Below that cap a damaged header can still claim gigabytes that the file does not hold
  // (unwritten chunks read back as fill values). A real capture stores its data: deflate
  // compresses at most ~1032:1, so a claim beyond kMaxRatio x the bytes stored (and past a
  // small floor that leaves tiny, fill-valued datasets alone) is refused before allocation.
  // Contiguous data must lie inside the file: a truncated copy, or a damaged address, would
  // otherwise have libhdf5 1.10 read past its buffer of an in-memory image (found by
  // fuzz_capture) or return garbage.
  // Chunks likewise (libhdf5's sieve buffer is sized by the file, and a chunk claimed past
  // its end is copied out of bounds); checked up to kMaxCheckedChunks chunks, as
  // H5Dget_chunk_info walks the index from the start on every call.
  hsize_t fsize = 0;
  if (bytes > 0 && H5Fget_filesize(fid, &fsize) >= 0) {
    auto past_eof = [&](haddr_t addr, double n, const char* what) -> std::string {
      if (addr != HADDR_UNDEF && (addr > fsize || n > static_cast<double>(fsize - addr)))
        return fmt::format(
            "{} of extent {} ({:.0f} bytes at offset {}) lies past the end "
            "of the file ({} bytes): truncated or damaged",
            what, shape_str(dims), n, static_cast<uint64_t>(addr), static_cast<uint64_t>(fsize));
      return "";
    };
    if (std::string why = past_eof(H5Dget_offset(dset), bytes, "data");  // HADDR_UNDEF unless
        !why.empty())                                                    // contiguous
      return why;
    if (const int64_t stored = h5::compact_stored_bytes(dset, dcpl);
        stored >= 0 && static_cast<double>(stored) != bytes)
      return fmt::format("compact data of extent {} stores {} bytes, want {:.0f}: damaged",
                         shape_str(dims), stored, bytes);
    hsize_t nchunks = 0;
    constexpr hsize_t kMaxCheckedChunks = 256;
    if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED) {
      // Without filters a chunk stores exactly its bytes; a shorter one is copied from out
      // of bounds by libhdf5 1.10 (found by fuzz_capture).
      double raw_chunk = static_cast<double>(H5Tget_size(type));
      std::vector<hsize_t> cdims(dims.size());
      const int crank = H5Pget_chunk(dcpl, static_cast<int>(cdims.size()), cdims.data());
      // A chunk has the dataset's rank; a damaged layout can claim another (fills only the
      // first min(rank, crank) of cdims: found by fuzz_capture, a scalar with chunk rank 1).
      if (crank != static_cast<int>(cdims.size()))
        return fmt::format("chunk rank {} != rank {} of extent {}: damaged", crank, cdims.size(),
                           shape_str(dims));
      for (int i = 0; i < crank; ++i) raw_chunk *= static_cast<double>(cdims[i]);
      const bool unfiltered = H5Pget_nfilters(dcpl) == 0;
      Hid space = h5::space_id(H5Dget_space(dset));
      if (H5Dget_num_chunks(dset, space, &nchunks) >= 0 && nchunks <= kMaxCheckedChunks)
        for (hsize_t i = 0; i < nchunks; ++i) {
          unsigned mask = 0;
          haddr_t caddr = HADDR_UNDEF;
          hsize_t csize = 0;
          if (H5Dget_chunk_info(dset, space, i, nullptr, &mask, &caddr, &csize) < 0)
            return "unreadable chunk index: " + h5::last_error();
          if (std::string why = past_eof(caddr, static_cast<double>(csize), "a chunk");
              !why.empty())
            return why;
          if (unfiltered && crank > 0 && static_cast<double>(csize) != raw_chunk)
            return fmt::format("chunk {} stores {} bytes, want {} (no filters): damaged",
                               static_cast<uint64_t>(i), static_cast<uint64_t>(csize), raw_chunk);
        }
    }
  }
  constexpr double kFloorBytes = 64.0 * 1024 * 1024;
  constexpr double kMaxRatio = 1100.0;
  if (bytes > kFloorBytes) {
    const double stored = static_cast<double>(H5Dget_storage_size(dset));
    if (bytes > kMaxRatio * stored)
      return fmt::format(
          "extent {} claims {:.3g} bytes but the file stores only {:.0f} "
          "bytes for it (a damaged header, or chunks never written)",
          shape_str(dims), bytes, stored);
  }
  // A filter this reader cannot undo (h5py's lzf) is named here, before libhdf5 reports it
  // as "can't open directory <plugin path>".
  if (std::string why = dcpl >= 0 ? h5::filters_trouble_of(dcpl) : h5::filters_trouble(dset);
      !why.empty())
    return why;
  // Each stored chunk's record (size, filter mask) against the chunk shape, from the chunk
  // index alone, so `validate --capture` (which reads shapes, not data) names a bad one too;
  // for chunk grids of up to kMaxRecordChecks chunks (one index look-up each). Decoded sizes are
  // checked when the data is read.
  constexpr hsize_t kMaxRecordChecks = 4096;
  if (std::string why;
      !(dcpl >= 0 ? h5::check_chunks(dset, dcpl, why, false, kMaxRecordChecks)
                  : h5::check_chunks(dset, why, /*decode_too=*/false, kMaxRecordChecks)))
    return why;
  return "";
}

// The shapes of a batch's optional parts that depend on every rank's KJT (sum_s B_s, the
// routing of the ids), and the float dtypes they must have.
struct BatchGeometry {
  bool sequence = false;
  bool pooled_vbe = false;
  int64_t sum_b = 0;            // sum_s B_s (sequence pads VBE to max_f B_f)
  int64_t sum_bags = 0;         // sum_s sum_f B_{s,f}
  int64_t vbe_local = 0;        // pooled VBE local_embs elements: sum_s sum_f B_{s,f} D_f
  std::vector<int64_t> routed;  // [W] ids each rank looks up (sequence only)
  DType data_type = DType::f32;
  DType out_type = DType::f32;
};

}  // namespace capture_detail
using capture_detail::BatchGeometry;

struct CaptureReader::Impl {
  std::string file;
  Hid fid;
  h5::RawFile raw;  // the same file's bytes, for strings (h5string.hpp)

  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw CaptureError(file, path, msg);
  }

  struct Ds {
    Hid d, t;
    Hid dcpl;  // creation properties (layout, filters), fetched once: H5Dget_create_plist copies
    std::vector<int64_t> dims;
    int64_t numel = 0;
    std::string path;
  };

  std::optional<Ds> try_open(const std::string& path) const {
    if (!h5::exists(fid, path)) return std::nullopt;
    Ds ds;
    ds.path = path;
    ds.d = h5::dset_id(H5Dopen2(fid, path.c_str(), H5P_DEFAULT));
    if (!ds.d.valid()) fail(path, "not a readable dataset: " + h5::last_error());
    ds.t = h5::type_id(H5Dget_type(ds.d));
    ds.dcpl = h5::plist_id(H5Dget_create_plist(ds.d));
    Hid sp = h5::space_id(H5Dget_space(ds.d));
    const int nd = H5Sget_simple_extent_ndims(sp);
    if (nd < 0) fail(path, "unreadable dataspace: " + h5::last_error());
    std::vector<hsize_t> d(static_cast<size_t>(nd));
    if (nd > 0) H5Sget_simple_extent_dims(sp, d.data(), nullptr);
    for (hsize_t x : d) ds.dims.push_back(static_cast<int64_t>(x));
    ds.numel = 1;
    if (std::string why = capture_detail::header_trouble(
            fid, ds.d, ds.t, ds.dcpl.valid() ? ds.dcpl.get() : -1, ds.dims);
        !why.empty())
      fail(path, why);
    for (int64_t x : ds.dims) ds.numel *= x;
    return ds;
  }
  Ds open(const std::string& path) const {
    auto ds = try_open(path);
    if (!ds) fail(path, "missing dataset");
    return std::move(*ds);
  }
  // The datasets of batch `k` that read_rank_rows opened, open until another batch is read: a
  // batch replayed one destination at a time reads some rows of each sender's local_embs for
  // every destination, W^2 reads of W datasets, and each open walks the group and checks the
  // header (try_open). Called, as every libhdf5 call here, by one thread at a time.
  struct RowsDs;
  const RowsDs& open_rows_dataset(int64_t k, const std::string& path) const {
    if (k != rows_batch) {
      rows_open.clear();
      rows_batch = k;
    }
    auto it = rows_open.find(path);
    if (it == rows_open.end()) {
      RowsDs r{open(path), nullptr};
      r.layout = h5::readable_layout(r.ds.d, r.ds.dcpl.valid() ? r.ds.dcpl.get() : -1);
      it = rows_open.emplace(path, std::move(r)).first;
    }
    return it->second;
  }
  struct RowsDs {
    Ds ds;
    std::shared_ptr<const h5::Layout> layout;  // null: not read by chunks
  };
  mutable std::map<std::string, RowsDs> rows_open;
  mutable int64_t rows_batch = -1;

  // Int64 datasets of the batch being read, decoded as one stream by prefetch_ints before
  // read_batch reads them one after another (each a few chunks: alone, they keep few cores
  // busy). read_ints takes a dataset's values from here, after every check of it; whatever is
  // not taken is dropped when the batch's read ends (PrefetchedBatch).
  mutable std::map<std::string, std::vector<int64_t>> prefetched;
  void prefetch_ints(const std::vector<std::string>& paths) const;

  // Signed integer of one of the given byte sizes ("int32|int64", "int64", "int32" in
  // docs/capture-format.md).
  void expect_int(const Ds& ds, std::initializer_list<size_t> sizes, const char* want) const {
    const bool ok_class = H5Tget_class(ds.t) == H5T_INTEGER && H5Tget_sign(ds.t) == H5T_SGN_2;
    bool ok_size = false;
    for (size_t s : sizes) ok_size |= H5Tget_size(ds.t) == s;
    if (!ok_class || !ok_size)
      fail(ds.path, fmt::format("dtype {}, want {}", element_name(ds.d, ds.t, raw), want));
  }
  void expect_shape(const Ds& ds, const std::vector<int64_t>& want, const std::string& why) const {
    if (ds.dims != want)
      fail(ds.path,
           fmt::format("shape {}, want {} ({})", shape_str(ds.dims), shape_str(want), why));
  }
  void expect_1d(const Ds& ds) const {
    if (ds.dims.size() != 1)
      fail(ds.path, fmt::format("shape {}, want a 1-D dataset", shape_str(ds.dims)));
  }

  // Chunked datasets are inflated by h5chunks.hpp (on every core when large), every chunk's
  // record and decoded size checked; into the file's element type, then converted to
  // `mem_type` in memory. What it declines (chunks never written, other layouts) goes through
  // H5Dread, chunked ones only after check_chunks: libhdf5 1.10 copies a whole chunk out of
  // a shorter one.
  void read_all(const Ds& ds, hid_t mem_type, void* out) const {
    if (ds.numel == 0) return;
    const size_t es = H5Tget_size(ds.t), ms = H5Tget_size(mem_type);
    const uint64_t bytes = uint64_t(ds.numel) * es;
    const int threads = bytes < kParallelReadBytes ? 1 : hardware_threads();
    h5::ChunkTrouble trouble;
    if (!ds.dcpl.valid() || H5Pget_layout(ds.dcpl) != H5D_CHUNKED) {
      // contiguous or compact: checked against the file when opened
    } else if (H5Tequal(ds.t, mem_type) > 0) {
      if (h5::read_chunks_parallel(ds.d, out, bytes, threads, &trouble)) return;
    } else {
      std::vector<unsigned char> buf(size_t(ds.numel) * std::max(es, ms));
      if (h5::read_chunks_parallel(ds.d, buf.data(), bytes, threads, &trouble)) {
        if (H5Tconvert(ds.t, mem_type, size_t(ds.numel), buf.data(), nullptr, H5P_DEFAULT) < 0)
          fail(ds.path, fmt::format("{} to {}: {}", h5::type_name(ds.t), h5::type_name(mem_type),
                                    h5::last_error()));
        std::memcpy(out, buf.data(), size_t(ds.numel) * ms);
        return;
      }
    }
    if (!trouble.what.empty()) fail(ds.path, trouble.what);
    check_chunks(ds);
    if (H5Dread(ds.d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
      fail(ds.path, "read failed: " + h5::last_error());
  }
  void check_chunks(const Ds& ds) const {
    std::string why;
    if (!(ds.dcpl.valid() ? h5::check_chunks(ds.d, ds.dcpl, why) : h5::check_chunks(ds.d, why)))
      fail(ds.path, why);
  }
  bool chunked(const Ds& ds) const {
    return !ds.dcpl.valid() || H5Pget_layout(ds.dcpl) == H5D_CHUNKED;
  }
  static constexpr int64_t kParallelReadBytes = 1 << 20;

  std::vector<int64_t> read_ints(const Ds& ds) const {
    if (auto it = prefetched.find(ds.path); it != prefetched.end()) {
      std::vector<int64_t> v = std::move(it->second);
      prefetched.erase(it);
      if (int64_t(v.size()) == ds.numel) return v;
    }
    std::vector<int64_t> v(static_cast<size_t>(ds.numel));
    read_all(ds, H5T_NATIVE_INT64, v.data());
    return v;
  }
  std::vector<int32_t> read_i32(const Ds& ds) const {
    std::vector<int32_t> v(static_cast<size_t>(ds.numel));
    read_all(ds, H5T_NATIVE_INT32, v.data());
    return v;
  }
  DType float_type(const Ds& ds) const {
    auto t = float_dtype_of(ds.d, ds.t, raw);
    if (!t)
      fail(ds.path, fmt::format("dtype {}, want float32, float16 or bfloat16 (uint16 with "
                                "attribute dtype=\"bfloat16\")",
                                h5::type_name(ds.t)));
    return *t;
  }
  std::vector<float> read_floats(const Ds& ds, DType t) const {
    std::vector<float> v(static_cast<size_t>(ds.numel));
    if (ds.numel == 0) return v;
    if (t == DType::f32) {
      read_all(ds, H5T_NATIVE_FLOAT, v.data());
    } else {
      std::vector<uint16_t> bits(v.size());
      Hid half = h5::make_f16_type();
      read_all(ds, t == DType::f16 ? half.get() : H5T_NATIVE_UINT16, bits.data());
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = t == DType::f16 ? f16_bits_to_f32(bits[i]) : bf16_bits_to_f32(bits[i]);
    }
    return v;
  }

  // A required integer attribute, through the one checked read (h5util.hpp).
  int64_t int_attr(hid_t obj, const std::string& path, const char* name) const {
    const auto v = h5::int64_attr(obj, name, file, path);
    if (!v) fail(path, fmt::format("missing attribute '{}'", name));
    return *v;
  }

  void read_kjt(const Plan& plan, const std::string& rp, Kjt& kjt) const;
  std::optional<ShardingContext> read_ctx(const Plan& plan, const std::string& rp,
                                          const BatchGeometry& g, int64_t n_r) const;
  std::optional<EmbTensor> read_emb_tensor(const std::string& rp, const char* name,
                                           std::vector<int64_t> want, const std::string& why,
                                           DType want_type, const std::string& type_why,
                                           const ReadParts& parts) const;
  void read_dist_tensors(const Plan& plan, const std::string& rp, const ReadParts& parts,
                         const BatchGeometry& g, int64_t r, RankBatch& rb) const;
  void read_keys(const Plan& plan, const std::string& rp, RankBatch& rb) const;
  void read_mean_divisor(const Plan& plan, const std::string& rp, Kjt& kjt) const;
  void read_module_output(const Plan& plan, const std::string& rp, const ReadParts& parts,
                          RankBatch& rb) const;
  int64_t rows_elements(const Ds& ds, const std::string& path,
                        const std::vector<std::pair<int64_t, int64_t>>& ranges) const;
  void read_rows_into(const Ds& ds, const std::string& path, DType dtype,
                      const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t n,
                      float* out) const;
};

CaptureReader::CaptureReader(const std::string& path) try : path_(path), impl_(new Impl) {
  capture_detail::note_capture_open(path);
  const capture_detail::OpenWatchdog watchdog(path);
  Impl& I = *impl_;
  I.file = path;
  I.fid = h5::open_file_read_only(path);  // "not there" vs "not HDF5" vs "truncated"
  I.raw = h5::RawFile::open_path(path);
  read_root();
} catch (...) {
  capture_detail::clear_capture_being_read();  // no reader of it is left
}

CaptureReader::CaptureReader(const std::string& name, const void* image, size_t size)
    : path_(name), impl_(new Impl) {
  h5::quiet();
  Impl& I = *impl_;
  I.file = name;
  if (size < 8 || std::memcmp(image, "\x89HDF\r\n\x1a\n", 8) != 0)
    I.fail("/", "not an HDF5 file (no HDF5 signature)");
  // Core driver over a copy of the image, never written back (backing_store = 0).
  Hid fapl = h5::plist_id(H5Pcreate(H5P_FILE_ACCESS));
  if (!fapl.valid() || H5Pset_fapl_core(fapl, 1 << 16, 0) < 0 ||
      H5Pset_file_image(fapl, const_cast<void*>(image), size) < 0)
    I.fail("/", "cannot set up the in-memory image: " + h5::last_error());
  // libhdf5 finds an already-open file by name, also for in-memory images: a damaged image
  // whose handles libhdf5 leaked on an error path would be shared with the next image of the
  // same name (a use-after-free found by fuzz_capture). Each image gets its own internal name;
  // messages keep `name`.
  static std::atomic<uint64_t> image_seq{0};
  const std::string internal = name + "#image" + std::to_string(image_seq.fetch_add(1));
  I.fid = h5::file_id(H5Fopen(internal.c_str(), H5F_ACC_RDONLY, fapl));
  if (!I.fid.valid())
    I.fail("/", "cannot open as HDF5 (truncated or damaged?): " + h5::last_error());
  I.raw = h5::RawFile::from_image(image, size);
  read_root();
}

void CaptureReader::read_root() {
  Impl& I = *impl_;
  Hid root = h5::group_id(H5Gopen2(I.fid, "/", H5P_DEFAULT));
  if (!root.valid()) I.fail("/", "cannot open the root group: " + h5::last_error());
  std::string fmt_name, why;
  if (!h5::has_attr(root, "format"))
    I.fail("/", fmt::format("missing attribute 'format' (want \"{}\"): not a dynemb-dist capture",
                            kCaptureFormat));
  if (!h5::read_string_attr(root, "format", I.raw, fmt_name, why))
    I.fail("/", "attribute 'format': " + why);
  if (fmt_name != kCaptureFormat)
    I.fail("/", fmt::format("unknown format \"{}\" (want \"{}\")", fmt_name, kCaptureFormat));
  const int64_t version = I.int_attr(root, "/", "format_version");
  if (version != kCaptureFormatVersion)
    I.fail("/", fmt::format("unknown format_version {} (this build reads version {})", version,
                            kCaptureFormatVersion));
  world_size_ = I.int_attr(root, "/", "world_size");
  if (world_size_ < 1 || world_size_ > (1 << 20))
    I.fail("/", fmt::format("world_size {} out of range [1, 2^20]", world_size_));
  num_batches_ = I.int_attr(root, "/", "num_batches");
  if (num_batches_ < 0) I.fail("/", fmt::format("num_batches {} < 0", num_batches_));
  // num_batches is a claim: callers size loops and lists by it (replay's batch list), so check
  // it against the groups /batches really holds before anyone allocates from it.
  if (num_batches_ > 0) {
    if (!h5::exists(I.fid, "/batches"))
      I.fail("/batches", fmt::format("missing group (num_batches = {})", num_batches_));
    Hid bg = h5::group_id(H5Gopen2(I.fid, "/batches", H5P_DEFAULT));
    H5G_info_t gi{};
    if (!bg.valid() || H5Gget_info(bg, &gi) < 0)
      I.fail("/batches", "not a readable group: " + h5::last_error());
    if (static_cast<uint64_t>(num_batches_) > gi.nlinks) {
      // Some k <= nlinks is missing: name the first one.
      int64_t k = 0;
      while (k < static_cast<int64_t>(gi.nlinks) &&
             h5::exists(I.fid, fmt::format("/batches/{}", k)))
        ++k;
      I.fail(fmt::format("/batches/{}", k),
             fmt::format("missing group (num_batches = {}); /batches holds {} links", num_batches_,
                         gi.nlinks));
    }
  }

  // /plan: scalar string dataset, fixed- or variable-length.
  if (!h5::exists(I.fid, "/plan")) I.fail("/plan", "missing dataset (the plan YAML text)");
  Hid pd = h5::dset_id(H5Dopen2(I.fid, "/plan", H5P_DEFAULT));
  if (!pd.valid()) I.fail("/plan", "not a dataset: " + h5::last_error());
  if (!h5::read_string_dataset(pd, I.raw, plan_text_, why)) I.fail("/plan", why);

  if (h5::exists(I.fid, "/oracle")) {
    Hid og = h5::group_id(H5Gopen2(I.fid, "/oracle", H5P_DEFAULT));
    if (!og.valid()) I.fail("/oracle", "not a group");
    std::string kind;
    if (!h5::read_string_attr(og, "kind", I.raw, kind, why))
      I.fail("/oracle", "attribute 'kind': " + why);
    if (kind != "hash64")
      I.fail("/oracle", fmt::format("unknown oracle kind \"{}\" (want \"hash64\")", kind));
    // h5py writes a Python int below 2^63 as int64: its bits are the seed.
    const auto seed = h5::int_attr_value(og, "seed", I.file, "/oracle");
    if (!seed) I.fail("/oracle", "missing attribute 'seed'");
    oracle_seed_ = seed->bits;
  }
}

CaptureReader::~CaptureReader() {
  capture_detail::note_capture_closed(path_);
}

namespace {
herr_t collect_names(hid_t, const char* name, const h5::LinkInfo*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> CaptureReader::weight_tables() const {
  std::vector<std::string> names, out;
  if (!h5::exists(impl_->fid, "/tables")) return out;
  Hid g = h5::group_id(H5Gopen2(impl_->fid, "/tables", H5P_DEFAULT));
  if (!g.valid()) impl_->fail("/tables", "not a group");
  H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_names, &names);
  for (const auto& n : names)
    if (h5::exists(impl_->fid, "/tables/" + n + "/weight")) out.push_back(n);
  return out;
}

void CaptureReader::check_table_weight(const TableConfig& table) const {
  const Impl& I = *impl_;
  Impl::Ds ds = I.open("/tables/" + table.name + "/weight");
  const DType t = I.float_type(ds);
  if (t != table.data_type)
    I.fail(ds.path, fmt::format("dtype {}, want {} (table data_type {})", dtype_h5_name(t),
                                dtype_h5_name(table.data_type), to_string(table.data_type)));
  I.expect_shape(ds, {table.num_embeddings, table.embedding_dim}, "num_embeddings, embedding_dim");
}

std::vector<float> CaptureReader::read_table_weight(const TableConfig& table) const {
  check_table_weight(table);  // before allocating [num_embeddings * D]
  Impl::Ds ds = impl_->open("/tables/" + table.name + "/weight");
  return impl_->read_floats(ds, table.data_type);
}

void CaptureReader::Impl::read_kjt(const Plan& plan, const std::string& rp, Kjt& kjt) const {
  const int64_t F = plan.num_features();
  if (!h5::exists(fid, rp)) fail(rp, "missing group");
  Ds len = open(rp + "/lengths");
  expect_int(len, {4, 8}, "int32 or int64");
  expect_1d(len);
  Ds val = open(rp + "/values");
  expect_int(val, {4, 8}, "int32 or int64");
  expect_1d(val);
  kjt = Kjt{};
  kjt.num_features = F;
  kjt.lengths_type = H5Tget_size(len.t) == 4 ? IndexType::i32 : IndexType::i64;
  kjt.values_type = H5Tget_size(val.t) == 4 ? IndexType::i32 : IndexType::i64;

  if (auto spf = try_open(rp + "/stride_per_feature")) {
    // VBE on this rank: lengths has sum_f B_f entries.
    expect_int(*spf, {8}, "int64");
    expect_shape(*spf, {F}, "F = number of plan features");
    kjt.stride_per_feature = read_ints(*spf);
    int64_t total = 0;
    for (int64_t f = 0; f < F; ++f) {
      const int64_t b = kjt.stride_per_feature[f];
      if (b < 0 || b > len.numel)
        fail(spf->path, fmt::format("stride_per_feature[{}] = {} out of range [0, len(lengths) "
                                    "= {}]",
                                    f, b, len.numel));
      total += b;
    }
    if (total != len.numel)
      fail(len.path, fmt::format("length {} != sum(stride_per_feature) {}", len.numel, total));
  } else if (F > 0 && len.numel % F != 0) {
    fail(len.path,
         fmt::format("length {} is not a multiple of F = {} (features in the plan)", len.numel, F));
  }
  kjt.lengths = read_ints(len);
  int64_t sum = 0;
  for (int64_t i = 0; i < len.numel; ++i) {
    const int64_t l = kjt.lengths[i];
    if (l < 0) fail(len.path, fmt::format("lengths[{}] = {} < 0", i, l));
    if (l > val.numel)
      fail(len.path, fmt::format("lengths[{}] = {} > len(values) {}", i, l, val.numel));
    sum += l;
    if (sum > val.numel + std::numeric_limits<int32_t>::max()) break;  // no overflow below
  }
  if (sum != val.numel) fail(len.path, fmt::format("sum {} != len(values) {}", sum, val.numel));
  kjt.values = read_ints(val);
  if (auto w = try_open(rp + "/weights")) {
    if (H5Tget_class(w->t) != H5T_FLOAT || H5Tget_size(w->t) != 4)
      fail(w->path, fmt::format("dtype {}, want float32", element_name(w->d, w->t, raw)));
    expect_shape(*w, {val.numel}, "len(values)");
    kjt.weights = read_floats(*w, DType::f32);
    kjt.weighted = true;
  }
}

namespace {

// Plans have at most this many features; a longer `keys` list is damaged.
constexpr int64_t kMaxKeys = 1 << 20;

}  // namespace

// module_output (+ inverse_indices for a VBE KJT) of one rank-batch, pooled plans only.
void CaptureReader::Impl::read_module_output(const Plan& plan, const std::string& rp,
                                             const ReadParts& parts, RankBatch& rb) const {
  const Impl& I = *this;
  const int64_t F = plan.num_features();
  const Kjt& kjt = rb.kjt;
  std::optional<Ds> inv = I.try_open(rp + "/inverse_indices");
  std::optional<Ds> mo = I.try_open(rp + "/module_output");
  if (plan.module == ModuleKind::sequence) {
    if (mo) I.fail(mo->path, "a sequence plan has no module_output (pooled plans only)");
    return;
  }
  int64_t rows = kjt_stride(kjt);
  if (inv) {
    I.expect_int(*inv, {8}, "int64");
    if (inv->dims.size() != 2 || inv->dims[0] != F)
      I.fail(inv->path, fmt::format("shape {}, want [F = {}, B_full]", shape_str(inv->dims), F));
    rows = inv->dims[1];
    std::vector<int64_t> v = I.read_ints(*inv);
    for (int64_t f = 0; f < F; ++f)
      for (int64_t b = 0; b < rows; ++b) {
        const int64_t x = v[size_t(f * rows + b)];
        if (x < 0 || x >= kjt_batch_size(kjt, f))
          I.fail(inv->path, fmt::format("[{}, {}] = {} outside feature {}'s batch of {}", f, b, x,
                                        plan.features[f].name, kjt_batch_size(kjt, f)));
      }
    rb.inverse_indices = std::move(v);
  }
  if (!mo) return;
  if (kjt.is_vbe() && !inv)
    I.fail(mo->path,
           "a variable-batch rank-batch needs inverse_indices [F, B_full] beside module_output "
           "(the module expands the per-feature batches with them)");
  // The module divides by a float32 divisor when any table is MEAN (torch promotes to fp32).
  const DType want = plan.any_mean ? DType::f32 : output_dist_dtype(plan);
  const DType t = I.float_type(*mo);
  if (t != want)
    I.fail(mo->path, fmt::format("dtype {}, want {}", dtype_h5_name(t), dtype_h5_name(want)));
  I.expect_shape(*mo, {rows, plan.sum_dim}, inv ? "B_full, sum_D" : "B_r, sum_D");
  if (!parts.module_output) return;
  EmbTensor e;
  e.dtype = t;
  e.shape = {rows, plan.sum_dim};
  if (parts.float_data) e.data = I.read_floats(*mo, t);
  rb.module_output = std::move(e);
}

void check_kjt_keys(const Plan& plan, const std::vector<std::string>& keys, const std::string& file,
                    const std::string& path) {
  std::vector<std::string> want;
  for (const FeatureInfo& f : plan.features) want.push_back(f.name);
  if (keys == want) return;
  auto list = [](const std::vector<std::string>& v) {
    return "[" + fmt::format("{}", fmt::join(v, ", ")) + "]";
  };
  std::vector<std::string> a = keys, b = want;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::string msg = fmt::format(
      "the KJT keys at the input dist are {} but the plan ({}) lists "
      "its features as {}",
      list(keys), plan.path, list(want));
  if (a == b) {
    msg +=
        ": the same features in another order. TorchRec's row-wise sharding groups its tables "
        "(by pooling type, data type and more, in order of first appearance) and permutes the "
        "KJT into that order before the input dist; list the plan's features in the sharding's "
        "order (dynemb_capture exports the plan that way)";
  } else {
    std::vector<std::string> missing, extra;
    std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(missing));
    std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(extra));
    if (!missing.empty())
      msg += "; not in the capture: " + fmt::format("{}", fmt::join(missing, ", "));
    if (!extra.empty()) msg += "; not in the plan: " + fmt::format("{}", fmt::join(extra, ", "));
    msg += " (is this the plan of this sharding?)";
  }
  throw CaptureError(file, path, msg);
}

namespace {

BatchGeometry batch_geometry(const Plan& plan, const Batch& batch) {
  const int64_t W = plan.world_size;
  const int64_t F = plan.num_features();
  BatchGeometry g;
  g.sequence = plan.module == ModuleKind::sequence;
  bool any_vbe = false;
  for (const RankBatch& rb : batch.ranks) {
    any_vbe |= rb.kjt.is_vbe();
    g.sum_b += kjt_stride(rb.kjt);
    g.sum_bags += rb.kjt.num_bags();
    for (int64_t f = 0; f < F; ++f) g.vbe_local += kjt_batch_size(rb.kjt, f) * plan.features[f].dim;
  }
  g.routed.assign(static_cast<size_t>(W), 0);
  if (g.sequence)
    for (const RankBatch& rb : batch.ranks) {
      auto c = routed_id_counts(plan, rb.kjt);
      for (int64_t d = 0; d < W; ++d) g.routed[d] += c[d];
    }
  g.pooled_vbe = !g.sequence && any_vbe;
  g.data_type = plan.data_type();
  // The engine's rule: a codec decodes to fp32, else the TBE dtype (MEAN tables too: the
  // dist carries their sums).
  g.out_type = output_dist_dtype(plan);
  return g;
}

}  // namespace

// <rp>/ctx of one rank-batch, nullopt when the group is absent; n_r = len(values) of the rank.
std::optional<ShardingContext> CaptureReader::Impl::read_ctx(const Plan& plan,
                                                             const std::string& rp,
                                                             const BatchGeometry& g,
                                                             int64_t n_r) const {
  const Impl& I = *this;
  const int64_t W = plan.world_size;
  const int64_t F = plan.num_features();
  const std::string cp = rp + "/ctx";
  if (!h5::exists(I.fid, cp)) return std::nullopt;
  ShardingContext c;
  auto vec = [&](const char* name, int64_t want,
                 const char* why) -> std::optional<std::vector<int64_t>> {
    auto ds = I.try_open(cp + "/" + name);
    if (!ds) return std::nullopt;
    I.expect_int(*ds, {8}, "int64");
    I.expect_shape(*ds, {want}, why);
    return I.read_ints(*ds);
  };
  c.input_splits = vec("input_splits", W, "W");
  c.output_splits = vec("output_splits", W, "W");
  c.batch_size_per_rank = vec("batch_size_per_rank", W, "W");
  if (auto ds = I.try_open(cp + "/batch_size_per_rank_per_feature")) {
    I.expect_int(*ds, {8}, "int64");
    I.expect_shape(*ds, {W, F}, "W, F");
    auto flat = I.read_ints(*ds);
    std::vector<std::vector<int64_t>> m(static_cast<size_t>(W));
    for (int64_t s = 0; s < W; ++s) m[s].assign(flat.begin() + s * F, flat.begin() + (s + 1) * F);
    c.batch_size_per_rank_per_feature = std::move(m);
  }
  if (auto ds = I.try_open(cp + "/sparse_features_recat")) {
    I.expect_int(*ds, {4}, "int32");
    I.expect_1d(*ds);
    // [F*W], or expanded per bag when the B_s differ (docs/semantics.md §4.3): F * sum_s B_s
    // bags.
    const int64_t n = ds->dims[0];
    if (n != F * W && n != F * g.sum_b && n != g.sum_bags)
      I.fail(ds->path, fmt::format("shape [{}], want [{}] (F*W) or [{}] (expanded per bag, "
                                   "F * sum_s B_s)",
                                   n, F * W, F * g.sum_b));
    c.sparse_features_recat = I.read_i32(*ds);
  }
  c.unbucketize_permute = vec("unbucketize_permute", n_r, "N_r = len(values)");
  if (auto ds = I.try_open(cp + "/lengths_after_input_dist")) {
    I.expect_int(*ds, {8}, "int64");
    I.expect_shape(*ds, {F, g.sum_b}, "F, sum_s B_s");
    c.lengths_after_input_dist = I.read_ints(*ds);
    c.lengths_after_input_dist_cols = g.sum_b;
  }
  Hid grp = h5::group_id(H5Gopen2(I.fid, cp.c_str(), H5P_DEFAULT));
  if (!grp.valid()) I.fail(cp, "not a group");
  if (h5::has_attr(grp, "variable_batch_per_feature")) {
    const int64_t v = I.int_attr(grp, cp, "variable_batch_per_feature");
    if (v != 0 && v != 1)
      I.fail(cp, fmt::format("attribute variable_batch_per_feature = {}, want 0 or 1", v));
    c.variable_batch_per_feature = v == 1;
  }
  return c;
}

// <rp>/<name>, a float tensor of shape `want` and dtype `want_type` (`why` and `type_why`
// explain them in messages); nullopt when absent, no data unless parts.float_data.
std::optional<EmbTensor> CaptureReader::Impl::read_emb_tensor(
    const std::string& rp, const char* name, std::vector<int64_t> want, const std::string& why,
    DType want_type, const std::string& type_why, const ReadParts& parts) const {
  auto ds = try_open(rp + "/" + name);
  if (!ds) return std::nullopt;
  const DType t = float_type(*ds);
  if (t != want_type)
    fail(ds->path, fmt::format("dtype {}, want {} ({})", dtype_h5_name(t), dtype_h5_name(want_type),
                               type_why));
  expect_shape(*ds, want, why);
  EmbTensor e;
  e.dtype = t;
  e.shape = std::move(want);
  if (parts.float_data) e.data = read_floats(*ds, t);
  return e;
}

// local_embs and output of rank r (when `parts` asks for them), shaped by the batch geometry.
void CaptureReader::Impl::read_dist_tensors(const Plan& plan, const std::string& rp,
                                            const ReadParts& parts, const BatchGeometry& g,
                                            int64_t r, RankBatch& rb) const {
  const int64_t F = plan.num_features();
  const int64_t n_r = rb.kjt.num_ids();
  auto tensor = [&](const char* name, std::vector<int64_t> want, const std::string& why,
                    DType want_type, const std::string& type_why) {
    return read_emb_tensor(rp, name, std::move(want), why, want_type, type_why, parts);
  };
  const std::string dt_why = fmt::format("plan data_type {}", to_string(g.data_type));
  const std::string out_why = plan.comm_precision != DType::f32
                                  ? fmt::format("comm_precision {}: the codec decodes to float32",
                                                to_string(plan.comm_precision))
                                  : dt_why + ", no codec";
  if (parts.local_embs) {
    if (g.sequence)
      rb.local_embs = tensor("local_embs", {g.routed[r], plan.seq_dim()},
                             "ids routed to this rank, D", g.data_type, dt_why);
    else if (g.pooled_vbe)
      rb.local_embs =
          tensor("local_embs", {g.vbe_local}, "sum_s sum_f B_{s,f} * D_f", g.data_type, dt_why);
    else
      rb.local_embs =
          tensor("local_embs", {g.sum_b, plan.sum_dim}, "sum_s B_s, sum_D", g.data_type, dt_why);
  }
  if (parts.output) {
    if (g.sequence) {
      rb.output =
          tensor("output", {n_r, plan.seq_dim()}, "N_r = len(values), D", g.out_type, out_why);
    } else if (g.pooled_vbe) {
      int64_t n = 0;
      for (int64_t f = 0; f < F; ++f) n += kjt_batch_size(rb.kjt, f) * plan.features[f].dim;
      rb.output = tensor("output", {n}, "sum_f B_{r,f} * D_f", g.out_type, out_why);
    } else {
      rb.output =
          tensor("output", {kjt_stride(rb.kjt), plan.sum_dim}, "B_r, sum_D", g.out_type, out_why);
    }
  }
}

// <rp>/keys when present, checked against the plan's feature order.
void CaptureReader::Impl::read_keys(const Plan& plan, const std::string& rp, RankBatch& rb) const {
  auto ds = try_open(rp + "/keys");
  if (!ds) return;
  std::vector<std::string> keys;
  std::string why;
  if (H5Tget_class(ds->t) != H5T_STRING ||
      !h5::read_string_list_dataset(ds->d, raw, kMaxKeys, keys, why))
    fail(ds->path, why.empty() ? "want a 1-D list of strings" : why);
  check_kjt_keys(plan, keys, file, ds->path);
  rb.keys = std::move(keys);
}

// <rp>/mean_divisor when present: [F] strings "count" | "weights", what the module's MEAN
// pooling divides each feature's bags by; "weights" needs a weighted KJT.
void CaptureReader::Impl::read_mean_divisor(const Plan& plan, const std::string& rp,
                                            Kjt& kjt) const {
  auto ds = try_open(rp + "/mean_divisor");
  if (!ds) return;
  std::vector<std::string> v;
  std::string why;
  if (H5Tget_class(ds->t) != H5T_STRING ||
      !h5::read_string_list_dataset(ds->d, raw, kMaxKeys, v, why))
    fail(ds->path, why.empty() ? "want a 1-D list of strings" : why);
  if (int64_t(v.size()) != plan.num_features())
    fail(ds->path,
         fmt::format("{} entries, want one per feature (F = {})", v.size(), plan.num_features()));
  kjt.mean_divisor.clear();
  for (size_t f = 0; f < v.size(); ++f) {
    if (v[f] == "count") {
      kjt.mean_divisor.push_back(MeanDivisor::count);
    } else if (v[f] == "weights" && kjt.weighted) {
      kjt.mean_divisor.push_back(MeanDivisor::weights);
    } else {
      fail(ds->path, fmt::format("entry {} (feature {}) is \"{}\", want \"count\"{}", f,
                                 plan.features[f].name, v[f],
                                 kjt.weighted ? " or \"weights\"" : " (the KJT has no weights)"));
    }
  }
}

// The elements rows [ranges[i]) of `ds` (at `path`) hold; fails (CaptureError) on ranges that
// are not sorted, disjoint and inside the extent.
int64_t CaptureReader::Impl::rows_elements(
    const Ds& ds, const std::string& path,
    const std::vector<std::pair<int64_t, int64_t>>& ranges) const {
  if (ds.dims.empty()) fail(path, "a scalar, want a tensor");
  int64_t rows = 0, end = 0;
  for (const auto& [a, b] : ranges) {
    if (a < end || b <= a || b > ds.dims[0])
      fail(path, fmt::format("rows [{}, {}) asked of extent {}: not sorted, disjoint and "
                             "inside it (an internal error)",
                             a, b, shape_str(ds.dims)));
    rows += b - a;
    end = b;
  }
  return rows * (ds.numel / std::max<int64_t>(1, ds.dims[0]));
}

// Those rows as floats into `out` (rows_elements of them): the stored chunks inflated on every
// core when the file holds the elements as they are wanted (float32, or the 16-bit patterns of
// float16 / bfloat16, little-endian), else H5Dread of a hyperslab union; fails (CaptureError)
// on a read that fails.
void CaptureReader::Impl::read_rows_into(const Ds& ds, const std::string& path, DType dtype,
                                         const std::vector<std::pair<int64_t, int64_t>>& ranges,
                                         int64_t n, float* out) const {
  if (n == 0) return;
  // One hyperslab of the dataset per range, read in file order (H5Dread fills a selection of
  // several blocks in row-major order of the file, which is the ranges' order).
  const auto read_into = [&](hid_t mem_type, void* buf) {
    Hid fsp = h5::space_id(H5Dget_space(ds.d));
    H5Sselect_none(fsp);
    std::vector<hsize_t> start(ds.dims.size(), 0), count(ds.dims.begin(), ds.dims.end());
    for (const auto& [a, b] : ranges) {
      start[0] = hsize_t(a);
      count[0] = hsize_t(b - a);
      if (H5Sselect_hyperslab(fsp, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr) < 0)
        return false;
    }
    const hsize_t elems = hsize_t(n);
    Hid msp = h5::space_id(H5Screate_simple(1, &elems, nullptr));
    return H5Dread(ds.d, mem_type, msp, fsp, H5P_DEFAULT, buf) >= 0;
  };
  const std::vector<std::pair<uint64_t, uint64_t>> rows_u(ranges.begin(), ranges.end());
  const auto read = [&](hid_t mem_type, void* buf) {
    h5::ChunkTrouble trouble;
    // Contiguous or compact (checked against the file when opened): H5Dread alone.
    const bool by_chunks = chunked(ds);
    if (by_chunks && H5Tequal(ds.t, mem_type) > 0 &&
        h5::read_rows_parallel(ds.d, rows_u, buf, hardware_threads(), &trouble))
      return;
    if (!trouble.what.empty()) fail(path, trouble.what);
    if (by_chunks) check_chunks(ds);  // H5Dread copies whole chunks out of whatever they decode to
    if (!read_into(mem_type, buf))
      fail(path, fmt::format("rows {}..{} of extent {}: read failed: {}", ranges.front().first,
                             ranges.back().second, shape_str(ds.dims), h5::last_error()));
  };
  if (dtype == DType::f32) {
    read(H5T_NATIVE_FLOAT, out);
    return;
  }
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  Hid half = h5::make_f16_type();
  read(dtype == DType::f16 ? half.get() : H5T_NATIVE_UINT16, bits.data());
  for (size_t i = 0; i < bits.size(); ++i)
    out[i] = dtype == DType::f16 ? f16_bits_to_f32(bits[i]) : bf16_bits_to_f32(bits[i]);
}

std::vector<float> CaptureReader::read_rows(int64_t k, int64_t rank, const char* name, DType dtype,
                                            const std::vector<std::pair<int64_t, int64_t>>& ranges,
                                            std::vector<float> reuse) const {
  std::vector<RankRows> one(size_t(rank) + 1);
  one[size_t(rank)] = ranges;
  std::vector<std::vector<float>> buffers(one.size());
  buffers[size_t(rank)] = std::move(reuse);
  return std::move(read_rows(k, name, dtype, one, std::move(buffers))[size_t(rank)]);
}

// The rows of every rank r with ranges[r] into out(r) (elements[r] floats, set before out is
// first called): the float32 datasets' stored chunks inflated as one stream, and whatever that
// declines (16-bit elements, another layout) rank by rank.
void CaptureReader::read_rank_rows(int64_t k, const char* name, DType dtype,
                                   const std::vector<RankRows>& ranges,
                                   std::vector<int64_t>& elements,
                                   const std::function<float*(size_t)>& out) const {
  const TraceSpan span("read rows", k);
  const Impl& I = *impl_;
  const size_t W = ranges.size();
  std::vector<const Impl::Ds*> ds(W, nullptr);
  std::vector<std::shared_ptr<const h5::Layout>> layout(W);
  std::vector<std::string> path(W);
  elements.assign(W, 0);
  bool fast = dtype == DType::f32;
  for (size_t r = 0; r < W; ++r) {
    if (ranges[r].empty()) continue;
    path[r] = fmt::format("/batches/{}/rank{}/{}", k, r, name);
    const Impl::RowsDs& opened = I.open_rows_dataset(k, path[r]);
    ds[r] = &opened.ds;
    layout[r] = opened.layout;
    elements[r] = I.rows_elements(*ds[r], path[r], ranges[r]);
    fast &= layout[r] && H5Tequal(ds[r]->t, H5T_NATIVE_FLOAT) > 0;
  }
  std::vector<h5::RowsRead> reads;
  for (size_t r = 0; fast && r < W; ++r)
    if (!ranges[r].empty())
      reads.push_back({ds[r]->d, {ranges[r].begin(), ranges[r].end()}, out(r), layout[r]});
  h5::ChunkTrouble trouble;
  if (fast && h5::read_rows_parallel(reads, hardware_threads(), &trouble)) return;
  for (size_t r = 0; r < W && !trouble.what.empty(); ++r)
    if (!ranges[r].empty() && ds[r]->d.get() == trouble.dset) I.fail(path[r], trouble.what);
  for (size_t r = 0; r < W; ++r)
    if (!ranges[r].empty())
      I.read_rows_into(*ds[r], path[r], dtype, ranges[r], elements[r], out(r));
}

std::vector<std::vector<float>> CaptureReader::read_rows(
    int64_t k, const char* name, DType dtype, const std::vector<RankRows>& ranges,
    std::vector<std::vector<float>> reuse) const {
  std::vector<std::vector<float>> out = std::move(reuse);
  out.resize(ranges.size());
  for (size_t r = 0; r < out.size(); ++r)
    if (ranges[r].empty()) out[r] = {};
  std::vector<int64_t> elements;
  read_rank_rows(k, name, dtype, ranges, elements, [&](size_t r) {
    resize_to_overwrite(out[r], size_t(elements[r]));
    return out[r].data();
  });
  return out;
}

std::vector<float> CaptureReader::read_rows_concat(int64_t k, const char* name, DType dtype,
                                                   const std::vector<RankRows>& ranges,
                                                   std::vector<int64_t>& offsets,
                                                   std::vector<float> reuse) const {
  std::vector<float> out = std::move(reuse);
  std::vector<int64_t> elements;
  offsets.clear();
  read_rank_rows(k, name, dtype, ranges, elements, [&](size_t r) {
    if (offsets.empty()) {  // the first rank asked for: every rank's place is known by now
      offsets.assign(1, 0);
      for (int64_t e : elements) offsets.push_back(offsets.back() + e);
      resize_to_overwrite(out, size_t(offsets.back()));
    }
    return out.data() + offsets[r];
  });
  if (offsets.empty()) {  // no rows asked of any rank
    offsets.assign(ranges.size() + 1, 0);
    out.clear();
  }
  return out;
}

// The int64 datasets read_batch(k, parts) will read, decoded at once (Impl::prefetch_ints): every
// rank's lengths and values, and the long context fields of the ranks whose parts are read.
void CaptureReader::prefetch_batch(int64_t k, const ReadParts& parts) const {
  if (k < 0 || k >= num_batches_) return;  // read_kjts says so
  std::vector<std::string> paths;
  for (int64_t r = 0; r < world_size_; ++r) {
    const std::string rp = fmt::format("/batches/{}/rank{}", k, r);
    paths.push_back(rp + "/lengths");
    paths.push_back(rp + "/values");
    const bool part = parts.ranks.empty() || (r < int64_t(parts.ranks.size()) && parts.ranks[r]);
    if (!parts.ctx || !part) continue;
    paths.push_back(rp + "/ctx/unbucketize_permute");
    paths.push_back(rp + "/ctx/lengths_after_input_dist");
  }
  impl_->prefetch_ints(paths);
}

// The checks of batch k and pass 1 of read_batch: every rank's KJT (the other shapes depend on
// all of them: sum_s B_s, routing).
Batch CaptureReader::read_kjts(const Plan& plan, int64_t k) const {
  const Impl& I = *impl_;
  const int64_t W = world_size_;
  if (plan.world_size != W)
    I.fail("/",
           fmt::format("world_size {} != plan world_size {} ({})", W, plan.world_size, plan.path));
  const std::string bp = fmt::format("/batches/{}", k);
  if (k < 0 || k >= num_batches_)
    I.fail(bp, fmt::format("batch {} out of range (num_batches = {})", k, num_batches_));
  if (!h5::exists(I.fid, bp))
    I.fail(bp, fmt::format("missing group (num_batches = {})", num_batches_));
  Batch batch;
  batch.index = k;
  batch.ranks.resize(static_cast<size_t>(W));
  for (int64_t r = 0; r < W; ++r)
    I.read_kjt(plan, fmt::format("{}/rank{}", bp, r), batch.ranks[r].kjt);
  return batch;
}

namespace {

// Below this, a dataset is read alone as fast (one or two chunks).
constexpr int64_t kPrefetchBytes = int64_t{256} << 10;

// The prefetch of one batch's read, dropped however the read ends.
struct PrefetchedBatch {
  std::map<std::string, std::vector<int64_t>>& prefetched;
  ~PrefetchedBatch() { prefetched.clear(); }
};

}  // namespace

// Every dataset of `paths` that the chunk path reads as it is (chunked, int64, no header
// trouble, every chunk stored) decoded at once into `prefetched`; nothing when any chunk does not
// decode or is not stored: each read alone then says what it says. Never fails: the reads that
// follow check each dataset, and their errors are the batch's.
void CaptureReader::Impl::prefetch_ints(const std::vector<std::string>& paths) const {
  const TraceSpan span("prefetch", int64_t(paths.size()));
  std::vector<Ds> open;
  std::vector<h5::RowsRead> reads;
  for (const std::string& p : paths) {
    try {
      std::optional<Ds> ds = try_open(p);
      if (!ds || ds->dims.empty() || ds->numel * 8 < kPrefetchBytes ||
          H5Tequal(ds->t, H5T_NATIVE_INT64) <= 0)
        continue;
      std::shared_ptr<const h5::Layout> layout =
          h5::readable_layout(ds->d, ds->dcpl.valid() ? ds->dcpl.get() : -1);
      if (!layout) continue;
      reads.push_back({ds->d, {{0, uint64_t(ds->dims[0])}}, nullptr, std::move(layout)});
      open.push_back(std::move(*ds));
    } catch (const CaptureError&) {  // said by the read of it that follows
    }
  }
  if (open.size() < 2) return;  // one dataset is read as fast alone
  // Made (zeroed, faulted in) on every core: the decode then only writes them.
  std::vector<std::vector<int64_t>> values(open.size());
  parallel_for(
      hardware_threads(), int64_t(open.size()),
      [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) values[size_t(i)].resize(size_t(open[size_t(i)].numel));
      },
      /*grain=*/1);
  for (size_t i = 0; i < open.size(); ++i) reads[i].out = values[i].data();
  const TraceSpan decoded("prefetched", int64_t(open.size()));  // datasets
  if (!h5::read_rows_parallel(reads, 0)) return;
  for (size_t i = 0; i < open.size(); ++i) prefetched[open[i].path] = std::move(values[i]);
}

Batch CaptureReader::read_batch(const Plan& plan, int64_t k, const ReadParts& parts) const {
  const TraceSpan span("read batch", k);
  const Impl& I = *impl_;
  const PrefetchedBatch forget{I.prefetched};
  prefetch_batch(k, parts);
  Batch batch = read_kjts(plan, k);
  const BatchGeometry g = batch_geometry(plan, batch);
  // Pass 2: the optional parts, rank by rank.
  for (int64_t r = 0; r < world_size_; ++r) {
    if (!parts.ranks.empty() && (r >= int64_t(parts.ranks.size()) || !parts.ranks[r])) continue;
    const std::string rp = fmt::format("/batches/{}/rank{}", k, r);
    RankBatch& rb = batch.ranks[r];
    if (parts.ctx) rb.ctx = I.read_ctx(plan, rp, g, rb.kjt.num_ids());
    I.read_dist_tensors(plan, rp, parts, g, r, rb);
    I.read_keys(plan, rp, rb);
    I.read_mean_divisor(plan, rp, rb.kjt);
    I.read_module_output(plan, rp, parts, rb);
  }
  return batch;
}

// read_batch's reads in read_batch's order, each once; a rank whose ctx/, local_embs or output
// fails is told to rank_failed from inside the handler, and its keys, mean_divisor,
// module_output and inverse_indices are read all the same (their failure is the batch's), then
// dropped: the rank keeps its KJT alone, as a read_batch that skips the rank gives it.
Batch CaptureReader::read_batch_by_rank(const Plan& plan, int64_t k,
                                        const std::function<void(int64_t)>& rank_failed) const {
  const TraceSpan span("read batch", k);
  const Impl& I = *impl_;
  const ReadParts all;
  const PrefetchedBatch forget{I.prefetched};
  prefetch_batch(k, all);
  Batch batch = read_kjts(plan, k);
  const BatchGeometry g = batch_geometry(plan, batch);
  std::vector<char> failed(static_cast<size_t>(world_size_), 0);
  for (int64_t r = 0; r < world_size_; ++r) {
    const std::string rp = fmt::format("/batches/{}/rank{}", k, r);
    RankBatch& rb = batch.ranks[r];
    try {
      rb.ctx = I.read_ctx(plan, rp, g, rb.kjt.num_ids());
      I.read_dist_tensors(plan, rp, all, g, r, rb);
    } catch (const Error&) {
      failed[size_t(r)] = 1;
      rank_failed(r);
    } catch (const std::bad_alloc&) {
      failed[size_t(r)] = 1;
      rank_failed(r);
    }
    I.read_keys(plan, rp, rb);
    I.read_mean_divisor(plan, rp, rb.kjt);
    I.read_module_output(plan, rp, all, rb);
  }
  for (int64_t r = 0; r < world_size_; ++r) {
    if (!failed[size_t(r)]) continue;
    Kjt kjt = std::move(batch.ranks[r].kjt);
    kjt.mean_divisor.clear();  // read_mean_divisor's, not the KJT's
    batch.ranks[r] = RankBatch{};
    batch.ranks[r].kjt = std::move(kjt);
  }
  return batch;
}

namespace {
const char* const kRankDatasets[] = {"lengths",
                                     "values",
                                     "weights",
                                     "stride_per_feature",
                                     "ctx/input_splits",
                                     "ctx/output_splits",
                                     "ctx/batch_size_per_rank",
                                     "ctx/batch_size_per_rank_per_feature",
                                     "ctx/sparse_features_recat",
                                     "ctx/unbucketize_permute",
                                     "ctx/lengths_after_input_dist",
                                     "keys",
                                     "mean_divisor",
                                     "local_embs",
                                     "output",
                                     "inverse_indices",
                                     "module_output"};
}  // namespace

std::vector<DatasetStat> CaptureReader::dataset_stats(int64_t k) const {
  std::vector<DatasetStat> out;
  for (int64_t r = 0; r < world_size_; ++r)
    for (const char* name : kRankDatasets) {
      const std::string p = fmt::format("/batches/{}/rank{}/{}", k, r, name);
      if (auto ds = impl_->try_open(p)) {
        DatasetStat s;
        s.path = p;
        s.dtype = element_name(ds->d, ds->t, impl_->raw);
        s.dims = ds->dims;
        s.logical_bytes = ds->numel * static_cast<int64_t>(H5Tget_size(ds->t));
        s.stored_bytes = static_cast<int64_t>(H5Dget_storage_size(ds->d));
        out.push_back(std::move(s));
      }
    }
  return out;
}

std::vector<DatasetStat> CaptureReader::table_stats() const {
  std::vector<DatasetStat> out;
  for (const std::string& n : weight_tables()) {
    auto ds = impl_->try_open("/tables/" + n + "/weight");
    DatasetStat s;
    s.path = ds->path;
    s.dtype = element_name(ds->d, ds->t, impl_->raw);
    s.dims = ds->dims;
    s.logical_bytes = ds->numel * static_cast<int64_t>(H5Tget_size(ds->t));
    s.stored_bytes = static_cast<int64_t>(H5Dget_storage_size(ds->d));
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<int64_t> routed_id_counts(const Plan& plan, const Kjt& kjt) {
  const uint64_t W = static_cast<uint64_t>(plan.world_size);
  std::vector<int64_t> counts(W, 0);
  const bool i32 = kjt.values_type == IndexType::i32;
  int64_t pos = 0;
  for (int64_t f = 0; f < kjt.num_features && f < plan.num_features(); ++f) {
    const FeatureInfo& fi = plan.features[f];
    const uint64_t blk = static_cast<uint64_t>(fi.block_size);
    int64_t n = 0;
    const int64_t b0 = kjt_bag_begin(kjt, f);
    for (int64_t b = 0; b < kjt_batch_size(kjt, f); ++b) n += kjt.lengths[b0 + b];
    if (!fi.bucketize_pos.empty()) {  // an inference plan's uneven shards: the engine's rule
      for (int64_t i = pos; i < pos + n; ++i)
        ++counts[size_t(route_feature(fi, kjt.values[i], kjt.values_type, plan.world_size).dest)];
      pos += n;
      continue;
    }
    for (int64_t i = pos; i < pos + n; ++i) {
      // u64 of the id in its index dtype (docs/semantics.md §0, §10.2).
      const uint64_t x = i32 ? static_cast<uint64_t>(static_cast<uint32_t>(kjt.values[i]))
                             : static_cast<uint64_t>(kjt.values[i]);
      uint64_t d = 0;
      switch (fi.dist_type) {
        case DistType::continuous:
          d = (blk > 0 && x < blk * W) ? x / blk : x % W;
          break;
        case DistType::roundrobin:
          d = x % W;
          break;
        case DistType::hash_roundrobin: {
          uint64_t h = fmix64(x);
          if (i32) h = static_cast<uint32_t>(h);
          d = h % W;
          break;
        }
      }
      ++counts[d];
    }
    pos += n;
  }
  return counts;
}
}  // namespace dynemb
