// `dynemb-dist validate PLAN.yaml [--capture CAPTURE.h5] [--format text|json]` (cli.md):
// the static checks of plan-format.md, then a summary of the plan and the per-rank memory of
// its sharded tables (rows x D x dtype bytes).
//
// Text report (stdout), nccl-tests style: findings in GCC format, then `#`-prefixed header,
// units and summary lines around right-aligned number columns. JSON report: versioned
// ("schema_version"), same content.
#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "annotations.hpp"
#include "capture/capture.hpp"
#include "commands.hpp"
#include "common/console.hpp"
#include "common/error.hpp"
#include "common/memory.hpp"
#include "common/safe_text.hpp"
#include "common/sha256.hpp"
#include "engine/memory_estimate.hpp"
#include "plan/plan.hpp"
#include "registry.hpp"

namespace dynemb::cli {
namespace {

constexpr const char* kSchemaVersion = "1.0.0";
// Above this many tables the per-rank table switches from one column pair per table to one
// line per (rank, table), so it stays readable.
constexpr size_t kMaxWideTables = 6;

struct ValidateOptions {
  std::string plan_path;
  std::string capture_path;
  std::string format = "text";
  std::string annotations;   // "", "github", "none" ("": github under GITHUB_ACTIONS=true)
  int64_t batch_size = 128;  // for the memory estimate
  double bag_length = 4;
};

// GitHub annotations, one per finding, at the plan's file:line:col (capture findings: at the
// capture file, the HDF5 path in the title).
std::string validate_annotations(const ValidateOptions& o,
                                 const std::vector<Diagnostic>& findings) {
  std::string out;
  for (const Diagnostic& d : findings) {
    const char* level = d.severity == Severity::error     ? "error"
                        : d.severity == Severity::warning ? "warning"
                                                          : "notice";
    std::string file = d.loc.file, title = "dynemb-dist validate";
    if (d.loc.line <= 0 && !o.capture_path.empty() &&
        file.compare(0, o.capture_path.size() + 1, o.capture_path + ":") == 0) {
      title += ": " + file.substr(o.capture_path.size() + 1);  // the HDF5 path
      file = o.capture_path;
    }
    if (!d.path.empty()) title += ": " + d.path;
    out += gha_annotation(level, file, d.loc.line, d.loc.col, title, d.message);
  }
  return out;
}

// Capture checks (cli.md: world size, features, dims, every rank/batch shape, without running
// anything). The first inconsistency becomes an error finding located at its HDF5 path.
std::vector<Diagnostic> check_capture_against_plan(const Plan& plan,
                                                   const std::string& capture_path) {
  try {
    const CaptureReader reader(capture_path);
    check_capture(reader, &plan);
    if (reader.num_batches() > 0) return {};
    // Well formed, but a replay of it would check nothing: replay refuses it (exit 2).
    Diagnostic d;
    d.severity = Severity::warning;
    d.loc.file = capture_path + ":/batches";
    d.message = "no batches: the capture holds 0 (num_batches = 0); replay refuses it (exit 2)";
    return {d};
  } catch (const CaptureError& e) {
    Diagnostic d;
    d.severity = Severity::error;
    d.loc.file = e.file() + ":" + e.h5path();
    d.message = e.message();
    return {d};
  }
}

const char* severity_name(Severity s) {
  return s == Severity::error ? "error" : s == Severity::warning ? "warning" : "note";
}

// Per-rank shard rows and bytes of every table: rows[t][r], bytes[t][r]; totals per rank.
struct RankTable {
  std::vector<std::vector<int64_t>> rows, bytes;
  std::vector<int64_t> total_rows, total_bytes;
};

RankTable per_rank(const Plan& plan) {
  RankTable rt;
  const size_t W = static_cast<size_t>(plan.world_size);
  rt.total_rows.assign(W, 0);
  rt.total_bytes.assign(W, 0);
  for (const TableConfig& t : plan.tables) {
    std::vector<int64_t> rows = shard_rows_per_rank(t, plan.world_size);
    std::vector<int64_t> bytes(W);
    // The loader checked that num_embeddings x D x bytes of all tables fits in int64.
    for (size_t r = 0; r < W; ++r) {
      bytes[r] = rows[r] * t.embedding_dim * dtype_bytes(t.data_type);
      rt.total_rows[r] += rows[r];
      rt.total_bytes[r] += bytes[r];
    }
    rt.rows.push_back(std::move(rows));
    rt.bytes.push_back(std::move(bytes));
  }
  return rt;
}

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 6) v /= 1024.0, ++u;
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

struct Counts {
  int errors = 0, warnings = 0, notes = 0;
};
Counts count(const std::vector<Diagnostic>& ds) {
  Counts c;
  for (const Diagnostic& d : ds) {
    if (d.severity == Severity::error)
      ++c.errors;
    else if (d.severity == Severity::warning)
      ++c.warnings;
    else
      ++c.notes;
  }
  return c;
}

std::string plural(int n, const char* word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

// ---------------------------------------------------------------- text report

void print_text(const std::string& plan_path, const Plan* plan, int64_t mem_batch_size,
                double mem_bag_length, const std::vector<Diagnostic>& findings, int exit_code) {
  // Names and findings come from the plan file: each escaped, one finding per line.
  std::string out = fmt::format("# dynemb-dist validate {}\n", escape_field(plan_path));
  for (const Diagnostic& d : findings) out += escape_field(d.str()) + "\n";

  if (plan) {
    const Plan& p = *plan;
    std::vector<std::string> tname;
    for (const TableConfig& t : p.tables) tname.push_back(escape_field(t.name));
    out += fmt::format(
        "#\n# world_size {}  module {}  comm_precision {}  bounds_check {}  {}data_type {}  "
        "{} {}\n",
        p.world_size, to_string(p.module), to_string(p.comm_precision), to_string(p.bounds_check),
        p.input_dist == InputDist::training ? "" : "input_dist inference  ",
        to_string(p.data_type()), p.module == ModuleKind::sequence ? "D" : "sum_D", p.sum_dim);

    // Features in sharding order with their block size (docs/semantics.md §2).
    size_t wf = 7, wt = 5;
    for (const FeatureInfo& f : p.features) {
      wf = std::max(wf, escape_field(f.name).size());
      wt = std::max(wt, tname[static_cast<size_t>(f.table)].size());
    }
    out += "#\n";
    out += fmt::format("# {:>{}}  {:>{}}  {:>15}  {:>14}  {:>7}  {:>12}{}\n", "feature", wf,
                       "table", wt, "dist_type", "num_embeddings", "D", "blk",
                       p.module == ModuleKind::pooled ? "  pooling  columns" : "");
    out += fmt::format("# {:>{}}  {:>{}}  {:>15}  {:>14}  {:>7}  {:>12}{}\n", "", wf, "", wt, "",
                       "(rows)", "", "(rows/rank)",
                       p.module == ModuleKind::pooled ? "           [lo,hi)" : "");
    for (const FeatureInfo& f : p.features) {
      std::string pooled_cols;
      if (p.module == ModuleKind::pooled)
        pooled_cols = fmt::format("  {:>7}  {:>7}", to_string(f.pooling),
                                  fmt::format("[{},{})", f.column_offset, f.column_offset + f.dim));
      // An inference plan's uneven shards route by their offsets: no one block size.
      const std::string blk = routes_by_shards(p, p.tables[static_cast<size_t>(f.table)])
                                  ? "shards"
                                  : std::to_string(f.block_size);
      out += fmt::format("  {:>{}}  {:>{}}  {:>15}  {:>14}  {:>7}  {:>12}{}\n",
                         escape_field(f.name), wf, tname[static_cast<size_t>(f.table)], wt,
                         to_string(f.dist_type), f.hash_size, f.dim, blk, pooled_cols);
    }

    // Per-rank memory of the sharded tables.
    const RankTable rt = per_rank(p);
    const size_t W = static_cast<size_t>(p.world_size);
    out += "#\n# per-rank shards: rows, and bytes = rows x D x dtype bytes\n";
    if (p.tables.size() <= kMaxWideTables) {
      std::vector<size_t> w;
      for (size_t t = 0; t < p.tables.size(); ++t) {
        size_t width = std::max<size_t>(8, tname[t].size());
        for (size_t r = 0; r < W; ++r)
          width = std::max(width, std::to_string(rt.bytes[t][r]).size());
        w.push_back(width);
      }
      size_t wtot = 11;
      for (size_t r = 0; r < W; ++r)
        wtot = std::max(wtot, std::to_string(rt.total_bytes[r]).size());
      std::string h1 = fmt::format("# {:>4}", "rank"), h2 = fmt::format("# {:>4}", "");
      for (size_t t = 0; t < p.tables.size(); ++t) {
        h1 += fmt::format("  {:>{}}  {:>{}}", tname[t], w[t], tname[t], w[t]);
        h2 += fmt::format("  {:>{}}  {:>{}}", "(rows)", w[t], "(B)", w[t]);
      }
      h1 += fmt::format("  {:>{}}  {:>{}}\n", "total", wtot, "total", wtot);
      h2 += fmt::format("  {:>{}}  {:>{}}\n", "(rows)", wtot, "(B)", wtot);
      out += h1 + h2;
      for (size_t r = 0; r < W; ++r) {
        std::string line = fmt::format("  {:>4}", r);
        for (size_t t = 0; t < p.tables.size(); ++t)
          line += fmt::format("  {:>{}}  {:>{}}", rt.rows[t][r], w[t], rt.bytes[t][r], w[t]);
        out += line +
               fmt::format("  {:>{}}  {:>{}}\n", rt.total_rows[r], wtot, rt.total_bytes[r], wtot);
      }
    } else {
      // Long form: one line per (rank, table), then the rank's total.
      size_t wt2 = 5;
      for (const std::string& n : tname) wt2 = std::max(wt2, n.size());
      out +=
          fmt::format("# {:>4}  {:>{}}  {:>14}  {:>16}\n", "rank", "table", wt2, "rows", "bytes");
      out += fmt::format("# {:>4}  {:>{}}  {:>14}  {:>16}\n", "", "", wt2, "(rows)", "(B)");
      for (size_t r = 0; r < W; ++r) {
        for (size_t t = 0; t < p.tables.size(); ++t)
          out += fmt::format("  {:>4}  {:>{}}  {:>14}  {:>16}\n", r, tname[t], wt2, rt.rows[t][r],
                             rt.bytes[t][r]);
        out += fmt::format("  {:>4}  {:>{}}  {:>14}  {:>16}\n", r, "total", wt2, rt.total_rows[r],
                           rt.total_bytes[r]);
      }
    }
    const auto busiest = std::max_element(rt.total_bytes.begin(), rt.total_bytes.end());
    int64_t all = 0;
    for (int64_t b : rt.total_bytes) all += b;
    out += fmt::format("# tables {}  features {}  total bytes {} ({})\n", p.tables.size(),
                       p.features.size(), all, human_bytes(all));
    out += fmt::format("# busiest rank {}: {} bytes ({})\n", busiest - rt.total_bytes.begin(),
                       *busiest, human_bytes(*busiest));
    // One batch of every rank is in memory at once in synth and replay (W^2 terms included).
    const MemoryEstimate m = estimate_batch_memory(p, mem_batch_size, mem_bag_length);
    out += fmt::format("# memory per batch: {}\n", m.summary());
    if (const uint64_t have = usable_memory_bytes(); have > 0 && m.replay > double(have))
      out += fmt::format(
          "# memory per batch: more than this machine's {}: synth and replay of this batch size "
          "would be refused (lower --batch-size)\n",
          dynemb::human_bytes(double(have)));
  }
  const Counts c = count(findings);
  out += fmt::format("# status: {} ({}, {}, {}), exit {}\n", exit_code == 0 ? "ok" : "error",
                     plural(c.errors, "error"), plural(c.warnings, "warning"),
                     plural(c.notes, "note"), exit_code);
  console::out(out);
}

// ---------------------------------------------------------------- JSON report

void print_json(const ValidateOptions& o, const Plan* plan, const std::vector<Diagnostic>& findings,
                int exit_code) {
  using nlohmann::json;
  json j;
  j["schema_version"] = kSchemaVersion;
  j["tool"] = {
      {"name", "dynemb-dist"}, {"version", DYNEMB_VERSION}, {"backends", compiled_backends()}};
  j["command"] = "validate";
  j["plan_path"] = o.plan_path;
  try {  // which bytes were checked (null when the file cannot be read)
    j["plan_sha256"] = sha256_file(o.plan_path);
  } catch (const Error&) {
    j["plan_sha256"] = nullptr;
  }
  j["capture_path"] = o.capture_path.empty() ? json(nullptr) : json(o.capture_path);

  json fs = json::array();
  for (const Diagnostic& d : findings) {
    fs.push_back({{"file", d.loc.file},
                  {"line", d.loc.line},
                  {"col", d.loc.col},
                  {"severity", severity_name(d.severity)},
                  {"path", d.path},
                  {"message", d.message},
                  {"text", d.str()}});
  }
  j["findings"] = fs;

  if (plan) {
    const Plan& p = *plan;
    json tables = json::array();
    for (const TableConfig& t : p.tables) {
      tables.push_back({{"name", t.name},
                        {"num_embeddings", t.num_embeddings},
                        {"embedding_dim", t.embedding_dim},
                        {"data_type", to_string(t.data_type)},
                        {"pooling", to_string(t.pooling)},
                        {"dist_type", to_string(t.dist_type)},
                        {"features", t.features},
                        {"explicit_shards", !t.shards.empty()}});
    }
    json features = json::array();
    for (const FeatureInfo& f : p.features) {
      features.push_back({{"name", f.name},
                          {"table", p.tables[static_cast<size_t>(f.table)].name},
                          {"dim", f.dim},
                          {"hash_size", f.hash_size},
                          {"block_size", f.block_size},
                          {"dist_type", to_string(f.dist_type)},
                          {"column_offset", f.column_offset}});
    }
    j["plan"] = {{"format_version", p.format_version},
                 {"world_size", p.world_size},
                 {"module", to_string(p.module)},
                 {"comm_precision", to_string(p.comm_precision)},
                 {"bounds_check", to_string(p.bounds_check)},
                 {"input_dist", to_string(p.input_dist)},
                 {"data_type", to_string(p.data_type())},
                 {"sum_dim", p.sum_dim},
                 {"tables", tables},
                 {"features", features}};
    const RankTable rt = per_rank(p);
    json ranks = json::array();
    for (size_t r = 0; r < static_cast<size_t>(p.world_size); ++r) {
      json shards = json::array();
      for (size_t t = 0; t < p.tables.size(); ++t)
        shards.push_back(
            {{"table", p.tables[t].name}, {"rows", rt.rows[t][r]}, {"bytes", rt.bytes[t][r]}});
      ranks.push_back({{"rank", r},
                       {"shards", shards},
                       {"total_rows", rt.total_rows[r]},
                       {"total_bytes", rt.total_bytes[r]}});
    }
    j["per_rank"] = ranks;
  } else {
    j["plan"] = nullptr;
    j["per_rank"] = nullptr;
  }
  const Counts c = count(findings);
  j["summary"] = {{"status", exit_code == 0 ? "ok" : "error"},
                  {"exit_code", exit_code},
                  {"errors", c.errors},
                  {"warnings", c.warnings},
                  {"notes", c.notes}};
  // Every string escaped (common/safe_text.hpp): valid UTF-8 whatever the plan or capture holds.
  escape_json_strings(j);
  console::out(j.dump(2) + "\n");
}

int run_validate(const ValidateOptions& o) {
  PlanLoadResult r;
  try {
    r = load_plan_file(o.plan_path);
  } catch (const Error& e) {
    if (o.format != "json") throw;  // app.cpp prints it, exit 2
    Diagnostic d;
    d.loc.file = o.plan_path;
    d.message = e.what();
    r.findings.push_back(d);
  }
  if (r.ok() && !o.capture_path.empty()) {
    std::vector<Diagnostic> more = check_capture_against_plan(*r.plan, o.capture_path);
    r.findings.insert(r.findings.end(), more.begin(), more.end());
  }
  const int exit_code = count(r.findings).errors == 0 && r.plan ? 0 : 2;
  const Plan* plan = exit_code == 0 ? &*r.plan : nullptr;
  if (o.format == "json")
    print_json(o, plan, r.findings, exit_code);
  else
    print_text(o.plan_path, plan, o.batch_size, o.bag_length, r.findings, exit_code);
  // With --format json, stdout is the JSON document: annotations only when asked for
  // explicitly (not from GITHUB_ACTIONS, so scripts that merge the streams keep valid JSON),
  // and on stderr (the Actions runner reads workflow commands from both).
  if (o.format == "json" ? o.annotations == "github" : annotations_enabled(o.annotations))
    (o.format == "json" ? console::err_annotations
                        : console::out_annotations)(validate_annotations(o, r.findings));
  return exit_code;
}

}  // namespace

void setup_validate(CLI::App& app, RunFn& run) {
  auto opt = std::make_shared<ValidateOptions>();
  auto* sub = app.add_subcommand(
      "validate",
      "Static checks of a sharding plan (plan-format.md); prints findings as "
      "FILE:LINE:COL: error|warning|note: ..., then the features with their block size and "
      "the per-rank rows and bytes of every table's shard.");
  sub->add_option("plan", opt->plan_path, "The plan to check (plan.yaml)")
      ->required()
      ->type_name("PLAN.yaml");
  sub->add_option("--capture", opt->capture_path,
                  "Also check this capture against the plan (world size, features, dims, "
                  "every rank/batch shape) without running anything")
      ->type_name("CAPTURE.h5");
  sub->add_option("--batch-size", opt->batch_size,
                  "Local batch size B per rank for the memory estimate (default 128)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--bag-length", opt->bag_length,
                  "Mean ids per bag for the memory estimate (default 4)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--format", opt->format, "Report format: text (default) or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->type_name("text|json");
  sub->add_option("--annotations", opt->annotations,
                  "CI annotations on stdout: 'github' (::error file=PLAN,line=L,col=C::message "
                  "per finding; warnings ::warning, notes ::notice) or 'none'; default github "
                  "when GITHUB_ACTIONS=true (text format only), else none")
      ->check(CLI::IsMember({"github", "none"}))
      ->type_name("github|none");
  sub->footer(
      "Exit status:\n"
      "  0  no error (warnings and notes allowed)\n"
      "  2  the plan has an error, cannot be read, or the command line is wrong");
  sub->callback([opt, &run] { run = [opt] { return run_validate(*opt); }; });
}

}  // namespace dynemb::cli
