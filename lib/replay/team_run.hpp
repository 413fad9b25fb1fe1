// One process's part of a replay under a launcher (team.hpp), as the Replayer (replay.cpp) runs
// it: which batches it replays, what it must know of the batches before its own (the context mode
// the first batch chose, whether an earlier batch had a ctx/ group, the pooled module's latch),
// and, once the run ends whatever happened, its findings sent to process 0 or merged there.
// Without a team every call is a no-op and the share is every selected batch.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "capture/capture.hpp"
#include "replay/run_context.hpp"

namespace dynemb::replay_detail {

class TeamRun {
 public:
  TeamRun(const ReplayOptions& opt, RunContext& rc, CheckLog& log, Report& rep)
      : team_(opt.team.get()), opt_(opt), rc_(rc), log_(log), rep_(rep) {}
  bool worker() const { return team_ && team_->index() > 0; }
  // The batches this process replays, out of the selected (sorted). --write-output copies every
  // batch through one writer: process 0 replays them all, the others none.
  std::vector<int64_t> share(const std::vector<int64_t>& selected) const;
  // The rank split (team.hpp), chosen when the batches run one destination at a time and the
  // `selected` batches are fewer than the processes (with a batch each, the batch split does
  // less: under the rank split every process still reads every batch's KJTs and contexts and
  // derives its input dist). Every process then replays every selected batch from the first, so
  // no latch or context mode is passed on; this process's ranks go to the run's context.
  // Under the lockstep split (ReplayOptions::team_split), whatever the batches: every process
  // replays every selected batch whole and records its ranks' checks. --write-output, which needs
  // every rank's output in one process, is refused (UsageError, alike in every process).
  void choose_split(bool by_destination, int64_t selected);
  bool splits() const { return split_; }
  bool lockstep() const { return lockstep_; }
  // Batch k under the rank split: fn() with what it records kept back, then the batch's exchange
  // (throws when the batch ends the run); process 0 then counts the batch done.
  void split_batch(int64_t k, const std::function<void()>& fn);
  // A worker, before its first batch: the findings of the setup forgotten (process 0 has the same),
  // the latch of the batches before its own received. Returns whether the replay's first selected
  // batch has a ctx/ group (the context mode it chose) when this worker replays any batch.
  std::optional<bool> begin(const CaptureReader& reader, const std::vector<int64_t>& selected,
                            const std::vector<int64_t>& mine);
  void at_batch();     // the test hook DYNEMB_MPI_KILL
  void after_batch();  // the latch passed on once it is final
  // After the run: the checks decided while the backend started recorded (CheckLog::settle; a
  // backend that could not start is the run's trouble), the latch exchanged if it was not, then
  // the findings: a worker sends its own, process 0 merges every worker's in process order
  // (after a worker that stopped on trouble, none: one process would have stopped there too).
  void finish();

 private:
  void send_carry();
  ReplayTeam* team_;
  const ReplayOptions& opt_;
  RunContext& rc_;
  CheckLog& log_;
  Report& rep_;
  bool carry_in_ = false, carry_out_ = false, began_ = false, split_ = false, lockstep_ = false;
};

}  // namespace dynemb::replay_detail
