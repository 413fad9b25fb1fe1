// The load report as a self-contained HTML page (`load --html FILE`, docs/load.md), drawn with
// lib/html: per-rank bars of every plan side by side (ids, unique rows, bytes each dist brings
// in), the W x W traffic of both dists per plan as heat maps, the imbalance (max / mean) of
// each table under each plan, the hottest rank's tables and rows, and the critical-path
// estimates of the dists. Ranks are drawn in blocks past 64 (html/page.hpp).
#pragma once

#include <string>

#include "load/load.hpp"

namespace dynemb::load {

// The page (the whole document).
std::string load_html(const LoadReport& report);

// Writes load_html(report) to `path` through common/output_file (a temporary renamed into
// place when complete, removed on failure or signal). Throws Error / UsageError naming it.
void write_load_html(const LoadReport& report, const std::string& path);

}  // namespace dynemb::load
