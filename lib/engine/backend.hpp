// The seams a device backend replaces. The CPU backend
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

// The name of a tensor a backend keeps where it made it (a GPU backend's device memory) for a
// later step on the same backend: a lookup the output dist takes, an output a check compares.
// A backend keeps one tensor per role and rank; the next tensor it keeps for that role and rank
// replaces it (a batch's steps need one lookup and one output per rank at a time). Roles:
// lookup, what lookup(..., Place::kept) made; output, what an output dist made; input, what
// keep() took (a captured local_embs), apart from the lookup of its rank so that a check can
// compare the two where they are.
struct Kept {
  enum class Role : uint8_t { lookup, output, input };
  Role role = Role::lookup;
  int rank = 0;
};

// Where a step may leave the tensor it makes: on the host, or kept by the backend (Kept). A
// backend that keeps nothing makes host tensors whatever is asked.
enum class Place : uint8_t { host, kept };

// A tensor a step made. On the host, `t` holds it whole; kept by the backend, `t` holds its
// dtype and shape and no data, and `kept` names it.
struct Tensor {
  EmbTensor t;
  std::optional<Kept> kept;
  int64_t numel() const { return t.numel(); }
};

// A tensor as a step reads it, owning nothing: `n` elements at `host`, or the backend's kept
// tensor `kept`. `shape` (null for a bare span) is what the output dists' checks read.
struct TensorRef {
  TensorRef() = default;
  TensorRef(const EmbTensor& e)  // NOLINT(google-explicit-constructor): host data as is
      : dtype(e.dtype), shape(&e.shape), host(e.data.data()), n(e.numel()) {}
  TensorRef(const Tensor& x)  // NOLINT(google-explicit-constructor)
      : dtype(x.t.dtype),
        shape(&x.t.shape),
        host(x.kept ? nullptr : x.t.data.data()),
        n(x.t.numel()),
        kept(x.kept) {}
  // n host floats with no shape (a block of a larger tensor).
  static TensorRef span(const float* p, int64_t n, DType dtype = DType::f32) {
    TensorRef r;
    r.dtype = dtype;
    r.host = p;
    r.n = n;
    return r;
  }
  DType dtype = DType::f32;
  const std::vector<int64_t>* shape = nullptr;
  const float* host = nullptr;
  int64_t n = 0;
  std::optional<Kept> kept;
};

// Receives the output of destination rank r: sequence [N_r, D], pooled [B_r, sum_D], pooled VBE
// 1-D [sum_f B_{r,f} D_f]. Called once per rank, in rank order; the caller may check and drop
// each before the next is made (a full ec-bench-criteo output is about 1 GB per rank).
using OutputSink = std::function<void(int rank, Tensor&& output)>;

// The checks of a replay, made where the backend has the tensors: each compares two tensors of n
// elements in tiles (tile_diff.hpp) and returns the tiles that add something to the diff, with
// values only where the first mismatches are. A device backend's comparator works on the device,
// so a passing check copies nothing back; the CPU backend's is the host's.
class Comparator {
 public:
  virtual ~Comparator() = default;
  // `got` against `want`; nullopt when they have not the same number of elements.
  virtual std::optional<std::vector<TileDiff>> compare(const TensorRef& got, const TensorRef& want,
                                                       const TileCompare& how) = 0;
  // `got` against rank `rank`'s lookup of `kjt` (Backend::lookup), made where `got` is; nullopt
  // when the lookup has not got's element count. Throws what the lookup throws.
  virtual std::optional<std::vector<TileDiff>> compare_lookup(const TensorRef& got,
                                                              const Plan& plan, int rank,
                                                              const LookupKjt& kjt,
                                                              const EmbeddingSource& source,
                                                              const TileCompare& how) = 0;
  // `got` against the unsharded reference of rank `rank`'s KJT (reference.hpp; `batch` names it
  // in errors), made where `got` is; nullopt when the reference has not got's element count.
  // Throws what reference_output throws.
  virtual std::optional<std::vector<TileDiff>> compare_reference(
      const TensorRef& got, const Plan& plan, int rank, const Kjt& kjt,
      const EmbeddingSource& source, int64_t batch, const TileCompare& how) = 0;
};

// The comparator of host tensors (the CPU reference's): what a backend that keeps nothing, or a
// host/host pair, is compared with.
Comparator& host_comparator();

class Backend {
 public:
  explicit Backend(std::string name) : name_(std::move(name)) {}
  virtual ~Backend() = default;
  const std::string& name() const { return name_; }  // "cpu", "cuda", "nccl"
  virtual std::string device() const = 0;  // e.g. "host, 2 threads" or "NVIDIA H200 (sm_90)"

  // Input dist stage 1 on the ranks of a batch: block_bucketize_sparse_features (§3.2, §3.3,
  // §10.2) of each KJT with the plan's dist_type and block sizes, stable order; result[i] is
  // kjts[i]'s, bit for bit as bucketize_on_host makes it, in what it holds: new_lengths,
  // new_values, new_weights (weighted), and unbucketize_permute at least for a sequence plan
  // (its context's). dest_rank and a pooled plan's permute may be left empty: a device backend
  // sends back only what the host reads next (the KJT all-to-all, the contexts). kjts are
  // checked already (check_kjt); int32 and int64 ones may mix. Routing never fails:
  // out-of-table ids are a lookup (bounds_check) matter. The CPU backend runs the host's on
  // every core; the CUDA backend its kernels, all ranks in one launch (a replay's input dist
  // takes it once the backend has started: derive_input_dist).
  virtual std::vector<BucketizedKjt> bucketize(const Plan& plan,
                                               const std::vector<const Kjt*>& kjts) = 0;
  // One KJT's (tests, bench).
  BucketizedKjt bucketize(const Plan& plan, const Kjt& kjt) {
    return std::move(bucketize(plan, std::vector<const Kjt*>{&kjt}).front());
  }

