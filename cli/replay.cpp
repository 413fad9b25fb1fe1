// `dynemb-dist replay CAPTURE.h5 [...]` (cli.md): options, backend choice, the text report
// on stdout (progress on stderr), and the --json / --junit / --html files. The work is
// run_replay().
#include <fmt/core.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "annotations.hpp"
#include "commands.hpp"
#include "common/console.hpp"
#include "common/error.hpp"
#include "common/memory.hpp"
#include "common/output_file.hpp"
#include "common/test_hooks.hpp"
#include "common/trace.hpp"
#include "engine/backend.hpp"
#include "engine/tolerance.hpp"
#include "progress.hpp"
#include "registry.hpp"
#include "replay/replay.hpp"

namespace dynemb::cli {
namespace {

struct ReplayCliOptions {
  std::string capture;
  std::string plan;
  std::string backend = "auto";
  std::string devices;  // --devices 0,1,... (nccl only; "": every visible GPU)
  std::string ctx;      // "", "captured", "derived"
  std::string tolerance;
  int64_t max_mismatches = 10;
  std::string json, junit, html, write_output, batches;
  std::string annotations;  // "", "github", "none" ("": github under GITHUB_ACTIONS=true)
  bool quiet = false;
  bool fail_fast = false;
  bool force = false;
  std::string max_memory;
  int read_ahead = 1;
};

// GitHub annotations for the failing checks, the warnings and the trouble. A capture has no
// lines, so each annotation is on the capture file, with a title naming batch, rank and field.
// GitHub shows only the first few annotations of a step, so a broken capture (thousands of
// failing checks) gets kMaxAnnotations of them and one line counting the rest.
constexpr int64_t kMaxAnnotations = 50;

std::string replay_annotations(const Report& r) {
  const std::string& file = r.info.capture.path;
  std::string out;
  int64_t shown = 0, more = 0;
  for (const CheckResult& c : r.checks) {
    if (c.status != CheckStatus::fail && c.status != CheckStatus::error) continue;
    if (shown == kMaxAnnotations) {
      ++more;
      continue;
    }
    ++shown;
    std::string title = "dynemb-dist replay:";
    if (c.batch >= 0) title += fmt::format(" batch {}", c.batch);
    if (c.rank >= 0) title += fmt::format(" rank {}", c.rank);
    title += " " + c.stage + "." + c.check;
    std::string msg = c.message;
    if (!c.cause.empty()) msg += " (cause: " + c.cause + ")";
    out += gha_annotation("error", file, 0, 0, title, msg);
  }
  if (more > 0)
    out += gha_annotation("error", file, 0, 0, "dynemb-dist replay",
                          fmt::format("{} more failing checks; the text, --json or --junit "
                                      "report lists every one",
                                      more));
  for (const std::string& w : r.warnings)
    out += gha_annotation("warning", file, 0, 0, "dynemb-dist replay", w);
  if (!r.trouble.empty())
    out += gha_annotation("error", file, 0, 0, "dynemb-dist replay: trouble", r.trouble);
  return out;
}

// The command line as the process got it, for the JSON report (Linux: /proc/self/cmdline,
// NUL-separated). Empty when unavailable.
std::vector<std::string> process_argv() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string arg; std::getline(f, arg, '\0');) argv.push_back(arg);
  return argv;
}

// The replay's options from the command line's (the run's files aside).
ReplayOptions replay_options(const ReplayCliOptions& o) {
  ReplayOptions opt;
  opt.capture_path = o.capture;
  opt.plan_path = o.plan;
  opt.ctx_mode = o.ctx == "captured"  ? CtxMode::captured
                 : o.ctx == "derived" ? CtxMode::derived
                                      : CtxMode::automatic;
  if (!o.tolerance.empty()) opt.tolerance = parse_tolerance(o.tolerance);
  opt.max_mismatches = o.max_mismatches;
  opt.batches = o.batches;
  opt.write_output = o.write_output;
  opt.fail_fast = o.fail_fast;
  if (!o.max_memory.empty()) {
    opt.max_memory = parse_size(o.max_memory);
    if (opt.max_memory == 0)
      throw UsageError(
          fmt::format("--max-memory '{}': not a size (e.g. 2G, 512M, 1.5GiB)", o.max_memory));
  }
  opt.read_ahead = o.read_ahead;
  // Passes are listed only by the report files (the HTML grid shows them); the text report
  // counts them.
  opt.passes = !o.json.empty() || !o.junit.empty() || !o.html.empty() ? PassMode::compact
                                                                      : PassMode::counted;
  return opt;
}

