#include "export.hpp"

#include <fmt/core.h>

#include <filesystem>

#include "common/error.hpp"
#include "common/output_file.hpp"
#include "common/safe_text.hpp"

namespace dynemb::bench {
namespace {

std::string path_of(const Options& o, const std::string& file) {
  return o.export_dir + "/" + file;
}

void write_file(const std::string& path, const std::string& bytes) {
  OutputFile out(path);
  out.write(bytes);
  out.commit();
}

}  // namespace

std::vector<std::string> export_file_names() {
  return {"bk_ids.npy",          "bk_lengths.npy", "bk_bag_blk.npy",
          "bk_rank_bag_off.npy", "bk_perm.npy",    "seq_perm_global.npy",
          "seq_recat_rows.npy",  "seq_slices.npy", "meta.json"};
}

void check_export_outputs(const Options& o) {
  std::vector<NamedPath> inputs, outputs;
  if (!o.capture.empty()) inputs.push_back({"capture", o.capture});
  if (!o.json.empty()) outputs.push_back({"--json", o.json});
  if (!o.export_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.export_dir, ec);
    if (ec)
      throw Error(fmt::format("bench --export: cannot create {}: {}", o.export_dir, ec.message()));
    for (const std::string& f : export_file_names())
      outputs.push_back({"--export " + f, path_of(o, f)});
  }
  check_output_clashes(inputs, outputs);
}

void write_npy_i64(const Options& o, const std::string& name, const std::vector<int64_t>& v) {
  std::string hdr =
      fmt::format("{{'descr': '<i8', 'fortran_order': False, 'shape': ({},), }}", v.size());
  while ((10 + hdr.size() + 1) % 64 != 0) hdr += ' ';  // header padded to 64 bytes
  hdr += '\n';
  std::string bytes("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(hdr.size());
  bytes.append(reinterpret_cast<const char*>(&len), 2);  // little-endian hosts only
  bytes += hdr;
  bytes.append(reinterpret_cast<const char*>(v.data()), 8 * v.size());
  write_file(path_of(o, name + ".npy"), bytes);
}

void write_meta_json(const Options& o, const nlohmann::json& meta) {
  nlohmann::json safe = meta;
  escape_json_strings(safe);  // valid UTF-8 whatever a path or name holds
  write_file(path_of(o, "meta.json"), safe.dump(2) + "\n");
}

}  // namespace dynemb::bench
