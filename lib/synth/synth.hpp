// The `synth` workload generator: KJT inputs per rank from a seeded generator, plus, as
// asked, the context, lookup output and output-dist result of the reference engine, written
// as a capture (capture-format.md) with the hash64 oracle.
//
// Determinism: every random draw comes from splitmix64 streams seeded by (seed, batch, rank),
// never from <random> distributions (their output differs across standard libraries). Fixed
// and uniform draws are bit-reproducible everywhere; zipf draws go through libm's pow/log.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/output_file.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// Bag length distribution of one feature.
//   "10"            fixed 10
//   "0..16"         uniform over [0, 16]  (workloads.md's U[0,16])
//   "zipf:1.2:4096" Zipf(alpha=1.2) over [1, 4096]
//   "0"             zero-length feature
struct Hotness {
  enum class Kind : uint8_t { fixed, uniform, zipf };
  Kind kind = Kind::uniform;
  int64_t lo = 0, hi = 8;  // fixed: lo == hi
  double alpha = 1.0;      // zipf only
  std::string str() const;
};
Hotness parse_hotness(const std::string& s);  // throws UsageError

struct SynthOptions {
  int64_t batches = 1;
  std::vector<int64_t> batch_sizes = {8};      // B_r per rank; one entry = every rank
  std::vector<Hotness> hotness = {Hotness{}};  // per feature; one entry = every feature
  // Ids: uniform over [0, num_embeddings) of the feature's table, or Zipf(alpha) over the
  // same range with id 0 the hottest. (hash_)roundrobin tables get keys from the same range.
  bool zipf_ids = false;
  double zipf_alpha = 1.0;
  // This fraction of ids lies outside the table, drawn from their own stream (so 0 leaves
  // every other draw unchanged): continuous tables get, with equal odds, a negative id
  // -1..-1000 or an id in [num_embeddings, 2*num_embeddings) (past the last shard); the
  // (hash_)roundrobin tables get raw keys anywhere in the index dtype's range. A lookup of
  // such ids needs a plan with bounds_check warn_zero_row or ignore.
  double oob_fraction = 0.0;
  bool vbe = false;  // variable batch per feature: B_{r,f} uniform in [1, B_r] on every rank
  std::optional<int64_t> empty_rank;      // this rank keeps its B but every bag is empty
  uint64_t seed = 0;                      // workload and /oracle seed
  bool weighted = false;                  // weights k/4, k uniform in [0, 8] (dyadic: sums exact)
  IndexType index_type = IndexType::i64;  // lengths and values dtype
  bool store_ctx = true, store_local_embs = true, store_output = true;
  // Pooled: the module's final output after mean pooling (+ inverse_indices for VBE, drawn
  // uniformly from each feature's batch, B_full = B_r).
  bool store_module_output = false;
  // A planted MEAN fault, so its diagnosis can be seen: `output_after_callback` stores the
  // mean-divided result as `output` (a capture taken after the module's callback);
  // `local_embs_means` makes every rank's lookup return per-rank means for MEAN tables (a
  // lookup that kept PoolingMode.MEAN under RW), and the dist and module run on those.
  enum class Plant : uint8_t { none, output_after_callback, local_embs_means };
  Plant plant = Plant::none;
};

// Preset names with a workload (plans/README.md), in table order.
std::vector<std::string> preset_names();
// The preset's plan (plans/<name>.yaml, embedded) and its workload; throws UsageError.
Plan preset_plan(const std::string& name);
SynthOptions preset_workload(const std::string& name);

// Checks options against the plan (list lengths, ranges, int32 fit); throws UsageError.
void check_synth_options(const Plan& plan, const SynthOptions& opt);

// Whether synth_capture makes the output dist one destination rank at a time, holding one
// rank's lookup (MemoryEstimate::synth_by_destination), not every rank's: when it makes outputs,
// no planted fault changes the lookups, and no id can be outside its table under
// bounds_check: error (such a batch goes the whole way, so that its error names the same id).
bool synth_by_destination_planned(const Plan& plan, const SynthOptions& opt);

// The W local KJTs of batch `batch`.
std::vector<Kjt> synth_kjts(const Plan& plan, const SynthOptions& opt, int64_t batch);
// The VBE inverse indices of rank r's KJT in batch `batch` ([F * B_r], each < B_{r,f}).
std::vector<int64_t> synth_inverse_indices(const SynthOptions& opt, const Kjt& kjt, int64_t batch,
                                           int64_t rank);

// Writes the whole capture to `out` (temp name, renamed when complete). `progress(k)` is
// called after batch k is written.
void synth_capture(const Plan& plan, const SynthOptions& opt, const std::string& out,
                   const std::function<void(int64_t)>& progress = {});
// The same into an output file the caller created up front (common/output_file.hpp); the file
// is complete in its temporary on return, and the caller commits it.
void synth_capture(const Plan& plan, const SynthOptions& opt, std::shared_ptr<OutputFile> out,
                   const std::function<void(int64_t)>& progress = {});

}  // namespace dynemb
