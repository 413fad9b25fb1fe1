// Top-level command line: subcommand registration, --version, and the mapping of errors to
// exit codes (cli.md: 0 pass, 1 mismatches found, 2 trouble; CLI11's own codes never escape).
#include <fmt/core.h>
#include <fmt/format.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "capture/capture.hpp"
#include "commands.hpp"
#include "common/console.hpp"
#include "common/env.hpp"
#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/memory.hpp"
#include "common/output_file.hpp"
#include "common/safe_text.hpp"
#include "common/signals.hpp"
#include "registry.hpp"

namespace dynemb::cli {

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

// Edit distance, for "did you mean" on a mistyped command.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// A first argument that is neither an option nor a command: name the commands (and the
// closest one) instead of CLI11's "The following argument was not expected".
bool unknown_command(const CLI::App& app, const std::string& arg) {
  if (arg.empty() || arg[0] == '-') return false;
  std::vector<std::string> names;
  std::string best;
  size_t best_d = 3;  // suggest only within 2 edits
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (sub->get_name() == arg) return false;
    names.push_back(sub->get_name());
    const size_t d = edit_distance(arg, sub->get_name());
    if (d < best_d) best_d = d, best = sub->get_name();
  }
  console::message_line(fmt::format("dynemb-dist: unknown command '{}'{} (commands: {})", arg,
                                    best.empty() ? "" : fmt::format("; did you mean '{}'?", best),
                                    fmt::join(names, ", ")));
  console::err("Run 'dynemb-dist' for where to start, 'dynemb-dist --help' for all.\n");
  return true;
}

// The subcommand a command line names (the first argument that is one), or nullptr.
const CLI::App* named_subcommand(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    for (const CLI::App* sub : app.get_subcommands({}))
      if (sub->get_name() == argv[i]) return sub;
  return nullptr;
}

// A damaged capture can make libhdf5 loop forever while the file's metadata is read, and a
// FIFO without a writer blocks the open (docs/robustness.md): report it and exit 2 rather than
// hang a CI job.
// DYNEMB_OPEN_TIMEOUT=SECONDS (default 60; 0 turns the watchdog off).
// libhdf5 1.10 crashes (SIGSEGV) on some damaged files in metadata it does not check, e.g. a
// damaged group B-tree read into its metadata accumulator (tests/fuzz/libhdf5/accum-read-segv.h5;
// docs/robustness.md). While a capture is open, such a signal becomes exit 2 with a message
// naming the file instead of a bare "Segmentation fault". Only async-signal-safe calls here.
// Not installed under ASan, whose own handler reports the crash with its stack.
#if defined(__SANITIZE_ADDRESS__)
#define DYNEMB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DYNEMB_ASAN 1
#endif
#endif
char g_crash_note[2048];  // set_crash_note; read by the handler
std::atomic<bool> g_crash_note_set{false};

#ifndef DYNEMB_ASAN
void on_crash_signal(int sig) {
  remove_registered_temps();  // whatever follows, no partial output is left behind
  const char* file = capture_being_read();
  const auto put = [](const char* s) {
    size_t n = 0;
    while (s[n]) ++n;
    while (n > 0) {
      const ssize_t w = write(STDERR_FILENO, s, n);
      if (w <= 0) return;
      s += w;
      n -= static_cast<size_t>(w);
    }
  };
  if (g_crash_note_set.load()) {
    put("dynemb-dist: error: ");
    put(g_crash_note);
    put(sig == SIGBUS ? ": libhdf5 crashed (SIGBUS)" : ": libhdf5 crashed (SIGSEGV)");
    put(" after a write failed (libhdf5 1.10 does so when a write fails inside H5Ocopy, e.g. on "
        "a full disk); the temporary file was removed, nothing was written\n");
    _exit(2);
  }
  if (file[0] == '\0') {  // not reading a capture: the default action (core dump, exit 128+sig)
    std::signal(sig, SIG_DFL);
    return;  // the faulting instruction runs again, now under SIG_DFL
  }
  put("dynemb-dist: error: ");
  put(file);
  put(sig == SIGBUS ? ": crashed (SIGBUS)" : ": crashed (SIGSEGV)");
  put(" while reading this capture; libhdf5 1.10 crashes on some damaged files instead of "
      "reporting them (see docs/robustness.md). If the file is intact, this is a bug in "
      "dynemb-dist: please report it.\n");
  _exit(2);
}
#endif

void install_crash_handler() {
#ifndef DYNEMB_ASAN
  // An alternate stack, so that a crash from a stack overflow can still be reported.
  static std::vector<char> alt(static_cast<size_t>(64) * 1024);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_crash_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_ONSTACK;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
#endif
}

