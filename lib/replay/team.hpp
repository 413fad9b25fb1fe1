// The processes of one replay under a launcher (mpirun, srun --mpi=pmix; docs/multi-node.md):
// process q of P replays a contiguous block of the selected batches (process 0 the first), and
// sends its findings to process 0, which merges them in batch order into the one report, exactly
// as one process would have decided them. Only mpi_team.cpp speaks MPI; the replay sees this
// interface.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "replay/report.hpp"

namespace dynemb {

class ReplayTeam {
 public:
  virtual ~ReplayTeam() = default;
  virtual int index() const = 0;  // this process, 0 .. size() - 1
  virtual int size() const = 0;
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

}  // namespace dynemb
