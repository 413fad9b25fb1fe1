// The processes of one replay under a launcher (mpirun, srun --mpi=pmix; docs/multi-node.md).
// Two splits, chosen once per run:
//   batches     process q of P replays a contiguous block of the selected batches (process 0 the
//               first) and sends its findings to process 0, which merges them in batch order.
//   rank blocks when the batches run one destination at a time (unit_planner.hpp) and there are
//               fewer selected batches than processes, every process visits every selected
//               batch and runs the destinations of its block of ranks;
//               after each batch the processes exchange what they decided, and process 0
//               records it in the order one process decides it.
// Either way the report is exactly the one-process report. Only mpi_team.cpp speaks MPI; the
// replay sees this interface.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "replay/diff.hpp"
#include "replay/report.hpp"

namespace dynemb {

class ReplayTeam {
 public:
  virtual ~ReplayTeam() = default;
  virtual int index() const = 0;  // this process, 0 .. size() - 1
  virtual int size() const = 0;
  // The processes of the team on this process's host, this one included (1 .. size()): they
  // share its memory and its GPUs, so each plans for its share of them.
  virtual int host_size() const = 0;
  // A worker (index > 0) to process 0: a rank-batch of batch k checked (whole_batch: the rest of
  // batch k counts as done). Small and unacknowledged.
  virtual void send_progress(int64_t k, bool whole_batch) = 0;
  // Process 0: the progress messages arrived so far, each handed to `fn`; never waits.
  using ProgressFn = std::function<void(int64_t k, bool whole_batch)>;
  virtual void poll_progress(const ProgressFn& fn) = 0;
  // A worker to process 0, once: its findings (encode_findings).
  virtual void send_result(const std::string& bytes) = 0;
  // Process 0: worker q's findings, handing progress to `fn` while it waits.
  virtual std::string receive_result(int q, const ProgressFn& fn) = 0;
  // The state one batch leaves to the next (the pooled module's latch), passed from process q to
  // q + 1: each sends once and receives once (process 0 receives nothing, the last sends nothing).
  virtual void send_carry(const std::string& bytes) = 0;
  virtual std::string receive_carry() = 0;
  // Every process's `bytes`, in process order, to every process (a rank split's exchange; each
  // process calls it at the same points). Process 0 hands progress to `fn` while it waits.
  virtual std::vector<std::string> allgather(const std::string& bytes, const ProgressFn& fn) = 0;
  // Process 0's `bytes` to every process; every process passes a string of the same length (a
  // backend spanning the processes bootstraps through it: NcclProcessGroup::broadcast).
  virtual void broadcast(std::string& bytes) = 0;
  // The processes are out of step (a bug, or a failure that only some of them met): the run ends
  // at once with exit 2 and `why` on stderr, never a hang.
  [[noreturn]] virtual void abort(const std::string& why) = 0;
};

// The team this process belongs to when a launcher started it with more than one process (its
// environment says so: OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_SIZE); null otherwise, and always in
// a build without MPI. Forks first (see supervise_launched_process) and joins MPI in the child.
std::shared_ptr<ReplayTeam> join_launched_team();

// Whether a launcher started this process with others (from the environment alone), and its
// place: "process 1 of 4".
bool launched_with_others();
std::string launched_place();

// The batches process q of P replays, out of the selected `batches` (sorted): a contiguous
// block, process 0's first and never empty when any batch is selected.
std::vector<int64_t> team_share(const std::vector<int64_t>& batches, int q, int P);

// The destination ranks process q of P owns in a rank split of W ranks: [q W / P, (q + 1) W / P)
// (empty when W < P leaves it none).
std::pair<int64_t, int64_t> rank_block(int64_t W, int q, int P);

// What a worker found, as process 0 merges it: every check in the order decided (the passes
// too, unless the report only counts them: then `pass_counts`), its warnings, and the trouble that
// stopped it (empty: none).
struct Findings {
  std::vector<CheckResult> checks;
  std::map<std::string, int64_t> pass_counts;
  std::vector<std::string> warnings;
  std::string trouble;
};
std::string encode_findings(const Report& r, bool counted_passes);
// Throws Error when the bytes are not what encode_findings makes.
Findings decode_findings(const std::string& bytes);

// ---- a rank split's exchanges, batch by batch

// A check one process recorded of a rank-split batch, and the phase it was decided in: 0 the
// batch-level steps and troubles (process 0 records them all), 1 the lookup checks, 2 the output
// checks (each process those of its ranks). Within a phase one process decides its ranks in
// ascending order, so phase, then process, then record order is the one-process order.
struct SplitRecord {
  int phase = 0;
  CheckResult check;
};
// Where one process's part of the batch stopped: trouble that ends the batch (recorded as it
// would be in one process), or `fatal`: trouble that ends the run.
struct SplitStop {
  bool set = false, fatal = false;
  int phase = 0;
  int rank = -1;
  std::string stage, message;
};
struct SplitFindings {
  std::vector<SplitRecord> records;
  SplitStop stop;
  std::string fatal;  // trouble that ends the run once the batch's findings are in (empty: none)
};
std::string encode_split(const SplitFindings& f);
SplitFindings decode_split(const std::string& bytes);  // throws Error on bytes not so made
// The one-process order of every process's findings (indexed by process): a check, or the stop
// that ends the batch (the first in phase-then-process order; nothing after it).
struct SplitEvent {
  const CheckResult* check = nullptr;  // null: `stop`
  const SplitStop* stop = nullptr;
};
std::vector<SplitEvent> split_order(const std::vector<SplitFindings>& all);

// Trouble a unit met (its destination d), or an out-of-memory stop of the units.
struct UnitTrouble {
  int64_t d = 0;
  int rank = -1;
  std::string stage, message;
  bool stop = false;
};
// What the units of one process found before any check is decided: their troubles in unit order,
// and every sender's lookup diff merged over this process's destinations.
struct UnitFindings {
  std::vector<UnitTrouble> troubles;
  std::vector<uint8_t> comparable;  // [W]
  std::vector<TensorDiff> lookups;  // [W]
};
std::string encode_units(const UnitFindings& f);
UnitFindings decode_units(const std::string& bytes);

}  // namespace dynemb
