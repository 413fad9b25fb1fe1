// libFuzzer target: the capture reader fed in-memory HDF5 images (core file driver). Any bytes
// must become a CaptureError / dynemb::Error (exit 2 in the CLI), never a crash, a hang or an
// allocation sized by a claimed extent. Runs what `validate --capture` runs (check_capture:
// root attributes, /plan, /tables shapes, every batch's shapes and sums), then reads every
// batch with its data and the routed-id counts.
//
// Two kinds of input:
// - an HDF5 image (it starts with the HDF5 signature): read as it is. Seed corpus:
//   fixtures/*.h5, fixtures/torchrec/*.h5; byte mutations of these mostly break the metadata.
// - anything else: a recipe of structural edits that byte mutations rarely reach, applied
//   through the HDF5 API to an in-memory copy of one seed capture (the same fixtures, loaded
//   at start), whose image is then read as above. Byte 0 picks the seed; then 1..4 edits,
//   each one of: an attribute (any the seed has, or one the reader looks for) rewritten with
//   a chosen type (integers of 1..8 bytes and either order, floats, fixed and variable
//   strings, compound, vlen, array) and dataspace (scalar, null, 0/1/2/16/n elements, 2-D) and
//   bytes; a dataset rewritten in chunks of a chosen shape and filters (shuffle, deflate,
//   fletcher32, in a chosen order), then one chunk replaced by chosen bytes and filter mask
//   (random bytes, a valid deflate stream of a chosen length, the chunk cut short). Seed
//   recipes: tests/fuzz/structure/.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "capture/capture.hpp"
#include "common/error.hpp"

namespace {

// What the CLI runs on a capture; a dynemb::Error is the expected outcome for bad bytes.
void read_capture(const uint8_t* data, size_t size) {
  try {
    dynemb::CaptureReader reader("fuzz.h5", data, size);
    dynemb::check_capture(reader);
    const dynemb::Plan plan = dynemb::capture_plan(reader);
    for (const dynemb::TableConfig& t : plan.tables)
      for (const std::string& name : reader.weight_tables())
        if (name == t.name) (void)reader.read_table_weight(t);
    // Limit the data read per input (shapes were already checked for every batch).
    for (int64_t k = 0; k < reader.num_batches() && k < 4; ++k) {
      const dynemb::Batch b = reader.read_batch(plan, k);
      for (const dynemb::RankBatch& rb : b.ranks) (void)dynemb::routed_id_counts(plan, rb.kjt);
      (void)reader.dataset_stats(k);
    }
    (void)reader.table_stats();
  } catch (const dynemb::Error&) {
    // the expected outcome for bad bytes
  } catch (const std::bad_alloc&) {
    std::abort();  // an allocation sized by a claimed extent
  } catch (const std::exception&) {
    std::abort();  // any other exception escapes the CLI's exit-2 mapping
  }
}

// ------------------------------------------------------------ structure-aware edits

std::vector<std::vector<uint8_t>>& seeds() {
  static std::vector<std::vector<uint8_t>> s;
  return s;
}

// The seed captures: $DYNEMB_FUZZ_SEEDS (directories, ':'-separated) or the source tree's
// fixtures, sorted by name so that a recipe means the same seed on every machine.
void load_seeds() {
  const char* env = std::getenv("DYNEMB_FUZZ_SEEDS");
  std::string dirs = env && *env ? env
                                 : std::string(DYNEMB_SOURCE_DIR) +
                                       "/fixtures:" + DYNEMB_SOURCE_DIR + "/fixtures/torchrec";
  std::vector<std::string> files;
  size_t pos = 0;
  while (pos <= dirs.size()) {
    size_t end = dirs.find(':', pos);
    if (end == std::string::npos) end = dirs.size();
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dirs.substr(pos, end - pos), ec))
      if (e.path().extension() == ".h5") files.push_back(e.path().string());
    pos = end + 1;
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    seeds().emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
}

