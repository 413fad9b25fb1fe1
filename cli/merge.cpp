// `dynemb-dist merge rank*.h5 -o capture.h5`: assembles one capture from the per-rank files
// that the dynemb_capture package (python/) writes in a live job (capture/merge.hpp).
#include <fmt/core.h>

#include <memory>
#include <string>

#include "capture/merge.hpp"
#include "commands.hpp"
#include "common/console.hpp"
#include "common/safe_text.hpp"

namespace dynemb::cli {

namespace {

int run_merge(const MergeOptions& opt) {
  const MergeResult r = merge_captures(opt, set_crash_note);
  console::outf("merged {} rank files ({} batches, world_size {}) into {}\n", r.files,
                r.num_batches, r.world_size, escape_field(opt.output));
  return 0;
}

}  // namespace

void setup_merge(CLI::App& app, RunFn& run) {
  auto opt = std::make_shared<MergeOptions>();
  auto* sub = app.add_subcommand(
      "merge",
      "Assemble one capture from per-rank files (the dynemb_capture Python package): checks that "
      "the "
      "ranks agree on plan, world size and batches and that every rank 0..W-1 appears once");
  sub->add_option("inputs", opt->inputs, "Per-rank capture files (root attribute `rank`)")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("-o,--output", opt->output, "Merged capture file to write")->required();
  sub->add_flag("--force", opt->force, "Replace OUT if it exists");
  sub->callback([opt, &run] { run = [opt] { return run_merge(*opt); }; });
}

}  // namespace dynemb::cli
