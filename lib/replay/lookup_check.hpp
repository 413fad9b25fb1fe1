// The lookup checks of a batch: every rank's captured local_embs against its lookup derived
// from the embedding source. Like the output checks (output_check.hpp), a check is the merge of
// the parts the units compared (a rank's whole lookup, or its block for each destination),
// decided once every part went through.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "replay/run_context.hpp"

namespace dynemb::replay_detail {

class LookupChecks {
 public:
  LookupChecks(RunContext& rc, BatchState& st);
  // Part of rank s's captured local_embs (`got`) against the same part of its lookup (the bags of
  // `kjt`), compared where the backend makes the lookup, merged into s's diff. False when the
  // backend's lookup has not got's element count.
  bool check(int s, const TensorRef& got, const LookupKjt& kjt,
             const std::function<int64_t(int64_t)>& to_whole);
  // Rank s's check decided and emitted. `derived`: its whole lookup on the host, made when a
  // part could not be compared where the backend makes it or a MEAN diagnosis needs it (null:
  // made here when needed).
  void decide(int s, const EmbTensor* derived = nullptr);
  // Rank s's whole captured local_embs checked at once (`got`: kept by the backend, or the host
  // tensor), then decided.
  void check_whole(int s, const TensorRef& got, const EmbTensor* derived);
  // Rank s's diff so far (its parts merged, not decided), and whether every part was compared
  // where the lookup is made: what a process of a rank split sends to the process owning s, which
  // adopts the processes' merge.
  TensorDiff& diff(int s) { return diffs_[size_t(s)]; }
  bool comparable(int s) const { return comparable_[size_t(s)]; }
  void adopt(int s, TensorDiff d, bool comparable) {
    diffs_[size_t(s)] = std::move(d);
    comparable_[size_t(s)] = comparable;
  }

 private:
  RunContext& rc_;
  BatchState& st_;
  std::vector<TensorDiff> diffs_;  // [W]
  std::vector<bool> comparable_;   // [W]: every part was compared where the lookup is made
};

// The lookup of rank r (all ranks when r < 0, as the output dist's inputs when `dist_inputs`)
// with its errors said in the capture's words: the file, the batch, and for an id outside its
// table under bounds_check=error, the id as the user sent it.
std::vector<Tensor> lookups(RunContext& rc, const BatchState& st, int r, const Plan& plan,
                            const EmbeddingSource& source, bool dist_inputs);

}  // namespace dynemb::replay_detail
