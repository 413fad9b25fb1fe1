// Top-level command line: subcommand registration, --version, and the mapping of errors to
// exit codes (cli.md: 0 pass, 1 mismatches found, 2 trouble; CLI11's own codes never escape).
#include <fmt/core.h>

#include <cstdio>
#include <exception>
#include <new>

#include "commands.hpp"
#include "common/error.hpp"

namespace dynemb::cli {

const char* compiled_backends() {
#if defined(DYNEMB_HAVE_NCCL)
  return "cpu, cuda, nccl";
#elif defined(DYNEMB_HAVE_CUDA)
  return "cpu, cuda";
#else
  return "cpu";
#endif
}

namespace {

constexpr const char* kShortUsage =
    "dynemb-dist: offline validation and replay of row-wise sharded embedding output dists\n"
    "\n"
    "Start here:\n"
    "  dynemb-dist validate PLAN.yaml              check a sharding plan\n"
    "  dynemb-dist synth --preset unit-seq-w2 -o c.h5 --store ctx,local_embs,output\n"
    "                                              make a capture to play with\n"
    "  dynemb-dist replay CAPTURE.h5               replay a capture, diff context and output\n"
    "\n"
    "Run 'dynemb-dist --help' for every subcommand, 'man dynemb-dist' for the manual.\n";

}  // namespace

int main_entry(int argc, char** argv) {
  CLI::App app{"dynemb-dist: offline validation and replay of row-wise (RW) sharded embedding "
               "output dists (TorchRec / DynamicEmb).\n"
               "Exit status: 0 all checks passed, 1 mismatches found, 2 trouble (bad input, "
               "usage error, device failure).",
               "dynemb-dist"};
  app.set_version_flag("--version",
                       fmt::format("dynemb-dist {} (backends: {})", DYNEMB_VERSION,
                                   compiled_backends()),
                       "Print the version and the backends of this build, then exit");
  app.require_subcommand(0, 1);
  app.fallthrough(false);

  RunFn run;
  setup_validate(app, run);
  setup_synth(app, run);
  setup_inspect(app, run);
  setup_replay(app, run);
  setup_bench(app, run);
  setup_merge(app, run);

  if (argc <= 1) {
    std::fputs(kShortUsage, stdout);
    return 0;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    app.exit(e);
    return 0;
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message and the usage hint
    return 2;
  }
  if (!run) {
    std::fputs(kShortUsage, stdout);
    return 0;
  }
  try {
    return run();
  } catch (const PlanError& e) {  // already "file:line:col: error: ..."
    std::fflush(stdout);
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "dynemb-dist: error: {}\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    fmt::print(stderr, "dynemb-dist: error: out of memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "dynemb-dist: internal error: {}\n", e.what());
    return 2;
  }
}

}  // namespace dynemb::cli
