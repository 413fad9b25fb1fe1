// `bench --export DIR`: the index data of the benched batch as .npy files (format 1.0,
// little-endian int64 vectors, C order) plus meta.json, for bench/peer_torch.py to time torch's
// composition on the same data. Every file goes through OutputFile (temporary name, renamed when
// complete, removed on failure or interrupt), and all of them are checked against the inputs
// before any work (check_export_outputs).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "run.hpp"

namespace dynemb::bench {

// The file names --export may write (the .npy arrays and meta.json).
std::vector<std::string> export_file_names();

// Throws UsageError when --json or any export file is the capture (or the other), whatever the
// spelling, and creates the export directory. Call before any work.
void check_export_outputs(const Options& o);

void write_npy_i64(const Options& o, const std::string& name, const std::vector<int64_t>& v);
void write_meta_json(const Options& o, const nlohmann::json& meta);

}  // namespace dynemb::bench