struct H {  // an owned hid_t
  hid_t id;
  herr_t (*close)(hid_t);
  H(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  H(const H&) = delete;
  H& operator=(const H&) = delete;
  ~H() { reset(); }
  void reset() {
    if (id >= 0) close(id);
    id = -1;
  }
  operator hid_t() const { return id; }
};

#if H5_VERSION_GE(1, 12, 0)
using LinkInfo = H5L_info2_t;
#else
using LinkInfo = H5L_info_t;
#endif

struct Objects {
  std::vector<std::string> all;       // every object by absolute path, "/" first
  std::vector<std::string> datasets;  // those that are datasets of rank >= 1
};
herr_t add_link(hid_t, const char* name, const LinkInfo* info, void* data) {
  if (info && info->type == H5L_TYPE_HARD)
    static_cast<Objects*>(data)->all.push_back(std::string("/") + name);
  return 0;
}
Objects objects_of(hid_t f) {
  Objects o;
  o.all.push_back("/");
  H5Lvisit(f, H5_INDEX_NAME, H5_ITER_INC, add_link, &o);
  for (const std::string& p : o.all) {
    H d(H5Oopen(f, p.c_str(), H5P_DEFAULT), H5Oclose);
    if (d < 0 || H5Iget_type(d) != H5I_DATASET) continue;
    H sp(H5Dget_space(d), H5Sclose);
    if (H5Sget_simple_extent_ndims(sp) >= 1) o.datasets.push_back(p);
  }
  return o;
}

herr_t add_attr(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

// A type of the fuzzer's choosing; `vlen` says how its elements are built in memory.
enum class Mem { fixed, vlen_str, vlen_seq };
hid_t pick_type(FuzzedDataProvider& in, Mem& mem) {
  mem = Mem::fixed;
  static const hid_t ints[] = {H5T_STD_I8LE,  H5T_STD_U8LE,  H5T_STD_I16LE, H5T_STD_U16BE,
                               H5T_STD_I32LE, H5T_STD_U32LE, H5T_STD_I32BE, H5T_STD_I64LE,
                               H5T_STD_U64LE, H5T_STD_I64BE, H5T_STD_U64BE};
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
    case 1:
      return H5Tcopy(ints[in.ConsumeIntegralInRange<size_t>(0, std::size(ints) - 1)]);
    case 2:
      return H5Tcopy(in.ConsumeBool() ? H5T_IEEE_F64LE : H5T_IEEE_F32BE);
    case 3: {
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, in.ConsumeIntegralInRange<size_t>(1, 64));
      return t;
    }
    case 4: {
      mem = Mem::vlen_str;
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      return t;
    }
    case 5: {
      hid_t t = H5Tcreate(H5T_COMPOUND, 16);
      H5Tinsert(t, "a", 0, H5T_STD_I64LE);
      H5Tinsert(t, "b", 8, H5T_STD_U64LE);
      return t;
    }
    case 6:
      mem = Mem::vlen_seq;
      return H5Tvlen_create(H5T_STD_I64LE);
    default: {
      const hsize_t n[1] = {in.ConsumeIntegralInRange<hsize_t>(1, 16)};
      return H5Tarray_create2(H5T_STD_U64LE, 1, n);
    }
  }
}

hid_t pick_space(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
      return H5Screate(H5S_SCALAR);
    case 1:
      return H5Screate(H5S_NULL);
    case 2: {
      static const hsize_t sizes[] = {0, 1, 2, 16};
      const hsize_t n[1] = {sizes[in.ConsumeIntegralInRange<int>(0, 3)]};
      return H5Screate_simple(1, n, nullptr);
    }
    case 3: {
      const hsize_t n[1] = {in.ConsumeIntegralInRange<hsize_t>(0, 64)};
      return H5Screate_simple(1, n, nullptr);
    }
    default: {
      const hsize_t n[2] = {in.ConsumeIntegralInRange<hsize_t>(1, 3),
                            in.ConsumeIntegralInRange<hsize_t>(1, 3)};
      return H5Screate_simple(2, n, nullptr);
    }
  }
}

