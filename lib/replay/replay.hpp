// `dynemb-dist replay` (docs/cli.md): for every batch and rank, derive the input dist and the
// context from the plan and the KJTs, diff it with the captured ctx/, run the output dist
// (built once and latched across batches, like the real module) on the chosen backend, and
// diff the result with the golden `output` and the unsharded reference.
//
// Streaming: one batch is in memory at a time; each rank's output is compared as the output
// dist hands it over and dropped (unless --write-output keeps the batch's outputs). A batch
// whose lookups are derived runs over slices of the embedding columns (column_slice.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/output_file.hpp"
#include "engine/backend.hpp"
#include "engine/tolerance.hpp"
#include "replay/report.hpp"
#include "replay/team.hpp"

namespace dynemb {

enum class CtxMode : uint8_t { automatic, captured, derived };

enum class PassMode : uint8_t { whole, compact, counted };

// How the processes of a team (team.hpp) share a replay.
//   automatic  by batches, or by destination rank blocks (team.hpp).
//   lockstep   every process visits every selected batch, reads it whole, derives its input dist
//              and chooses its contexts as one process does, runs the whole output dist, and
//              records only the checks of its block of ranks [q W / P, (q + 1) W / P) (the
//              batch-level ones: process 0); process 0 merges them per batch in the one-process
//              order. --backend nccl under a launcher takes it: the dist is then one collective
//              over the processes, and the backend hands each process only its ranks' outputs.
//   collective lockstep, on such a backend: a process whose dist throws anything but an
//              OutputDistFailure or a UsageError (which every process throws alike, before any
//              collective) ends the run (ReplayTeam::abort), since its peers wait in the
//              collective.
enum class TeamSplit : uint8_t { automatic, lockstep, collective };

struct ReplayOptions {
  std::string capture_path;
  std::string plan_path;  // empty: the plan embedded in the capture
  CtxMode ctx_mode = CtxMode::automatic;
  std::optional<Tolerance> tolerance;  // nullopt: default_tolerance(plan)
  int64_t max_mismatches = 10;         // details kept per check
  std::string batches;                 // --batches RANGE, empty: all
  std::string write_output;            // --write-output OUT.h5, empty: none
  // --write-output's file when the caller created it up front (common/output_file.hpp): the
  // replay leaves it complete but uncommitted, for the caller to commit with its other
  // outputs (or discarded, when trouble kept it from being complete); null: made from
  // `write_output` when the run starts, and committed by the replay.
  std::shared_ptr<OutputFile> write_output_file;
  // Stop at the first trouble (the run's trouble, exit 2) instead of recording it as an error
  // check of its batch (or rank) and going on with the others.
  bool fail_fast = false;
  // --max-memory: the memory the replay may plan for, bytes (0: what the machine or its cgroup
  // allows, common/memory.hpp). It sizes the column slices of a batch whose lookups are
  // derived; a batch that cannot fit (sliced: not even one column) is refused up front; batches
  // are read ahead only while two fit in three quarters of it.
  uint64_t max_memory = 0;
  // --read-ahead: batches read (and inflated) on another thread while one is replayed, 0 or 1.
  int read_ahead = 1;
  std::vector<std::string> argv;
  // Where the checks that passed go: Report::checks (whole), Report::pass_log (compact: 72
  // bytes each, for a report file that lists every check), or only Report::pass_counts
  // (counted: the replay's memory then does not grow with the batches).
  PassMode passes = PassMode::whole;
  // Under a launcher (team.hpp): this process replays its share of the batches (or of each
  // batch's destination ranks); process 0's
  // report holds every process's findings, a worker's holds nothing to show. Null: one process.
  std::shared_ptr<ReplayTeam> team;
  TeamSplit team_split = TeamSplit::automatic;
};

// Where a replay stands, after each rank-batch: rank-batches and the capture's logical bytes
// (uncompressed, every dataset of the batches replayed) done and in all.
struct ReplayProgress {
  int64_t rank_batches_done = 0, rank_batches_total = 0;
  int64_t batches_done = 0, batches_total = 0;
  double bytes_done = 0, bytes_total = 0;
};

struct ReplayCallbacks {
  std::function<void(const Report&)> on_start;             // header info known
  std::function<void(const CheckResult&)> on_check;        // every check, as it is decided
  std::function<void(const ReplayProgress&)> on_progress;  // after each rank-batch
};

// "0-3,7" -> {0,1,2,3,7}: sorted, unique, each < num_batches. Empty text: all batches.
// Throws UsageError naming the bad part.
std::vector<int64_t> parse_batch_range(const std::string& text, int64_t num_batches);

// Runs the replay. Trouble (unreadable capture, bad plan, malformed KJT, a lookup bounds
// error, bad --batches, --write-output onto the input or unwritable) never throws: it stops
// the run and the report comes back with `trouble` set (exit code 2) and the checks decided
// so far, so --json / --junit still describe what happened.
Report run_replay(const ReplayOptions& opt, BackendStartup& backend,
                  const ReplayCallbacks& cb = {});
// The same on a backend made already.
Report run_replay(const ReplayOptions& opt, Backend& backend, const ReplayCallbacks& cb = {});

}  // namespace dynemb