  // Lookup on rank `rank` (§5). Sequence: [N_local, D] rows in LookupKjt value order. Pooled:
  // partial sums [sum_s B_s, sum_D] (non-VBE) or the 1-D VBE layout [s][f][b][d]. Ids outside
  // their table follow plan.bounds_check (error -> throws LookupBoundsError). Place::kept: the
  // backend may keep it as rank `rank`'s lookup (the input of the next output dist, or of a
  // check).
  virtual Tensor lookup(const Plan& plan, int rank, const LookupKjt& kjt,
                        const EmbeddingSource& source, Place place) = 0;
  // A host tensor kept as rank `rank`'s input (Kept::Role::input: a captured local_embs that a
  // check compares with the lookup and the output dist then takes: copied to the device once);
  // nullopt from a backend that keeps nothing (the caller goes on with the host tensor).
  virtual std::optional<Kept> keep(const EmbTensor& host, int rank) = 0;

  // RwSequenceEmbeddingDist for all W ranks (§6): forward recat permute of each rank's
  // local_embs, all-to-all (send output_splits rows, receive input_splits rows), then
  // out_r = recv_r[unbucketize_permute_r]; codec encode/decode around the exchange. Every
  // local_embs[r] has its shape; its data is on the host or kept by this backend.
  virtual void sequence_output_dist(const Plan& plan, const std::vector<TensorRef>& local_embs,
                                    const std::vector<const ShardingContext*>& ctx, Place place,
                                    const OutputSink& sink) = 0;

  // RwPooledEmbeddingDist for all W ranks (§7): reduce-scatter by batch_size_per_rank (equal or
  // unequal), or, when `variable_batch`, the per-feature 1-D reduce-scatter by
  // batch_size_per_rank_per_feature. MEAN tables are summed like SUM tables: under RW the dist
  // carries sums and the module divides afterwards (mean_pooling.hpp), never here.
  virtual void pooled_output_dist(const Plan& plan, bool variable_batch,
                                  const std::vector<TensorRef>& local_embs,
                                  const std::vector<const ShardingContext*>& ctx, Place place,
                                  const OutputSink& sink) = 0;

  // Where this backend's tensors are compared.
  virtual Comparator& comparator() = 0;

  // The device memory, in bytes, still free for the tensors a step keeps (Place::kept lookups
  // and outputs, keep()): a replay whose lookups stay on the device sizes its column slices by
  // this rather than by host memory, so a batch whose W lookups fit the device is made in one
  // pass over its ids. 0: this backend keeps nothing on a device of its own.
  virtual uint64_t device_memory_for_kept() const { return 0; }

 private:
  std::string name_;
};

// A backend's capability to read host memory lent to it directly (a GPU's DMA from page-locked
// memory; found by dynamic_cast, the CPU reference has none). A replay run by destination reads
// its unit rows into buffers reused unit after unit and lends each while the unit's checks read
// it, so that an upload from it is one copy by the device, not a copy into staging first.
class HostLending {
 public:
  virtual ~HostLending() = default;
  // Until unlend(p), uploads from inside [p, p + bytes) may read it directly (pinned the first
  // time, once per buffer). false: not lent (too small, or refused), uploads copy as before.
  virtual bool lend(void* p, size_t bytes) = 0;
  // No read of p is pending on return: the memory may be written, grown or freed (still
  // pinned, never read directly again, until forget(p) or a lend of memory overlapping it).
  virtual void unlend(void* p) = 0;
  virtual void forget(void* p) = 0;  // unpinned
};

// The CPU reference (cpu_backend.cpp) on `threads` cores (0: all). `keeps`: it keeps the
// tensors a step may keep (Place::kept, keep()) in host memory, as a device backend keeps them
// on its device, so that the replay's kept paths run and are compared with the host ones on any
// machine (a test build's DYNEMB_HOLD_OUTPUTS=host).
std::unique_ptr<Backend> make_cpu_backend(int threads = 0, bool keeps = false);

// The startup of a backend made on another thread while its caller goes on (a GPU backend's context
// and workspace take a sizeable part of a second, which a replay spends opening the capture and
// reading its first batch instead). name() answers at once; get() waits until `make` has
// returned and gives what it made, or rethrows what it threw.
class BackendStartup {
 public:
  BackendStartup(std::string name, std::function<std::unique_ptr<Backend>()> make);
  explicit BackendStartup(std::unique_ptr<Backend> ready);  // made already
  explicit BackendStartup(Backend& ready);                  // made already, owned elsewhere
  ~BackendStartup();
  BackendStartup(BackendStartup&&) noexcept;
  const std::string& name() const { return name_; }
  Backend& get();
  bool ready() const;   // get() would not wait
  bool failed() const;  // making it threw (get() rethrows that)

 private:
  std::string name_;
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dynemb