// Attribute `name` of `obj` replaced by one of the fuzzer's type, dataspace and bytes.
void rewrite_attr(hid_t obj, const std::string& name, FuzzedDataProvider& in) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  Mem mem;
  H t(pick_type(in, mem), H5Tclose);
  H sp(pick_space(in), H5Sclose);
  if (t < 0 || sp < 0) return;
  H a(H5Acreate2(obj, name.c_str(), t, sp, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (a < 0) return;
  const hssize_t n = H5Sget_select_npoints(sp);
  if (n <= 0) return;
  if (mem == Mem::fixed) {
    std::vector<uint8_t> buf = in.ConsumeBytes<uint8_t>(size_t(n) * H5Tget_size(t));
    buf.resize(size_t(n) * H5Tget_size(t));
    H5Awrite(a, t, buf.data());
  } else if (mem == Mem::vlen_str) {
    std::vector<std::string> s(static_cast<size_t>(n));
    std::vector<const char*> p;
    for (auto& x : s) {
      x = in.ConsumeRandomLengthString(32);
      p.push_back(x.c_str());
    }
    H5Awrite(a, t, p.data());
  } else {
    std::vector<std::vector<int64_t>> seq(static_cast<size_t>(n));
    std::vector<hvl_t> v;
    for (auto& x : seq) {
      x.resize(in.ConsumeIntegralInRange<size_t>(0, 4));
      for (auto& e : x) e = in.ConsumeIntegral<int64_t>();
      v.push_back(hvl_t{x.size(), x.data()});
    }
    H5Awrite(a, t, v.data());
  }
}

// Attributes of a dataset copied to another (fixed-size types only: a variable-length one,
// as h5py writes strings, is left behind, which the reader reports like any missing one).
void copy_attrs(hid_t from, hid_t to) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  H5Aiterate2(from, H5_INDEX_NAME, H5_ITER_INC, &idx, add_attr, &names);
  for (const std::string& n : names) {
    H a(H5Aopen(from, n.c_str(), H5P_DEFAULT), H5Aclose);
    H t(H5Aget_type(a), H5Tclose);
    H sp(H5Aget_space(a), H5Sclose);
    if (a < 0 || t < 0 || sp < 0 || H5Tdetect_class(t, H5T_VLEN) > 0 || H5Tis_variable_str(t) > 0)
      continue;
    const hssize_t np = H5Sget_select_npoints(sp);
    std::vector<uint8_t> buf(size_t(std::max<hssize_t>(np, 1)) * H5Tget_size(t));
    if (np > 0 && H5Aread(a, t, buf.data()) < 0) continue;
    H b(H5Acreate2(to, n.c_str(), t, sp, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (b >= 0 && np > 0) H5Awrite(b, t, buf.data());
  }
}

// Dataset `path` rewritten in chunks of the fuzzer's shape and filters (its values kept),
// then one chunk replaced by the fuzzer's bytes and filter mask.
void rewrite_chunks(hid_t f, const std::string& path, FuzzedDataProvider& in) {
  H d(H5Dopen2(f, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (d < 0) return;
  H t(H5Dget_type(d), H5Tclose);
  H sp(H5Dget_space(d), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(sp);
  if (rank < 1 || rank > 4 || H5Tis_variable_str(t) > 0 || H5Tdetect_class(t, H5T_VLEN) > 0) return;
  std::vector<hsize_t> dims(size_t(rank), 0), chunk(size_t(rank), 1);
  H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
  const size_t es = H5Tget_size(t);
  size_t numel = 1;
  for (hsize_t x : dims) numel *= size_t(x);
  if (numel == 0 || numel * es > (size_t(8) << 20)) return;
  std::vector<uint8_t> data(numel * es);
  if (H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0) return;
  for (int i = 0; i < rank; ++i)
    chunk[size_t(i)] = in.ConsumeIntegralInRange<hsize_t>(1, dims[size_t(i)]);
  H dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl, rank, chunk.data());
  // Filters: a pipeline of up to three of shuffle, deflate, fletcher32, in the fuzzer's order.
  const int nf = in.ConsumeIntegralInRange<int>(0, 3);
  for (int i = 0; i < nf; ++i) {
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
      case 0:
        H5Pset_shuffle(dcpl);
        break;
      case 1:
        H5Pset_deflate(dcpl, in.ConsumeIntegralInRange<unsigned>(0, 9));
        break;
      default:
        H5Pset_fletcher32(dcpl);
        break;
    }
  }
  const std::string tmp = path + ".fuzz";
  {
    H nd(H5Dcreate2(f, tmp.c_str(), t, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
    if (nd < 0) return;
    if (H5Dwrite(nd, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0) return;
    copy_attrs(d, nd);
    if (H5Dflush(nd) < 0) return;
    // One chunk of the grid (last dimension fastest) replaced.
    std::vector<hsize_t> off(static_cast<size_t>(rank));
    uint64_t cells = 1;
    for (int i = 0; i < rank; ++i)
      cells *= (dims[size_t(i)] + chunk[size_t(i)] - 1) / chunk[size_t(i)];
    uint64_t k = in.ConsumeIntegralInRange<uint64_t>(0, cells - 1);
    for (int i = rank; i-- > 0;) {
      const uint64_t per = (dims[size_t(i)] + chunk[size_t(i)] - 1) / chunk[size_t(i)];
      off[size_t(i)] = (k % per) * chunk[size_t(i)];
      k /= per;
    }
    size_t chunk_bytes = es;
    for (hsize_t c : chunk) chunk_bytes *= size_t(c);
    const uint32_t mask = in.ConsumeIntegral<uint8_t>();
    std::vector<uint8_t> bytes;
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:  // bytes of the fuzzer's choosing
        bytes =
            in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 2 * chunk_bytes + 16));
        break;
      case 1: {  // a valid deflate stream of a chosen length
        const size_t n = in.ConsumeIntegralInRange<size_t>(0, 2 * chunk_bytes + 16);
        std::vector<uint8_t> plain(n, uint8_t(in.ConsumeIntegral<uint8_t>()));
        uLongf zn = compressBound(uLong(n));
        bytes.resize(zn);
        if (compress2(bytes.data(), &zn, plain.data(), uLong(n), 4) != Z_OK) return;
        bytes.resize(zn);
        break;
      }
      default: {  // the chunk as stored, cut short or grown
        hsize_t stored = 0;
        if (H5Dget_chunk_storage_size(nd, off.data(), &stored) < 0 || stored == 0) return;
        bytes.resize(size_t(stored));
        uint32_t m = 0;
        if (H5Dread_chunk(nd, H5P_DEFAULT, off.data(), &m, bytes.data()) < 0) return;
        bytes.resize(in.ConsumeIntegralInRange<size_t>(0, size_t(stored) + 8));
        break;
      }
    }
    if (bytes.empty()) bytes.push_back(0);
    if (H5Dwrite_chunk(nd, H5P_DEFAULT, mask, off.data(), bytes.size(), bytes.data()) < 0) return;
  }
  d.reset();
  if (H5Ldelete(f, path.c_str(), H5P_DEFAULT) < 0) return;
  H5Lmove(f, tmp.c_str(), f, path.c_str(), H5P_DEFAULT, H5P_DEFAULT);
}

// The names of attributes the reader looks for, also where a seed has none.
const char* const kAttrNames[] = {"format",      "format_version", "world_size",
                                  "num_batches", "seed",           "kind",
                                  "rank",        "dtype",          "variable_batch_per_feature"};

void apply_recipe(const uint8_t* data, size_t size) {
  if (seeds().empty()) return;
  FuzzedDataProvider in(data, size);
  const std::vector<uint8_t>& seed =
      seeds()[in.ConsumeIntegralInRange<size_t>(0, seeds().size() - 1)];
  std::vector<uint8_t> image = seed;
  static std::atomic<uint64_t> seq{0};
  const std::string name = "recipe#" + std::to_string(seq.fetch_add(1));
  std::vector<uint8_t> out;
  {
    H fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    if (H5Pset_fapl_core(fapl, 1 << 16, 0) < 0 ||
        H5Pset_file_image(fapl, image.data(), image.size()) < 0)
      return;
    H f(H5Fopen(name.c_str(), H5F_ACC_RDWR, fapl), H5Fclose);
    if (f < 0) return;
    const Objects objs = objects_of(f);
    // A dataset is rewritten at most once: the rewrite reads its values with H5Dread, which
    // must see the seed's intact chunks (libhdf5 1.10 reads out of bounds on a short chunk,
    // e.g. in its fletcher32 filter: what the reader's checks are for).
    std::vector<std::string> rewritten;
    const int edits = in.ConsumeIntegralInRange<int>(1, 4);
    for (int e = 0; e < edits && in.remaining_bytes() > 0; ++e) {
      if (in.ConsumeBool() || objs.datasets.empty()) {
        const std::string& obj =
            objs.all[in.ConsumeIntegralInRange<size_t>(0, objs.all.size() - 1)];
        H o(H5Oopen(f, obj.c_str(), H5P_DEFAULT), H5Oclose);
        if (o < 0) continue;
        std::vector<std::string> names;
        hsize_t idx = 0;
        H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_INC, &idx, add_attr, &names);
        for (const char* n : kAttrNames) names.emplace_back(n);
        rewrite_attr(o, names[in.ConsumeIntegralInRange<size_t>(0, names.size() - 1)], in);
      } else {
        const std::string& path =
            objs.datasets[in.ConsumeIntegralInRange<size_t>(0, objs.datasets.size() - 1)];
        if (std::find(rewritten.begin(), rewritten.end(), path) != rewritten.end()) continue;
        rewritten.push_back(path);
        rewrite_chunks(f, path, in);
      }
    }
    if (H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) return;
    const ssize_t n = H5Fget_file_image(f, nullptr, 0);
    if (n <= 0) return;
    out.resize(size_t(n));
    if (H5Fget_file_image(f, out.data(), out.size()) != n) return;
  }
  H5Eclear2(H5E_DEFAULT);
  read_capture(out.data(), out.size());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  load_seeds();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= 8 && std::memcmp(data, "\x89HDF\r\n\x1a\n", 8) == 0)
    read_capture(data, size);
  else
    apply_recipe(data, size);
  return 0;
}
