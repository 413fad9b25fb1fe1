// `dynemb-dist load CAPTURE [--plan ALT.yaml]... [--alternatives dist-types] [--world-size
// 16,32] [--balance-rows] [--link-gbps N] [--top-rows N] [--json FILE] [--html FILE]
// [--write-plans DIR]`
// (docs/load.md): per-rank load and traffic of a capture's real batches under its own plan
// and alternatives. The work is load::compute_load; this file parses, checks the plans,
// prints and writes.
#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "capture/capture.hpp"
#include "commands.hpp"
#include "common/console.hpp"
#include "common/error.hpp"
#include "common/memory.hpp"
#include "common/output_file.hpp"
#include "common/safe_text.hpp"
#include "load/alternatives.hpp"
#include "load/compute.hpp"
#include "load/load_html.hpp"
#include "progress.hpp"

namespace dynemb::cli {

namespace {

struct LoadArgs {
  std::string capture;
  std::vector<std::string> plans;
  std::string alternatives;  // "" or "dist-types"
  std::vector<int64_t> world_sizes;
  bool balance_rows = false;
  double link_gbps = 100;
  int64_t top_rows = 10;
  std::string json, html, write_plans, max_memory;
  bool quiet = false;
};

// "alt.yaml" -> "alt": the name of a --plan's alternative.
std::string file_stem(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t dot = name.rfind('.');
  if (dot != std::string::npos && dot > 0) name = name.substr(0, dot);
  return name.empty() ? path : name;
}

// An alternative reads the same KJTs: the same module and the same features (KJT keys) with
// the same dims, in the same order. PlanError at the alternative's table otherwise.
void check_same_features(const Plan& alt, const Plan& cap) {
  const SourceLoc whole{alt.path, 0, 0};
  if (alt.module != cap.module)
    throw PlanError(whole, fmt::format("module is {}, the capture's plan ({}) has {}",
                                       to_string(alt.module), cap.path, to_string(cap.module)));
  const int64_t F = std::min(alt.num_features(), cap.num_features());
  for (int64_t f = 0; f < F; ++f) {
    const FeatureInfo& a = alt.features[static_cast<size_t>(f)];
    const FeatureInfo& c = cap.features[static_cast<size_t>(f)];
    const SourceLoc& loc = alt.tables[static_cast<size_t>(a.table)].loc;
    if (a.name != c.name)
      throw PlanError(loc, fmt::format("feature {} is '{}', the capture's plan ({}) has '{}' there "
                                       "(the features, in order, must be the capture's KJT keys)",
                                       f, a.name, cap.path, c.name));
    if (a.dim != c.dim)
      throw PlanError(loc, fmt::format("feature '{}' has embedding_dim {}, {} in the capture's "
                                       "plan ({})",
                                       a.name, a.dim, c.dim, cap.path));
  }
  if (alt.num_features() != cap.num_features())
    throw PlanError(whole, fmt::format("{} features, the capture's plan ({}) has {}",
                                       alt.num_features(), cap.path, cap.num_features()));
}

Plan read_alternative(const std::string& path) {
  PlanLoadResult r = load_plan_file(path);
  for (const Diagnostic& d : r.findings)
    if (d.severity == Severity::error)
      throw PlanError(d.loc, d.path.empty() ? d.message : d.path + ": " + d.message);
  return std::move(*r.plan);
}

void check_args(const LoadArgs& a) {
  if (!(a.link_gbps > 0) || !std::isfinite(a.link_gbps))
    throw UsageError(
        fmt::format("--link-gbps {}: must be a positive number of Gbit/s", a.link_gbps));
  for (int64_t w : a.world_sizes)
    if (w < 1) throw UsageError(fmt::format("--world-size {}: every world size must be >= 1", w));
  if (a.top_rows < 0) throw UsageError("--top-rows must be >= 0");
  if (!a.write_plans.empty() && a.alternatives.empty() && a.world_sizes.empty() && !a.balance_rows)
    throw UsageError(
        "--write-plans writes generated alternatives: give --alternatives, --world-size or "
        "--balance-rows too");
}

// The directory of --write-plans, made when missing (one level).
void prepare_plan_dir(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      throw UsageError(fmt::format("--write-plans {}: not a directory", escape_field(dir)));
    return;
  }
  if (::mkdir(dir.c_str(), 0777) != 0)
    throw Error(fmt::format("--write-plans {}: cannot create the directory: {}", escape_field(dir),
                            errno_text(errno)));
}

int run_load(const LoadArgs& a) {
  check_args(a);
  std::vector<NamedPath> inputs{{"capture", a.capture}};
  for (const std::string& p : a.plans) inputs.push_back({"--plan", p});
  std::vector<NamedPath> outputs;
  if (!a.json.empty()) outputs.push_back({"--json", a.json});
  if (!a.html.empty()) outputs.push_back({"--html", a.html});
  check_output_clashes(inputs, outputs);
  std::unique_ptr<OutputFile> json_out;
  if (!a.json.empty()) json_out = std::make_unique<OutputFile>(a.json);
  std::unique_ptr<OutputFile> html_out;
  if (!a.html.empty()) html_out = std::make_unique<OutputFile>(a.html);
  if (!a.write_plans.empty()) prepare_plan_dir(a.write_plans);

  CaptureReader reader(a.capture);
  const Plan captured = capture_plan(reader);
  std::vector<load::PlanSpec> specs;
  specs.push_back(
      {"captured", "the plan the capture was taken under (" + captured.path + ")", captured});
  std::set<std::string> names{"captured"};
  for (const std::string& path : a.plans) {
    Plan alt = read_alternative(path);
    check_same_features(alt, captured);
    std::string name = file_stem(path);
    while (!names.insert(name).second) name += "_";
    specs.push_back({name, "--plan " + path, std::move(alt)});
  }
  load::AlternativeRequest req;
  req.dist_types = a.alternatives == "dist-types";
  req.world_sizes = a.world_sizes;
  const size_t first_generated = specs.size();
  for (load::Alternative& g : load::generate_alternatives(captured, req)) {
    std::string name = g.name;
    while (!names.insert(name).second) name += "_";
    g.plan.source_text = plan_to_yaml(g.plan, name + ": " + g.origin);
    specs.push_back({name, g.origin, std::move(g.plan)});
  }

  load::LoadOptions opt;
  opt.link_gbps = a.link_gbps;
  opt.top_rows = a.top_rows;
  if (!a.max_memory.empty()) {
    opt.max_memory = parse_size(a.max_memory);
    if (opt.max_memory == 0)
      throw UsageError(
          fmt::format("--max-memory '{}': not a size (e.g. 2G, 512M, 1.5GiB)", a.max_memory));
  }
  ProgressLine progress("load", !a.quiet);
  const int passes = a.balance_rows ? 2 : 1;
  int pass = 1;
  auto on_progress = [&](const load::LoadProgress& p) {
    if (!progress.active()) return;
    progress.update(
        p.batches_total ? double(p.batches_done) / double(p.batches_total) : 1.0,
        fmt::format("{}{}/{} batches", passes > 1 ? fmt::format("pass {}/{}: ", pass, passes) : "",
                    p.batches_done, p.batches_total),
        p.bytes_done, 0, p.batches_done == p.batches_total);
  };
  // Pass 1: every plan, and the ids per row range for --balance-rows; pass 2: the balanced
  // plan alone.
  std::optional<load::RowHistogram> hist;
  if (a.balance_rows) hist.emplace(captured);
  std::function<void(const std::vector<const Kjt*>&)> observe;
  if (hist)
    observe = [&hist](const std::vector<const Kjt*>& kjts) {
      for (const Kjt* k : kjts) hist->add(*k);
    };
  load::LoadReport report =
      load::compute_load(reader, captured, std::move(specs), opt, observe, on_progress);
  if (hist) {
    load::Alternative b = load::balanced_rows_plan(captured, *hist);
    std::string name = b.name;
    while (!names.insert(name).second) name += "_";
    b.plan.source_text = plan_to_yaml(b.plan, name + ": " + b.origin);
    ++pass;
    load::LoadReport second = load::compute_load(
        reader, captured, {{name, b.origin, std::move(b.plan)}}, opt, {}, on_progress);
    report.plans.push_back(std::move(second.plans.front()));
  }
  progress.clear();

  // Every output complete in its temporary before any is renamed; renamed as one step. A
  // generated plan's text is what plan_to_yaml wrote for it (the JSON's plan_yaml too).
  std::vector<std::unique_ptr<OutputFile>> plan_files;
  for (size_t i = first_generated; i < report.plans.size() && !a.write_plans.empty(); ++i) {
    const load::PlanLoad& p = report.plans[i];
    plan_files.push_back(std::make_unique<OutputFile>(a.write_plans + "/" + p.name + ".yaml"));
    plan_files.back()->write(p.plan.source_text);
  }
  if (json_out) json_out->write(load::load_report_json(report, DYNEMB_VERSION));
  if (html_out) html_out->write(load::load_html(report));
  std::vector<OutputFile*> all{json_out.get(), html_out.get()};
  for (auto& f : plan_files) all.push_back(f.get());
  commit_outputs(all, 0);
  console::out(load::load_report_text(report));
  return 0;
}

}  // namespace

