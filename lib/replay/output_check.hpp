// The output checks of a batch: every rank's output against its golden output and against the
// unsharded reference, and the module's output after the mean-pooling step. One routine checks
// whatever part of a rank's output a unit made (the whole output, some of its columns, some of
// its rows), merging the part into the diff of the whole output through the unit's map back to
// whole coordinates; decide() then says the rank's checks, with their causes, once its last
// part went through.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "replay/run_context.hpp"

namespace dynemb::replay_detail {

// A part of rank `rank`'s output as a unit made it, and what the same elements are compared with.
struct OutputPart {
  int rank = 0;
  const Tensor* out = nullptr;               // on the host, or kept by the backend
  std::vector<int64_t> whole_shape;          // of the rank's whole output
  std::function<int64_t(int64_t)> to_whole;  // flat index in the part -> in the whole output
  const EmbTensor* golden = nullptr;         // the golden output's same elements; null: none
  // The reference of the same elements: this KJT's (the rank's, or some samples of it) under this
  // plan and source (a column slice's, or the run's).
  const Plan* plan = nullptr;
  const EmbeddingSource* source = nullptr;
  const Kjt* kjt = nullptr;
};

class OutputChecks {
 public:
  OutputChecks(RunContext& rc, BatchState& st);
  // The one output check: part `p` against its golden and reference elements, merged into its
  // rank's diffs. The first part of a rank decides whether the whole shapes agree (a pair whose
  // shapes differ is not compared further, as the whole diff says it).
  void check(const OutputPart& p);
  // Rank r's checks decided and emitted: golden, reference, module. `whole`: its whole output on
  // the host, for the MEAN diagnosis and the module check (null: no whole output is held).
  void decide(int r, const EmbTensor* whole);
  bool handed_over(int r) const { return !ranks_[size_t(r)].whole_shape.empty(); }
  // Every output check of the ranks the output dist did not hand over, skipped with `why`.
  void skip_rest(const std::string& why);
  // Rank r's output checks, whatever parts went through, skipped with `why`.
  void skip(int r, const std::string& why);
  // The crash a real rank would have had: a context finding, not trouble; the ranks not handed
  // over get no output checks.
  void dist_failed(const OutputDistFailure& e);

 private:
  struct Rank {
    std::vector<int64_t> whole_shape;  // empty: no part handed over yet
    std::optional<TensorDiff> gold, ref;
  };
  void record_checks(int r, std::optional<CheckResult> gold, std::optional<CheckResult> ref,
                     const EmbTensor* whole);
  RunContext& rc_;
  BatchState& st_;
  std::vector<Rank> ranks_;
};

}  // namespace dynemb::replay_detail
