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
#include "engine/tile_diff.hpp"
#include "model/types.hpp"
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
// describe_lookup_bounds_error (input_dist.hpp) turns it into the id as the user sent it.
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
  // The same for every rank of a batch: what derive_input_dist runs. The default is the host
  // reference on every core at once, rank by rank, for every backend: its results are used on
  // the host (the KJT all-to-all, the context checks), and a device's bucketize would send
  // ~3 x N values per rank back over the bus, which costs more than the host's pass. A device
  // backend's bucketize() is its kernels, which the GPU tests and `bench` check against this.
  virtual std::vector<BucketizedKjt> bucketize_ranks(const Plan& plan,
                                                     const std::vector<const Kjt*>& kjts);

  // Lookup on rank `rank` (§5). Sequence: [N_local, D] rows in LookupKjt value order.
  // Pooled: partial sums [sum_s B_s, sum_D] (non-VBE) or the 1-D VBE layout
  // [s][f][b][d]. Ids outside their table follow plan.bounds_check (error -> throws Error
  // naming rank, feature and position).
  virtual EmbTensor lookup(const Plan& plan, int rank, const LookupKjt& kjt,
                           const EmbeddingSource& source) = 0;
  // The same lookup when it is only the input of an output dist (a replay's derived lookups):
  // a device backend may keep it where it makes it, as rank `rank`'s, and hand back its dtype
  // and shape with no data. An output dist given a local_embs tensor with no data (and
  // elements) takes it from there: rank r's kept lookup, until the next lookup_for_dist of
  // rank r. The default is lookup().
  virtual EmbTensor lookup_for_dist(const Plan& plan, int rank, const LookupKjt& kjt,
                                    const EmbeddingSource& source);
  // The checks of a replay, made where the backend makes the tensors: each compares two tensors
  // of n elements in tiles (tile_diff.hpp) and returns the tiles that add something to the
  // diff, with values only where the first mismatches are. A device backend compares on the
  // device, so a passing check copies nothing back; the defaults here compare on the host.
  //
  // lookup() (want) against `captured` (got, n host floats in lookup()'s layout): a replay's
  // lookup check. nullopt when lookup() has not n elements; throws what lookup() throws. A
  // device backend may also keep `captured` there as rank `rank`'s input of the next
  // pooled_output_dist, whose local_embs[rank] is then that same memory, not copied again (a
  // replay checks a unit's lookups, then runs its dist on them): the caller leaves `captured`
  // unchanged until that dist.
  virtual std::optional<std::vector<TileDiff>> lookup_differences(const Plan& plan, int rank,
                                                                  const LookupKjt& kjt,
                                                                  const EmbeddingSource& source,
                                                                  const float* captured, int64_t n,
                                                                  const TileCompare& how);
  // The unsharded reference of rank `rank`'s KJT (want; reference_output, reference.hpp, `batch`
  // names it in errors) against the replayed output (got): n host floats at `replayed` when
  // held_rank < 0, else the output the last output dist held for rank `held_rank` (hold_outputs).
  virtual std::optional<std::vector<TileDiff>> reference_differences(
      const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source, int64_t batch,
      const float* replayed, int held_rank, int64_t n, const TileCompare& how);
  // While on, the output dists leave their outputs where they make them and hand the sink each
  // output's dtype and shape with no data; the output of rank r is held until the next dist, to
  // be compared there (held_output_differences, reference_differences). Returns whether this
  // backend holds them: the default does not, and its sinks get the data as always.
  virtual bool hold_outputs(bool on);
  // The held output of rank `rank` (got) against `want` (n host floats): a replay's golden
  // check. nullopt when no output of n elements is held for that rank.
  virtual std::optional<std::vector<TileDiff>> held_output_differences(int rank, const float* want,
                                                                       int64_t n,
                                                                       const TileCompare& how);

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
