// The merge of per-rank files into one capture (merge.hpp).
#include "capture/merge.hpp"

#include <fmt/core.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "capture/capture.hpp"
#include "capture/h5chunks.hpp"
#include "capture/h5string.hpp"
#include "capture/h5util.hpp"
#include "common/error.hpp"
#include "common/memory.hpp"
#include "common/output_file.hpp"
#include "common/test_hooks.hpp"

namespace dynemb {

namespace {

using h5::Hid;

struct RankFile {
  std::string path;
  Hid file;
  int64_t rank = -1;
  int64_t world_size = 0;
  int64_t num_batches = 0;
  std::string plan;
  std::optional<uint64_t> oracle_seed;
  std::string oracle_kind;
};

// Scalar string attribute / dataset, fixed or variable length (h5string.hpp: variable-length
// strings are resolved from the file's bytes, never by libhdf5's global heap code). nullopt
// when missing; one of another form is refused saying what it is.
std::optional<std::string> string_attr(hid_t obj, const char* name, const h5::RawFile& raw,
                                       const std::string& file, const std::string& where) {
  if (!h5::has_attr(obj, name)) return std::nullopt;
  std::string s, why;
  if (!h5::read_string_attr(obj, name, raw, s, why))
    throw CaptureError(file, where, fmt::format("attribute '{}': {}", name, why));
  return s;
}

std::optional<std::string> string_dataset(hid_t file, const char* path, const h5::RawFile& raw,
                                          const std::string& file_name) {
  if (!h5::exists(file, path)) return std::nullopt;
  Hid d(H5Dopen2(file, path, H5P_DEFAULT), H5Dclose);
  std::string s, why;
  if (!d.valid()) throw CaptureError(file_name, path, "not a dataset: " + h5::last_error());
  if (!h5::read_string_dataset(d.get(), raw, s, why)) throw CaptureError(file_name, path, why);
  return s;
}

// Names of the links directly under `group`.
std::vector<std::string> children(hid_t loc, const std::string& group) {
  std::vector<std::string> names;
  Hid g(H5Gopen2(loc, group.c_str(), H5P_DEFAULT), H5Gclose);
  if (!g.valid()) return names;
  H5G_info_t info;
  if (H5Gget_info(g.get(), &info) < 0) return names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t n =
        H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (n < 0) continue;
    std::string name(static_cast<size_t>(n) + 1, '\0');
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                       H5P_DEFAULT);
    name.resize(static_cast<size_t>(n));
    names.push_back(name);
  }
  return names;
}

constexpr uint64_t kMaxMergeGrid = 1 << 16;