void arm_open_watchdog() {
  const double secs = open_timeout_seconds();
  set_capture_open_watchdog(secs, [secs](const std::string& path) {
    console::error_line(
        fmt::format("{}: opening the capture did not finish in {:g} s (libhdf5 1.10 can loop on "
                    "a damaged file; a pipe or a network file system can block). "
                    "DYNEMB_OPEN_TIMEOUT sets the limit.",
                    path, secs));
    std::fflush(stderr);
    std::_Exit(2);
  });
}

// An option given an empty value (`--json ""`, `-o ""`, `--plan ""`) would silently mean its
// default (no report, the embedded plan): refused as a usage error naming the option. Flags
// take no value and are not judged.
const CLI::Option* option_with_empty_value(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands())
    for (const CLI::Option* opt : sub->get_options()) {
      if (opt->count() == 0 || opt->get_type_size() == 0) continue;
      for (const std::string& v : opt->results())
        if (v.empty()) return opt;
    }
  return nullptr;
}

}  // namespace

void set_crash_note(const std::string& raw_note) {
  // Escaped now: the crash handler writes it as it is (a signal handler can escape nothing).
  const std::string note = escape_field(raw_note);
  g_crash_note_set.store(false);
  const size_t n = std::min(note.size(), sizeof(g_crash_note) - 1);
  std::copy(note.begin(), note.begin() + static_cast<std::ptrdiff_t>(n), g_crash_note);
  g_crash_note[n] = '\0';
  g_crash_note_set.store(n > 0);
}

namespace {

int run_command_line(int argc, char** argv) {
  // libhdf5 closes its open files again at exit (atexit); a file whose close already failed
  // (its last write on a full disk) then crashes it (SIGSEGV in H5F__close_cb). Every handle
  // is closed by its owner (RAII) and every close that matters is checked, so nothing is left
  // for that pass to do: it is not registered (capture.hpp).
  prepare_hdf5_library();
  CLI::App app{
      "dynemb-dist: offline validation and replay of row-wise (RW) sharded embedding "
      "output dists (TorchRec / DynamicEmb).\n"
      "Exit status: 0 all checks passed, 1 mismatches found, 2 trouble (bad input, "
      "usage error, device failure).",
      "dynemb-dist"};
  app.set_version_flag(
      "--version",
      fmt::format("dynemb-dist {} (backends: {}; inflate: {})", DYNEMB_VERSION, compiled_backends(),
                  inflate_library_name()),
      "Print the version, the backends and the inflate library of this build, then exit");
  app.require_subcommand(0, 1);
  app.fallthrough(false);

  RunFn run;
  setup_validate(app, run);
  setup_synth(app, run);
  setup_inspect(app, run);
  setup_replay(app, run);
  setup_bench(app, run);
  setup_merge(app, run);
  setup_load(app, run);

  if (argc <= 1) {
    console::out(kShortUsage);
    return 0;
  }
  if (unknown_command(app, argv[1])) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    app.exit(e);
    return 0;
  } catch (const CLI::ParseError& e) {
    // CLI11's message, then where the options of this command are (not a bare "--help").
    const CLI::App* sub = named_subcommand(app, argc, argv);
    const std::string who = sub ? "dynemb-dist " + sub->get_name() : "dynemb-dist";
    console::message_line(fmt::format("{}: error: {}", who, e.what()));
    console::errf("Run '{} --help' for its options{}.\n", who,
                  sub ? ", 'man dynemb-dist' for examples" : "");
    return 2;
  }
  if (const CLI::Option* opt = option_with_empty_value(app)) {
    const CLI::App* sub = named_subcommand(app, argc, argv);
    const std::string who = sub ? "dynemb-dist " + sub->get_name() : "dynemb-dist";
    console::message_line(
        fmt::format("{}: error: {}: the value is empty; give one, or leave the option out", who,
                    opt->get_name(true, true)));
    console::errf("Run '{} --help' for its options.\n", who);
    return 2;
  }
  if (!run) {
    console::out(kShortUsage);
    return 0;
  }
  try {  // a DYNEMB_* variable whose value means nothing: exit 2 before any work
    env::check_all();
  } catch (const UsageError& e) {
    console::error_line(e.what());
    return 2;
  }
  arm_open_watchdog();
  install_crash_handler();
  try {
    return run();
  } catch (const PlanError& e) {  // already "file:line:col: error: ..."
    console::message_line(e.what());
    return 2;
  } catch (const Error& e) {
    console::error_line(e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    console::error_line(out_of_memory_text());
    return 2;
  } catch (const std::exception& e) {
    console::message_line(std::string("dynemb-dist: internal error: ") + e.what());
    return 2;
  }
}

}  // namespace

int main_entry(int argc, char** argv) {
  // First: no output exists yet, and from here on any ending signal removes what is made;
  // SIGPIPE ignored, so that a closed stdout is a write error (common/signals.hpp).
  install_exit_signal_handlers();
  console::init();
  // Every path ends here: a report that did not reach stdout is exit 2, whatever the run found.
  return console::finish(run_command_line(argc, argv));
}

}  // namespace dynemb::cli
