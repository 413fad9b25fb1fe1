// The seams a device backend replaces (issue: reference engine §7). The CPU backend
// (cpu_backend.cpp) is the bit-exact reference; the CUDA backend (kernels/) emulates all W
// ranks on one GPU; the NCCL backend puts one rank per GPU. Everything above this interface
// (context derivation, diffs, reports) is backend-independent.
//
// All "per rank" vectors are indexed by rank, length W. Outputs are handed to a sink one
// rank at a time so a caller can compare and drop them: a full ec-bench-criteo batch is
// ~1 GB per rank and per stage.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "engine/embedding_source.hpp"
#include "engine/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// The output dist cannot run with the context it was given (splits that do not sum to the
// rows of local_embs, a permute index out of range, ...). In a real job this is the crash
// on one rank; in a replay it is a *context mismatch* finding (exit 1), not trouble.
class OutputDistFailure : public std::runtime_error {
 public:
  OutputDistFailure(int rank, std::string field, const std::string& msg)
      : std::runtime_error(msg), rank_(rank), field_(std::move(field)) {}
  int rank() const { return rank_; }                   // rank whose context is at fault
  const std::string& field() const { return field_; }  // context field, e.g. "input_splits"

 private:
  int rank_;
  std::string field_;
};

// A lookup with bounds_check=error met a local row outside its shard. The position is the
// lookup's own (rank, feature, source rank, sample, position in the sub-bag routed here);
// describe_lookup_bounds_error (engine.hpp) turns it into the id as the user sent it.
class LookupBoundsError : public Error {
 public:
  LookupBoundsError(const std::string& msg, int rank, int64_t feature, int64_t source_rank,
                    int64_t sample, int64_t position, int64_t local_row)
      : Error(msg),
        rank(rank),
        feature(feature),
        source_rank(source_rank),
        sample(sample),
        position(position),
        local_row(local_row) {}
  int rank;             // the rank that looked the id up
  int64_t feature;      // plan feature index
  int64_t source_rank;  // the rank whose KJT held the id
  int64_t sample;       // its sample in that KJT
  int64_t position;     // its position among the bag's ids routed to `rank`
  int64_t local_row;    // the local id after bucketize
};

// Elements [begin, begin + want.size()) of a lookup that differ from the captured lookup in
// some bit (some element of the range does), with the lookup's values there.
struct DifferingRange {
  int64_t begin = 0;
  std::vector<float> want;
};

// The ranges of `want` and `captured` (n elements each) that differ in some bit, compared in
// tiles of `tile` elements (the last one may be shorter), adjacent differing tiles merged into
// one range, in order: the host's side of Backend::lookup_differences, on every core.
std::vector<DifferingRange> differing_tiles(const float* want, const float* captured, int64_t n,
                                            int64_t tile);
// Those ranges' element bounds [begin, end) from the tiles' flags (differs[t] != 0: tile t
// differs), without their values: what a device backend copies back.
std::vector<std::pair<int64_t, int64_t>> differing_ranges(const std::vector<uint8_t>& differs,
                                                          int64_t n, int64_t tile);

// Receives the output of destination rank r: sequence [N_r, D], pooled [B_r, sum_D],
// pooled VBE 1-D [sum_f B_{r,f} D_f]. Called once per rank, in rank order.
using OutputSink = std::function<void(int rank, EmbTensor&& output)>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;    // "cpu", "cuda", "nccl"
  virtual std::string device() const = 0;  // e.g. "host, 2 threads" or "NVIDIA H200 (sm_90)"

  // Input dist stage 1 on one rank: block_bucketize_sparse_features (§3.2, §3.3, §10.2)
  // with the plan's dist_type and block sizes; stable order, unbucketize_permute always.
  // Routing never fails: out-of-table ids are a lookup (bounds_check) matter.
  virtual BucketizedKjt bucketize(const Plan& plan, const Kjt& kjt) = 0;

  // Lookup on rank `rank` (§5). Sequence: [N_local, D] rows in LookupKjt value order.
  // Pooled: partial sums [sum_s B_s, sum_D] (non-VBE) or the 1-D VBE layout
  // [s][f][b][d]. Ids outside their table follow plan.bounds_check (error -> throws Error
  // naming rank, feature and position).
  virtual EmbTensor lookup(const Plan& plan, int rank, const LookupKjt& kjt,
                           const EmbeddingSource& source) = 0;
  // lookup() compared bit for bit with `captured`, n elements in lookup()'s layout (a
  // replay's lookup check): the tiles of `tile` elements where the two differ, merged and in
  // order (differing_tiles), each with lookup()'s values; nullopt when lookup() has not n
  // elements. Throws what lookup() throws. That is all a diff needs: a pair of equal bits adds
  // nothing to it but its count (replay/diff.hpp). A device backend compares where it made
  // the lookup, so a passing check copies nothing back; this default makes it on the host.
  // A device backend may also keep `captured` there as rank `rank`'s input of the next
  // pooled_output_dist, whose local_embs[rank] is then that same memory, not copied again
  // (a replay checks a unit's lookups, then runs its dist on them): the caller leaves
  // `captured` unchanged until that dist.
  virtual std::optional<std::vector<DifferingRange>> lookup_differences(
      const Plan& plan, int rank, const LookupKjt& kjt, const EmbeddingSource& source,
      const float* captured, int64_t n, int64_t tile);
  // The same for the unsharded reference of rank `rank`'s KJT (reference_output, engine.hpp;
  // `batch` names it in errors) and the replayed output: compared where the backend makes the
  // reference, only the differing tiles back with the reference's values there.
  virtual std::optional<std::vector<DifferingRange>> reference_differences(
      const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source, int64_t batch,
      const float* replayed, int64_t n, int64_t tile);

  // RwSequenceEmbeddingDist for all W ranks (§6): forward recat permute of each rank's
  // local_embs, all-to-all (send output_splits rows, receive input_splits rows), then
  // out_r = recv_r[unbucketize_permute_r]; codec encode/decode around the exchange.
  virtual void sequence_output_dist(const Plan& plan,
                                    const std::vector<const EmbTensor*>& local_embs,
                                    const std::vector<const ShardingContext*>& ctx,
                                    const OutputSink& sink) = 0;

  // RwPooledEmbeddingDist for all W ranks (§7): reduce-scatter by batch_size_per_rank
  // (equal or unequal), or, when `variable_batch`, the per-feature 1-D reduce-scatter by
  // batch_size_per_rank_per_feature. MEAN tables are summed like SUM tables: under RW the
  // dist carries sums and the module divides afterwards (mean_pooling.hpp), never here.
  virtual void pooled_output_dist(const Plan& plan, bool variable_batch,
                                  const std::vector<const EmbTensor*>& local_embs,
                                  const std::vector<const ShardingContext*>& ctx,
                                  const OutputSink& sink) = 0;
};

std::unique_ptr<Backend> make_cpu_backend(int threads = 0);  // 0: hardware concurrency

}  // namespace dynemb