// The files named by --json, --junit, --html and --write-output.
std::vector<NamedPath> report_paths(const ReplayCliOptions& o) {
  std::vector<NamedPath> outputs;
  if (!o.json.empty()) outputs.push_back({"--json", o.json});
  if (!o.junit.empty()) outputs.push_back({"--junit", o.junit});
  if (!o.html.empty()) outputs.push_back({"--html", o.html});
  if (!o.write_output.empty()) outputs.push_back({"--write-output", o.write_output});
  return outputs;
}

// Under a launcher: --backend nccl spans the processes (one communicator over every process's
// GPUs), so the processes replay in lockstep (ReplayOptions::team_split); so does any backend
// under the test hook DYNEMB_TEAM_SPLIT=lockstep.
TeamSplit team_split(const ReplayCliOptions& o, const ReplayTeam* team) {
  if (!team || team->size() <= 1) return TeamSplit::automatic;
  if (backend_spans_processes(o.backend)) return TeamSplit::collective;
  return test_hooks::team_split_lockstep() ? TeamSplit::lockstep : TeamSplit::automatic;
}

// The backend of a process under a launcher. One that spans the processes is made collectively;
// trouble making it may be this process's alone while its peers wait in the bootstrap, so it
// ends the job (exit 2, the reason on stderr).
BackendStartup start_team_backend(const ReplayCliOptions& o, ReplayTeam& team) {
  if (!backend_spans_processes(o.backend)) return start_backend(o.backend, o.devices);
  BackendProcesses p;
  p.index = team.index();
  p.size = team.size();
  p.broadcast = [&team](std::string& bytes) { team.broadcast(bytes); };
  try {
    return start_backend(o.backend, o.devices, p);
  } catch (const std::exception& e) {
    team.abort(fmt::format("--backend {} across the processes: {}", o.backend, e.what()));
    throw;  // not reached: abort ends the process
  }
}

// A worker of a replay under a launcher (replay/team.hpp): it replays its share of the batches
// (or of each batch's destination ranks) and sends what it found to process 0, which writes the one
// report (and --write-output: the worker's option only sizes its replay as process 0's); it writes
// nothing itself.
int run_replay_worker(const ReplayCliOptions& o, std::shared_ptr<ReplayTeam> team) {
  ReplayOptions opt = replay_options(o);
  opt.team = team;
  opt.team_split = team_split(o, team.get());
  BackendStartup backend = start_team_backend(o, *team);
  run_replay(opt, backend, {});
  return 0;
}