RankFile open_rank_file(const std::string& path) {
  RankFile rf;
  rf.path = path;
  if (access(path.c_str(), R_OK) != 0) throw CaptureError(path, "/", "cannot open file");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw CaptureError(path, "/", "not an HDF5 file");
  rf.file = Hid(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!rf.file.valid()) throw CaptureError(path, "/", "cannot open as HDF5");
  hid_t f = rf.file.get();
  const h5::RawFile raw = h5::RawFile::open_path(path);
  auto format = string_attr(f, "format", raw, path, "/");
  if (!format || *format != kCaptureFormat)
    throw CaptureError(path, "/",
                       fmt::format("attribute format: want \"{}\", got {}", kCaptureFormat,
                                   format ? "\"" + *format + "\"" : "none"));
  // Integer attributes through the one checked read (h5util.hpp): one element of an integer
  // type, else the file is refused naming the attribute.
  auto version = h5::int64_attr(f, "format_version", path, "/");
  if (!version || *version != kCaptureFormatVersion)
    throw CaptureError(
        path, "/",
        fmt::format("attribute format_version: this build reads version {}, got {}",
                    kCaptureFormatVersion, version ? std::to_string(*version) : "none"));
  auto ws = h5::int64_attr(f, "world_size", path, "/");
  if (!ws || *ws < 1) throw CaptureError(path, "/", "attribute world_size: missing or < 1");
  rf.world_size = *ws;
  auto nb = h5::int64_attr(f, "num_batches", path, "/");
  if (!nb || *nb < 0) throw CaptureError(path, "/", "attribute num_batches: missing or < 0");
  rf.num_batches = *nb;
  auto rank = h5::int64_attr(f, "rank", path, "/");
  if (!rank)
    throw CaptureError(
        path, "/",
        "attribute rank: missing (not a per-rank file from the dynemb_capture package?)");
  if (*rank < 0 || *rank >= rf.world_size)
    throw CaptureError(path, "/",
                       fmt::format("attribute rank: {} not in [0, {})", *rank, rf.world_size));
  rf.rank = *rank;
  auto plan = string_dataset(f, "/plan", raw, path);
  if (!plan) throw CaptureError(path, "/plan", "missing or not a scalar string");
  rf.plan = *plan;
  if (H5Lexists(f, "/oracle", H5P_DEFAULT) > 0) {
    Hid g(H5Gopen2(f, "/oracle", H5P_DEFAULT), H5Gclose);
    auto kind = string_attr(g.get(), "kind", raw, path, "/oracle");
    auto seed = h5::int_attr_value(g.get(), "seed", path, "/oracle");
    if (!kind || !seed) throw CaptureError(path, "/oracle", "needs attributes kind and seed");
    rf.oracle_kind = *kind;
    rf.oracle_seed = seed->bits;
  }
  // Exactly the batch groups 0..nb-1, each with exactly this file's rank group.
  auto batches = children(f, "/batches");
  if (static_cast<int64_t>(batches.size()) != rf.num_batches)
    throw CaptureError(
        path, "/batches",
        fmt::format("{} batch groups, num_batches says {}", batches.size(), rf.num_batches));
  const std::string want_rank = "rank" + std::to_string(rf.rank);
  for (int64_t k = 0; k < rf.num_batches; ++k) {
    std::string bp = "/batches/" + std::to_string(k);
    if (!h5::exists(f, bp)) throw CaptureError(path, bp, "missing batch group");
    auto ranks = children(f, bp);
    for (const auto& r : ranks)
      if (r != want_rank)
        throw CaptureError(path, bp + "/" + r,
                           fmt::format("unexpected group in the file of rank {}", rf.rank));
    if (ranks.empty()) throw CaptureError(path, bp + "/" + want_rank, "missing rank group");
  }
  // The groups are copied verbatim: a filter the reader cannot undo, or a chunk whose record
  // (stored size, filter mask) cannot be one of its dataset's, is named in this file now
  // rather than in the merged one. Records only (the chunk index, no chunk read): the reader
  // of the merged capture checks each chunk's decoded size when it reads it. A chunk grid of
  // more than kMaxMergeGrid chunks (one index look-up each) is left to the reader.
  std::string bad_path, why;
  if (!h5::check_chunks_under(f, bad_path, why, /*decode_too=*/false, kMaxMergeGrid))
    throw CaptureError(path, bad_path, why);
  return rf;
}

// Copies src:/path to dst:/path (the parent group must exist in dst).
void copy_object(const RankFile& src, hid_t dst, const std::string& path,
                 const std::string& out_tmp) {
  if (H5Ocopy(src.file.get(), path.c_str(), dst, path.c_str(), H5P_DEFAULT, H5P_DEFAULT) < 0)
    throw CaptureError(out_tmp, path,
                       fmt::format("cannot copy it from {}: {}", src.path, h5::last_error()));
}

