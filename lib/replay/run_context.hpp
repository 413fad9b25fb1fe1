// What the parts of one replay share (private to lib/replay; replay.hpp is the API), and the
// words they speak: a batch's state as it goes through the steps a real job runs (the input
// dist derived, the contexts checked and chosen, the lookups checked, the output dist run and
// its outputs checked), and the *unit*: the piece of a batch checked at once.
//
// A batch runs as units cut by one planner (unit_planner.hpp) from the memory budget: the whole
// batch; slices of its embedding columns (column_slice.hpp); or destination ranks, a few of their
// output rows at a time (engine/dest_blocks.hpp). Every unit's lookups and outputs are checked by
// the same routines (lookup_check.hpp, output_check.hpp), which merge a unit's part into the
// diff of the whole tensor through the unit's map back to whole-batch coordinates; the checks are
// decided once every unit of their tensor went through.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.hpp"
#include "engine/input_dist.hpp"
#include "engine/output_dist.hpp"
#include "replay/check_log.hpp"
#include "replay/diff.hpp"
#include "replay/replay.hpp"
#include "replay/step_clock.hpp"

namespace dynemb::replay_detail {

// Elements per tile of a comparison (engine/tile_diff.hpp): a tile of the first mismatches brings
// both sides' values back, half a MiB.
constexpr int64_t kCompareTile = int64_t(1) << 16;

struct RunContext {
  RunContext(const ReplayOptions& o, BackendStartup& b, CheckLog& l) : opt(o), backend(b), log(l) {}
  const ReplayOptions& opt;
  BackendStartup& backend;  // get(): waits for a backend still starting
  CheckLog& log;
  StepClock clock;

  Plan plan;  // the plan the replay runs under: --plan, or the capture's
  Tolerance tol;
  std::shared_ptr<const EmbeddingSource> source;  // null: the capture has no /oracle, no /tables
  std::optional<RwSequenceEmbeddingDist> seq_dist;
  std::optional<RwPooledEmbeddingDist> pooled_dist;
  bool use_captured = false;  // --ctx captured (or automatic, and the first batch had ctx/)
  bool writing = false;       // --write-output: every output is kept whole, on the host
  std::optional<int64_t> latched_batch;  // batch whose context latched the pooled module
  bool warned_no_local = false;
  bool ctx_seen = false;  // some rank-batch so far had a ctx/ group
  // Under a team (replay/team.hpp), a process whose first batch is not the replay's first:
  // whether an earlier selected batch has a ctx/ group, asked once when ctx_seen matters.
  std::function<bool()> ctx_before;
  // Under a team whose processes split each batch by destination rank blocks (team.hpp): this
  // process's ranks [first, second). Unset: every rank.
  std::optional<std::pair<int64_t, int64_t>> own_ranks;
  // The lockstep split (ReplayOptions::team_split): every process runs each batch whole, and
  // decides the lookup and output checks of own_ranks alone.
  bool lockstep() const { return own_ranks && opt.team_split != TeamSplit::automatic; }
  // Whether this process decides rank r's checks of a batch replayed whole: every rank, but
  // under the lockstep split only its own (under the rank split a batch replayed whole is
  // process 0's alone, every rank of it).
  bool owns(int64_t r) const {
    return !lockstep() || (r >= own_ranks->first && r < own_ranks->second);
  }

  bool pooled_mean() const { return plan.module == ModuleKind::pooled && plan.any_mean; }
  TileCompare how() const { return TileCompare{tol, kCompareTile, opt.max_mismatches}; }
  // After an output dist ran: the batch whose context latched the pooled module, if it was this.
  void note_latch(int64_t k) {
    if (pooled_dist && !latched_batch && pooled_dist->latched_variable_batch()) latched_batch = k;
  }
};

// One batch as its steps go: its inputs by rank, what was derived and chosen, and whether the
// checks so far found the context or the lookup wrong (the cause a later mismatch names).
struct BatchState {
  BatchState(int64_t k, const Batch& batch, int64_t W);
  // The same batch read again with more of it (its float data): the inputs point there; what was
  // derived and decided stays.
  void rebind(const Batch& batch);
  const Batch& batch() const { return *batch_; }
  int64_t k;
  int64_t W;
  std::vector<const Kjt*> kjts;                  // [W]
  std::vector<const ShardingContext*> cap_ctx;   // [W], null: no ctx/ captured
  std::vector<const EmbTensor*> cap_local;       // [W], null: no local_embs captured
  std::vector<const EmbTensor*> golden;          // [W], null: no output captured
  DerivedBatch der;                              // the input dist, derived
  std::vector<ShardingContext> used;             // [W] merged contexts (--ctx captured)
  std::vector<const ShardingContext*> used_ptr;  // [W] what the output dist gets: -> used or der
  bool ctx_bad = false, lookup_bad = false;

 private:
  const Batch* batch_;

 public:
  std::string cause_before_output() const {  // "context", "lookup/local_embs" or ""
    return ctx_bad ? "context" : lookup_bad ? "lookup/local_embs" : "";
  }
};

// The piece of a batch checked at once.
struct Unit {
  enum class Cut : uint8_t { whole, columns, destination };
  Cut cut = Cut::whole;
  int64_t c0 = 0, c1 = 0;  // columns: [c0, c1) of the embedding columns
  int64_t d = -1;          // destination: the rank whose output it makes
  bool rows = false;       // destination: only rows [r0, r1) of a pooled output (not VBE)
  int64_t r0 = 0, r1 = 0;
};

// The tensors as the output dists take them.
inline std::vector<TensorRef> refs(const std::vector<const EmbTensor*>& t) {
  std::vector<TensorRef> out;
  out.reserve(t.size());
  for (const EmbTensor* e : t) out.push_back(e ? TensorRef(*e) : TensorRef());
  return out;
}
inline std::vector<TensorRef> refs(const std::vector<Tensor>& t) {
  std::vector<TensorRef> out;
  out.reserve(t.size());
  for (const Tensor& e : t) out.push_back(TensorRef(e));
  return out;
}

// Once the first slice or unit is looked up, the bucketize outputs are read no more (they trace
// an out-of-table id to its origin, and the first lookup met every id): W times three id-sized
// vectors, given back.
inline void drop_bucketized(BatchState& st) {
  for (DerivedRank& d : st.der.ranks) d.bucketized = BucketizedKjt{};
}

// A CheckResult from the diff `d` of `got_label` against `want_label` under `tol`.
CheckResult tensor_check(int64_t batch, int rank, const std::string& stage,
                         const std::string& check, const std::string& got_label,
                         const std::string& want_label, const TensorDiff& d, const Tolerance& tol);
// A check not made, and why.
CheckResult skipped(int64_t batch, int rank, const std::string& stage, const std::string& check,
                    const std::string& why);

// The steps before the output dist (contexts.cpp): the input dist every rank ran, the captured
// contexts against it, and the contexts the output dist gets (with the pooled latch's check).
void derive_batch(RunContext& rc, BatchState& st);
void check_contexts(RunContext& rc, BatchState& st);
void choose_contexts(RunContext& rc, BatchState& st);

// Where an element of a tensor lies (coords.hpp): rank r's local_embs, rank r's output.
TensorLayout lookup_layout(const RunContext& rc, const BatchState& st, int r);
TensorLayout output_layout(const Plan& plan, const Kjt& kjt, const std::vector<int64_t>& shape);

}  // namespace dynemb::replay_detail