int run_replay_cli(const ReplayCliOptions& o) {
  // Under mpirun or srun with others: joined before any output exists (a process forks its
  // supervisor here, replay/team.hpp).
  std::shared_ptr<ReplayTeam> team = join_launched_team();
  if (team && team->index() > 0) return run_replay_worker(o, std::move(team));
  ReplayOptions opt = replay_options(o);
  opt.team = team;
  opt.team_split = team_split(o, team.get());
  opt.argv = process_argv();
  // A backend spanning the processes is made first, collectively, before any output exists (a
  // failure ends the job, which would leave the outputs' temporaries behind).
  std::optional<BackendStartup> spanning;
  if (team && opt.team_split == TeamSplit::collective)
    spanning.emplace(start_team_backend(o, *team));
  // Before any work: no output is an input or another output (by device and inode, whatever
  // the spelling), and every output's temporary exists, so a long run never ends in "cannot
  // write the report".
  std::vector<NamedPath> inputs{{"capture", o.capture}};
  if (!o.plan.empty()) inputs.push_back({"--plan", o.plan});
  std::vector<NamedPath> outputs = report_paths(o);
  const char* trace_env = std::getenv("DYNEMB_TRACE");  // the timeline (common/trace.hpp)
  const std::string trace_path = trace_env ? trace_env : "";
  if (!trace_path.empty()) outputs.push_back({"DYNEMB_TRACE", trace_path});
  check_output_clashes(inputs, outputs);
  // Reports are replaced run after run; a read-only one is kept unless --force.
  const Existing existing = o.force ? Existing::replace : Existing::replace_writable;
  if (!trace_path.empty()) start_trace(std::make_unique<OutputFile>(trace_path, existing));
  std::unique_ptr<OutputFile> json_out, junit_out, html_out;
  if (!o.json.empty()) json_out = std::make_unique<OutputFile>(o.json, existing);
  if (!o.junit.empty()) junit_out = std::make_unique<OutputFile>(o.junit, existing);
  if (!o.html.empty()) html_out = std::make_unique<OutputFile>(o.html, existing);
  if (!o.write_output.empty())
    opt.write_output_file = std::make_shared<OutputFile>(o.write_output, existing);
  // A GPU backend starts while the capture is opened and its first batch read.
  BackendStartup backend = spanning ? std::move(*spanning) : start_backend(o.backend, o.devices);

  const char* no_color = std::getenv("NO_COLOR");
  // Under a launcher, stdout is its pipe or pseudo-terminal, whatever the user's is: no colour.
  const bool colour = !team && ::isatty(STDOUT_FILENO) && !(no_color && *no_color);
  ProgressLine progress("replay", !o.quiet);

  ReplayCallbacks cb;
  cb.on_start = [&](const Report& r) {
    progress.clear();  // the header may come after the first batch began (the capture's hash)
    console::out(text_header(r));
    console::flush();
  };
  cb.on_check = [&](const CheckResult& c) {
    if (o.quiet || c.status == CheckStatus::pass || c.status == CheckStatus::skipped) return;
    progress.clear();
    console::out_coloured(text_check_line(c, colour));
    console::flush();
  };
  if (progress.active()) {
    cb.on_progress = [&](const ReplayProgress& p) {
      const double f = p.rank_batches_total > 0
                           ? double(p.rank_batches_done) / double(p.rank_batches_total)
                           : 0.0;
      progress.update(f,
                      fmt::format("{}/{} batches, {}/{} rank-batches", p.batches_done,
                                  p.batches_total, p.rank_batches_done, p.rank_batches_total),
                      p.bytes_done, p.bytes_total, p.batches_done == p.batches_total);
    };
  }

  Report report = run_replay(opt, backend, cb);
  progress.clear();
  // The files first, so that a failure to write them (a full disk) is in the text summary and
  // the exit status; all are complete in their temporaries before any is renamed, and they are
  // renamed as one step (a signal meanwhile waits; after it the run is complete).
  const auto add_trouble = [&report](const std::string& msg) {
    report.trouble = report.trouble.empty() ? msg : report.trouble + "; " + msg;
  };
  std::unique_ptr<OutputFile> trace_out;
  try {
    trace_out = write_trace();
  } catch (const Error& e) {
    add_trouble(fmt::format("cannot write the trace: {}", e.what()));
  }
  try {
    if (json_out) write_json_report(report, [&](const std::string& s) { json_out->write(s); });
    if (junit_out) write_junit_report(report, [&](const std::string& s) { junit_out->write(s); });
    if (html_out) html_out->write(html_report(report));
    commit_outputs({json_out.get(), junit_out.get(), html_out.get(), opt.write_output_file.get(),
                    trace_out.get()},
                   report.summary().exit_code);
  } catch (const Error& e) {
    add_trouble(fmt::format("cannot write the report: {}", e.what()));
  } catch (const std::bad_alloc&) {
    add_trouble("cannot write the report: " + out_of_memory_text());
  }
  console::out_coloured(text_summary(report, colour));
  if (annotations_enabled(o.annotations)) console::out_annotations(replay_annotations(report));
  console::flush();
  if (!report.trouble.empty()) console::error_line(report.trouble);
  // Trouble recorded for a batch or a rank (the run went on): each on stderr, one line.
  constexpr int64_t kMaxTroubleLines = 20;
  int64_t shown = 0, more = 0;
  for (const CheckResult& c : report.checks) {
    if (c.status != CheckStatus::error) continue;
    if (shown == kMaxTroubleLines) {
      ++more;
      continue;
    }
    ++shown;
    console::error_line(c.message);
  }
  if (more > 0)
    console::error_line(fmt::format("... and {} more; the report lists every one", more));
  return report.summary().exit_code;
}

}  // namespace