// The training step of batch `bp` (attribute `iteration` of rank 0's batch group, written by
// dynemb_capture), onto the merged batch group `bg`; nothing when rank 0's file has none.
void copy_iteration(const RankFile& src, hid_t bg, const std::string& bp,
                    const std::string& out_tmp) {
  if (H5Aexists_by_name(src.file.get(), bp.c_str(), "iteration", H5P_DEFAULT) <= 0) return;
  Hid a(H5Aopen_by_name(src.file.get(), bp.c_str(), "iteration", H5P_DEFAULT, H5P_DEFAULT),
        H5Aclose);
  Hid t(a.valid() ? H5Aget_type(a.get()) : H5I_INVALID_HID, H5Tclose);
  Hid sp(a.valid() ? H5Aget_space(a.get()) : H5I_INVALID_HID, H5Sclose);
  int64_t v = 0;
  if (!t.valid() || !sp.valid() || H5Tget_class(t.get()) != H5T_INTEGER ||
      H5Sget_simple_extent_npoints(sp.get()) != 1 || H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0)
    throw CaptureError(src.path, bp, "attribute 'iteration': want one integer");
  Hid s1(H5Screate(H5S_SCALAR), H5Sclose);
  Hid o(H5Acreate2(bg, "iteration", H5T_STD_I64LE, s1.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!o.valid() || H5Awrite(o.get(), H5T_NATIVE_INT64, &v) < 0)
    throw CaptureError(out_tmp, bp, "cannot write attribute 'iteration': " + h5::last_error());
}

template <typename T>
void write_attr(hid_t obj, const char* name, hid_t type, const T& v) {
  Hid s(H5Screate(H5S_SCALAR), H5Sclose);
  Hid a(H5Acreate2(obj, name, type, s.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid() || H5Awrite(a.get(), type, &v) < 0)
    throw Error(fmt::format("cannot write root attribute {}", name));
}

void write_string_attr(hid_t obj, const char* name, const std::string& v) {
  Hid t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), v.size());
  H5Tset_strpad(t.get(), H5T_STR_NULLPAD);
  Hid s(H5Screate(H5S_SCALAR), H5Sclose);
  Hid a(H5Acreate2(obj, name, t.get(), s.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid() || H5Awrite(a.get(), t.get(), v.data()) < 0)
    throw Error(fmt::format("cannot write root attribute {}", name));
}

// check_capture of the merged temporary. Its objects are verbatim copies: a damaged one is
// named in the per-rank file it came from (/batches/<k>/rank<r>/... from rank r's, the rest
// from rank 0's), not in the temporary.
void check_merged(const std::string& tmp, const std::map<int64_t, const RankFile*>& by_rank) {
  try {
    check_capture(tmp);
  } catch (const CaptureError& e) {
    if (e.file() != tmp) throw;
    const std::string& p = e.h5path();
    const RankFile* from = by_rank.at(0);
    long long k = 0, r = 0;
    int used = 0;
    if (std::sscanf(p.c_str(), "/batches/%lld/rank%lld%n", &k, &r, &used) == 2 &&
        (p[size_t(used)] == '\0' || p[size_t(used)] == '/') && by_rank.count(r))
      from = by_rank.at(r);
    else if (p.rfind("/batches", 0) == 0)
      throw;  // a batch group the merge made, not one it copied
    throw CaptureError(from->path, p, e.message());
  }
}

}  // namespace

