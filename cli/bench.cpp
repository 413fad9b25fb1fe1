// `dynemb-dist bench (CAPTURE.h5 | --preset NAME) [--backend auto|cuda|cpu] [--iters N]
//  [--json FILE] [--diagnostics]` and `bench CAPTURE.h5 --read-floor [--json FILE]` (docs/cli.md):
//  the options and the table; the stages, timers
// and checks are the bench library's (bench/).
#include <fmt/core.h>

#include <filesystem>
#include <memory>
#include <string>

#include "capture/capture.hpp"
#include "capture/read_floor.hpp"
#include "commands.hpp"
#include "common/console.hpp"
#include "common/error.hpp"
#include "common/output_file.hpp"
#include "common/safe_text.hpp"
#include "export.hpp"
#include "run.hpp"

namespace dynemb::cli {
namespace {

void print_table(const bench::Options& o, const bench::Workload& w, const bench::Result& r) {
  const Plan& p = w.plan;
  console::outf("# dynemb-dist bench: {} ({}, W={}, F={}, {} ids), backend {}, device {}\n",
                escape_field(w.name), to_string(p.module), p.world_size, p.num_features(),
                w.num_ids(), r.backend, r.device);
  if (r.copy_gbps > 0)
    console::outf("# copy bandwidth (D2D cudaMemcpy, bytes read + written): {:.1f} GB/s\n",
                  r.copy_gbps);
  console::outf(
      "# iters {} after warm-up; time = median; bytes = fewest bytes the stage must move\n",
      o.iters);
  if (r.backend == "cuda")
    console::outf(
        "# launch latency {} (--queue-ahead {})\n",
        r.launch_latency_excluded ? "excluded: stage queued behind a spin kernel" : "included",
        o.queue_ahead);
  const bool pct = r.copy_gbps > 0;  // no %copy column where no copy was measured
  console::outf("#{:>34} {:>12} {:>6} {:>12} {:>11} {:>9}{}\n", "stage", "rows", "dim", "bytes",
                "time(us)", "GB/s", pct ? fmt::format(" {:>7}", "%copy") : "");
  for (const bench::Stage& s : r.stages)
    console::outf(" {:>34} {:>12} {:>6} {:>12.0f} {:>11.2f} {:>9.1f}{}{}\n", s.name, s.rows, s.dim,
                  s.bytes, s.us, s.gbps(),
                  pct ? fmt::format(" {:>7.1f}", 100.0 * s.gbps() / r.copy_gbps) : "",
                  s.note.empty() ? "" : "  " + s.note);
  for (const std::string& n : r.checks) console::outf("# {}\n", escape_field(n));
  for (const std::string& n : r.diagnostics) console::outf("# {}\n", escape_field(n));
}

// `bench CAPTURE --read-floor [--json FILE]`: one line, and the same numbers as JSON.
int run_read_floor(const bench::Options& o) {
  bench::check_options(o);  // nothing but CAPTURE and --json
  bench::check_export_outputs(o);
  std::unique_ptr<OutputFile> json_out;
  if (!o.json.empty()) json_out = std::make_unique<OutputFile>(o.json);
  const ReadFloor f = read_floor(o.capture);
  const std::string inflate = inflate_library_name();
  const double gbps = f.seconds > 0 ? double(f.logical_bytes) / 1e9 / f.seconds : 0;
  console::outf(
      "read floor: {}: {} datasets, {:.2f} GB logical, {:.2f} GB stored, {:.3f} s, {:.2f} GB/s "
      "logical (inflate: {}, {} threads)\n",
      escape_field(o.capture), f.datasets, double(f.logical_bytes) / 1e9,
      double(f.stored_bytes) / 1e9, f.seconds, gbps, inflate, f.threads);
  if (json_out) {
    nlohmann::json j = bench::read_floor_json(o, f, inflate);
    escape_json_strings(j);  // the capture's path: valid UTF-8 whatever it holds
    json_out->write(j.dump(2) + "\n");
    commit_outputs({json_out.get()}, 0);
  }
  return 0;
}

int run_bench(const bench::Options& o) {
  if (o.read_floor) return run_read_floor(o);
  if (o.capture.empty() == o.preset.empty())
    throw UsageError("bench: give either a CAPTURE.h5 or --preset NAME");
  // Outputs are checked against the capture (any spelling) and --json's temporary is created
  // before any work, so a long bench never ends in "cannot write".
  // The outputs' clashes first, then what cannot run here (--export without CUDA): a directory
  // made for --export is removed again then, nothing left behind.
  std::error_code ec;
  const bool had_dir = !o.export_dir.empty() && std::filesystem::exists(o.export_dir, ec);
  bench::check_export_outputs(o);
  try {
    bench::check_options(o);
  } catch (const UsageError&) {
    if (!o.export_dir.empty() && !had_dir) std::filesystem::remove(o.export_dir, ec);
    throw;
  }
  std::unique_ptr<OutputFile> json_out;
  if (!o.json.empty()) json_out = std::make_unique<OutputFile>(o.json);
  const bench::Workload w = bench::load_workload(o);
  const bench::Result r = bench::run(o, w);
  print_table(o, w, r);
  if (json_out) {
    nlohmann::json j = bench::json_report(o, w, r);
    escape_json_strings(j);  // the workload's name and paths: valid UTF-8 whatever they hold
    json_out->write(j.dump(2) + "\n");
    commit_outputs({json_out.get()}, 0);
  }
  return 0;
}

}  // namespace

void setup_bench(CLI::App& app, RunFn& run) {
  auto o = std::make_shared<bench::Options>();
  auto* sub = app.add_subcommand(
      "bench", "Time each stage of the replay (device events) against the device copy bandwidth");
  sub->add_option("capture", o->capture, "Capture file (batch 0 is benched)");
  sub->add_option("--preset", o->preset, "Generate a preset's batch in memory instead");
  sub->add_option("--backend", o->backend,
                  "auto (default: cuda when a GPU is present, else cpu), cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  sub->add_option("--iters", o->iters, "Timed repeats per stage after warm-up (median)");
  sub->add_option("--queue-ahead", o->queue_ahead,
                  "CUDA: SM cycles a one-thread kernel spins before each timed repeat so the "
                  "stage is queued before the GPU reaches it (times exclude launch latency); "
                  "0 times launch latency too")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--bucketize-kernel", o->bucketize_path,
                  "CUDA: the bucketize path to time: auto (the fastest that fits the batch), "
                  "one-pass (a block per bag, cooperative launch), three-pass (counts, a scan, "
                  "placement, by a warp or a block per bag), partition (tiles of bags in two "
                  "kernels, large batches; auto takes one cooperative launch where every tile "
                  "is resident); a forced path the batch does not fit falls back as auto would")
      ->check(CLI::IsMember({"auto", "one-pass", "three-pass", "partition"}))
      ->capture_default_str();
  sub->add_option("--tile-ids", o->tile_ids,
                  "CUDA partition path: plan tiles of about this many ids (0: the automatic "
                  "choice); for tuning, the output is the same")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--json", o->json, "Write the results as JSON (schema_version 1.0.0)");
  sub->add_option("--scale", o->scale, "Multiply the preset's local batch size");
  sub->add_option("--seed", o->seed, "Workload seed for --preset");
  sub->add_option("--dims", o->dims,
                  "Sequence: also time the unbucketize gather at these fp32 row widths, e.g. "
                  "4,8,16,32,64,128 (same permutation)");
  sub->add_option("--export", o->export_dir,
                  "Write the index data as .npy files for bench/peer_torch.py (CUDA backend only)");
  sub->add_flag("--sweep", o->sweep,
                "CUDA, with --preset: time only the bucketize, at B = 512, 1024, ... 65536 per "
                "rank (the preset's plan and hotness), each row naming the path taken");
  sub->add_flag("--diagnostics", o->diagnostics,
                "CUDA: also print the bucketize path taken, its floors and the step trace "
                "of its cooperative kernels (bench/README.md)");
  sub->add_flag("--read-floor", o->read_floor,
                "Only read and inflate every dataset of CAPTURE (chunks on every core, no "
                "checks of what they hold) and print the time and logical GB/s: the least any "
                "replay of the file could take on this CPU; memory: one buffer the size of the "
                "largest dataset. Takes --json, no other option");
  sub->callback([&run, o, sub] {
    o->given.clear();
    for (const CLI::Option* opt : sub->get_options())
      if (opt->count() > 0) o->given.push_back(opt->get_name());
    run = [o] { return run_bench(*o); };
  });
}

}  // namespace dynemb::cli
