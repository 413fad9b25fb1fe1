// One file per subcommand (CLI11's subcom_in_files pattern): each `setup_<name>` adds its
// subcommand and options to the app and, when that subcommand is parsed, stores the code to
// run in `run`. Dispatch happens in main.cpp after parsing, where dynemb::Error becomes
// exit status 2.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace dynemb::cli {

using RunFn = std::function<int()>;

void setup_validate(CLI::App& app, RunFn& run);
void setup_synth(CLI::App& app, RunFn& run);
void setup_inspect(CLI::App& app, RunFn& run);
void setup_replay(CLI::App& app, RunFn& run);
void setup_bench(CLI::App& app, RunFn& run);
void setup_merge(CLI::App& app, RunFn& run);
void setup_load(CLI::App& app, RunFn& run);

// What the process is doing inside libhdf5 that libhdf5 1.10 may crash on (a write that fails
// inside H5Ocopy); "" clears it. While set, the crash handler removes the temporaries, prints
// "dynemb-dist: error: NOTE: ..." and exits 2 (app.cpp; not under ASan).
void set_crash_note(const std::string& note);

// Runs the whole command line; returns the process exit status (0, 1 or 2).
int main_entry(int argc, char** argv);

}  // namespace dynemb::cli