void setup_replay(CLI::App& app, RunFn& run) {
  auto o = std::make_shared<ReplayCliOptions>();
  auto* sub = app.add_subcommand(
      "replay",
      "Replay a capture: derive the input dist and sharding context from the plan and each "
      "rank's KJT, diff them with the captured ctx/, run the output dist (built once and "
      "latched across batches, like TorchRec's module) and diff its result with the golden "
      "output and the unsharded reference. Exit 0 all checks pass, 1 mismatches found (the "
      "report is complete), 2 trouble.");
  sub->add_option("CAPTURE", o->capture, "Capture file (capture-format.md v1)")->required();
  sub->add_option("--plan", o->plan,
                  "Plan YAML to use instead of the plan embedded in the capture");
  sub->add_option("--backend", o->backend,
                  "Backend: auto (cpu in this version), cpu, cuda, nccl (when compiled in)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda", "nccl"}));
  sub->add_option("--devices", o->devices,
                  "With --backend nccl: CUDA devices to use, e.g. 0,1,2,3 (default: every "
                  "visible GPU). W ranks run on the first G of them, G the largest divisor of "
                  "W not above their number");
  sub->add_option("--ctx", o->ctx,
                  "Context fed to the output dist: 'captured' (default when the capture has "
                  "ctx/: the captured fields and local_embs, as the real run did; fields not "
                  "captured are derived) or 'derived' (from the plan and the KJTs, and the "
                  "lookup from /oracle or /tables)")
      ->check(CLI::IsMember({"captured", "derived"}));
  sub->add_option("--tolerance", o->tolerance,
                  std::string("Output comparison: exact | ulp:N (float32 units in the last "
                              "place) | rtol:X,atol:Y (|got-want| <= atol + rtol*|want|). NaN "
                              "equals only NaN at the same place. ") +
                      default_tolerance_help());
  sub->add_option("--max-mismatches", o->max_mismatches,
                  "Differences listed per check, with coordinates (all are counted)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--json", o->json, "Write a JSON report (docs/report-schema.md, schema 1.1.0)");
  sub->add_option("--junit", o->junit, "Write a JUnit XML report: one testcase per check");
  sub->add_option("--html", o->html,
                  "Write a self-contained HTML report (no script, no network): the verdict, a "
                  "rank x batch grid of verdicts with each failing cell's first mismatch, "
                  "mismatches per feature, and --plan's differences");
  sub->add_option("--write-output", o->write_output,
                  "Write a copy of the capture whose output datasets hold this replay's "
                  "results (the bless step for goldens); never the input file");
  sub->add_option("--batches", o->batches, "Batches to replay, e.g. 0-3,7 (default: all)");
  sub->add_option("--annotations", o->annotations,
                  "CI annotations on stdout: 'github' (::error file=CAPTURE,title=batch/rank/"
                  "field::message per failing check) or 'none'; default github when "
                  "GITHUB_ACTIONS=true, else none")
      ->check(CLI::IsMember({"github", "none"}))
      ->type_name("github|none");
  sub->add_flag("--force", o->force,
                "Replace --json, --junit, --html and --write-output files even when they are "
                "read-only (writable ones are replaced without it)");
  sub->add_flag("--fail-fast", o->fail_fast,
                "Stop at the first trouble (an unreadable dataset, a bounds error, out of "
                "memory) instead of reporting it for its batch and rank and going on");
  sub->add_option("--max-memory", o->max_memory,
                  "Memory the replay may plan for, e.g. 4G (default: the machine's, or its "
                  "cgroup's limit), shared evenly by the processes an mpirun starts on this "
                  "host: a batch that cannot fit is refused before any work, and batches are "
                  "read ahead only while two fit in three quarters of it")
      ->type_name("SIZE");
  sub->add_option("--read-ahead", o->read_ahead,
                  "Batches read and decompressed on another thread while one is replayed: 1 "
                  "(default) or 0 (read, then replay, in turn)")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
  sub->add_flag("--quiet,-q", o->quiet,
                "No progress and no per-check lines; header and summary "
                "only");
  sub->callback([&run, o] { run = [o] { return run_replay_cli(*o); }; });
}

}  // namespace dynemb::cli