MergeResult merge_captures(const MergeOptions& opt,
                           const std::function<void(const std::string&)>& on_writing) {
  h5::quiet();  // errors are reported as CaptureError
  // Before any work: OUT is none of the inputs (by device and inode, whatever the spelling),
  // and its temporary can be made next to it.
  std::vector<NamedPath> inputs;
  for (const auto& p : opt.inputs) inputs.push_back({"per-rank file", p});
  check_output_clashes(inputs, {{"-o", opt.output}});
  OutputFile out_file(opt.output, opt.force ? Existing::replace : Existing::refuse);
  std::vector<RankFile> files;
  files.reserve(opt.inputs.size());
  for (const auto& p : opt.inputs) files.push_back(open_rank_file(p));

  // Agreement with the first file: world size, batches, plan text, oracle.
  const RankFile& ref = files.front();
  std::map<int64_t, const RankFile*> by_rank;
  for (const auto& rf : files) {
    if (rf.world_size != ref.world_size)
      throw CaptureError(rf.path, "/",
                         fmt::format("world_size {} differs from {} in {}", rf.world_size,
                                     ref.world_size, ref.path));
    if (rf.num_batches != ref.num_batches)
      throw CaptureError(rf.path, "/",
                         fmt::format("num_batches {} differs from {} in {}", rf.num_batches,
                                     ref.num_batches, ref.path));
    if (rf.plan != ref.plan)
      throw CaptureError(rf.path, "/plan",
                         fmt::format("plan text differs from the one in {}", ref.path));
    if (rf.oracle_seed != ref.oracle_seed || rf.oracle_kind != ref.oracle_kind)
      throw CaptureError(rf.path, "/oracle", fmt::format("differs from /oracle in {}", ref.path));
    auto [it, inserted] = by_rank.emplace(rf.rank, &rf);
    if (!inserted)
      throw CaptureError(
          rf.path, "/",
          fmt::format("rank {} appears twice (also in {})", rf.rank, it->second->path));
  }
  // A job that captured no batch: the merged file would replay nothing (replay refuses it).
  if (ref.num_batches == 0)
    throw CaptureError(ref.path, "/",
                       "no batches: the per-rank files hold 0 (num_batches = 0); nothing to "
                       "merge (did the job capture the steps it was asked for?)");
  for (int64_t r = 0; r < ref.world_size; ++r)
    if (!by_rank.count(r))
      throw UsageError(fmt::format("merge: no file for rank {} of world_size {} ({} file(s) given)",
                                   r, ref.world_size, files.size()));

  const std::string& tmp = out_file.temp_path();
  // Room for the result, before any copy: libhdf5 1.10 crashes inside H5Ocopy when a write
  // fails (a full disk), so a merge that cannot fit is refused here. The groups are copied
  // verbatim: the result is about the size of the inputs.
  uint64_t need = 1 << 20;
  for (const auto& p : opt.inputs) {
    struct stat st;
    if (::stat(p.c_str(), &st) == 0) need += static_cast<uint64_t>(st.st_size);
  }
  if (!test_hooks::merge_no_space_check()) {
    const std::string dir = out_file.resolved().substr(0, out_file.resolved().rfind('/') + 1);
    const uint64_t free = free_bytes_at(dir), limit = file_size_limit();
    if (free < need)
      throw Error(
          fmt::format("merge: {} needs about {} (the per-rank files hold that much), but "
                      "the file system of {} has {} free; free some space or write "
                      "elsewhere",
                      opt.output, human_bytes(double(need)), dir, human_bytes(double(free))));
    if (limit < need)
      throw Error(
          fmt::format("merge: {} needs about {} (the per-rank files hold that much), but "
                      "this process may write files of at most {} (ulimit -f)",
                      opt.output, human_bytes(double(need)), human_bytes(double(limit))));
  }
  if (on_writing) on_writing(fmt::format("merge: writing {}", tmp));
  struct NoteGuard {
    const std::function<void(const std::string&)>& on_writing;
    ~NoteGuard() {
      if (on_writing) on_writing("");
    }
  } note_guard{on_writing};
  {
    Hid out(H5Fcreate(out_file.open_path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
            H5Fclose);
    if (!out.valid())
      throw Error(
          fmt::format("merge: cannot create the temporary file {}: {}", tmp, h5::last_error()));
    hid_t o = out.get();
    write_string_attr(o, "format", kCaptureFormat);
    write_attr(o, "format_version", H5T_STD_I64LE, static_cast<int64_t>(kCaptureFormatVersion));
    write_attr(o, "world_size", H5T_STD_I64LE, ref.world_size);
    write_attr(o, "num_batches", H5T_STD_I64LE, ref.num_batches);

    const RankFile& r0 = *by_rank.at(0);
    copy_object(r0, o, "/plan", tmp);
    if (r0.oracle_seed) copy_object(r0, o, "/oracle", tmp);
    // Full tables, when a rank file carries them, come from rank 0's file.
    if (H5Lexists(r0.file.get(), "/tables", H5P_DEFAULT) > 0) copy_object(r0, o, "/tables", tmp);

    {
      Hid batches(H5Gcreate2(o, "/batches", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      if (!batches.valid())
        throw CaptureError(tmp, "/batches", "cannot write: " + h5::last_error());
      for (int64_t k = 0; k < ref.num_batches; ++k) {
        std::string bp = "/batches/" + std::to_string(k);
        Hid bg(H5Gcreate2(o, bp.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
        if (!bg.valid()) throw CaptureError(tmp, bp, "cannot write: " + h5::last_error());
        copy_iteration(*by_rank.at(0), bg.get(), bp, tmp);
        for (int64_t r = 0; r < ref.world_size; ++r)
          copy_object(*by_rank.at(r), o, bp + "/rank" + std::to_string(r), tmp);
      }
    }
    // A close that fails (the last metadata write on a full disk) is an error, not a success.
    if (H5Fclose(out.release()) < 0)
      throw CaptureError(tmp, "/", "cannot write: " + h5::last_error());
  }
  // The merged file must read as a complete capture against its own plan (shapes, F, sums).
  check_merged(tmp, by_rank);
  commit_outputs({&out_file}, 0);
  return {int64_t(files.size()), ref.num_batches, ref.world_size};
}

}  // namespace dynemb