void setup_load(CLI::App& app, RunFn& run) {
  auto a = std::make_shared<LoadArgs>();
  auto* sub = app.add_subcommand(
      "load",
      "Per-rank load and traffic of a capture's real batches (KJTs only) under its plan and "
      "alternatives: ids and distinct rows each rank looks up, the bytes of the KJT all-to-all "
      "and of the output dist between every pair of ranks, imbalance (max/mean), the hottest "
      "rank and rows, and critical-path time estimates. Exit 0 done, 2 bad input.");
  sub->add_option("capture", a->capture, "Capture file (capture-format.md v1)")->required();
  sub->add_option("--plan", a->plans,
                  "An alternative plan (repeatable), named by its file stem; its features, dims "
                  "and module must be the capture's")
      ->allow_extra_args(false)
      ->take_all();
  sub->add_option("--alternatives", a->alternatives,
                  "Generate alternatives: 'dist-types' (every table under each dist_type)")
      ->check(CLI::IsMember({"dist-types"}));
  sub->add_option("--world-size", a->world_sizes,
                  "Generate the captured plan at these world sizes, e.g. 16,32,64 (the global "
                  "batch re-split over them)")
      ->delimiter(',');
  sub->add_flag("--balance-rows", a->balance_rows,
                "Generate uneven row splits that balance the observed ids (a second pass)");
  sub->add_option("--link-gbps", a->link_gbps,
                  "Link speed of every rank, Gbit/s per direction, for the critical-path "
                  "estimates")
      ->capture_default_str();
  sub->add_option("--top-rows", a->top_rows, "Hottest rows of the hottest rank to list")
      ->capture_default_str();
  sub->add_option("--json", a->json, "Write the whole report as JSON (docs/load-report.md)");
  sub->add_option("--html", a->html,
                  "Write a self-contained HTML page (no script, no network): per-rank bars of "
                  "every plan, imbalance per table, the hottest rank, the estimates and both "
                  "dists' traffic as heat maps");
  sub->add_option("--write-plans", a->write_plans,
                  "Write each generated alternative as DIR/NAME.yaml (made if missing)")
      ->type_name("DIR");
  sub->add_option("--max-memory", a->max_memory,
                  "Memory the run may use (e.g. 4G; default: the machine's usable memory or "
                  "DYNEMB_MEMORY_LIMIT): a batch that does not fit is refused before it is read, "
                  "and the next batch is read ahead only when two fit");
  sub->add_flag("--quiet,-q", a->quiet, "No progress line");
  sub->callback([&run, a] { run = [a] { return run_load(*a); }; });
}

}  // namespace dynemb::cli
