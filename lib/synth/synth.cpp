// Workload generator behind `dynemb-dist synth` (see synth.hpp).
#include "synth/synth.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "capture/capture.hpp"
#include "capture/embedded_plans.hpp"
#include "common/error.hpp"
#include "common/hash.hpp"
#include "common/parallel.hpp"
#include "common/test_hooks.hpp"
#include "engine/backend.hpp"
#include "engine/dest_blocks.hpp"
#include "engine/embedding_source.hpp"
#include "engine/input_dist.hpp"
#include "engine/mean_pooling.hpp"
#include "engine/ops.hpp"
#include "engine/output_dist.hpp"

namespace dynemb {

namespace {

// splitmix64 (Steele, Lea, Flood 2014): tiny, seedable, identical on every platform.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n >= 1 (multiply-high: no modulo loop, bias < n / 2^64).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

// One independent stream per (seed, batch, rank, purpose).
SplitMix64 stream(uint64_t seed, int64_t batch, int64_t rank, uint64_t purpose) {
  uint64_t s = fmix64(seed ^ 0x5eed5eed5eed5eedULL);
  s = fmix64(s + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(batch + 1));
  s = fmix64(s + 0xc2b2ae3d27d4eb4fULL * static_cast<uint64_t>(rank + 1));
  s = fmix64(s + purpose);
  return SplitMix64{s};
}

// A Zipf exponent: finite and positive (nan and inf would put every id on one rank, the
// draw's arithmetic being undefined); past 100 every draw is already the first value.
constexpr double kMaxZipfAlpha = 100;
bool zipf_alpha_ok(double alpha) {
  return std::isfinite(alpha) && alpha > 0 && alpha <= kMaxZipfAlpha;
}

// Zipf(alpha) over [1, n] by inverting the continuous power law (close to the discrete
// Zipf for n >> 1; the head is what matters here).
int64_t zipf(SplitMix64& rng, double alpha, int64_t n) {
  const double u = rng.unit();
  double x;
  if (std::fabs(alpha - 1.0) < 1e-9) {
    x = std::exp(u * std::log(static_cast<double>(n) + 1.0));
  } else {
    const double a = 1.0 - alpha;
    x = std::pow((std::pow(static_cast<double>(n) + 1.0, a) - 1.0) * u + 1.0, 1.0 / a);
  }
  const int64_t k = static_cast<int64_t>(x);
  return std::min<int64_t>(std::max<int64_t>(k, 1), n);
}

int64_t draw_length(SplitMix64& rng, const Hotness& h) {
  switch (h.kind) {
    case Hotness::Kind::fixed:
      return h.lo;
    case Hotness::Kind::uniform:
      return h.lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(h.hi - h.lo + 1)));
    case Hotness::Kind::zipf:
      return zipf(rng, h.alpha, h.hi);
  }
  return 0;
}

int64_t parse_int(const std::string& s, const std::string& what) {
  try {
    size_t pos = 0;
    const long long v = std::stoll(s, &pos);
    if (pos != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    throw UsageError(fmt::format("{}: '{}' is not an integer", what, s));
  }
}

double parse_double(const std::string& s, const std::string& what) {
  try {
    size_t pos = 0;
    const double v = std::stod(s, &pos);
    if (pos != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    throw UsageError(fmt::format("{}: '{}' is not a number", what, s));
  }
}

// An id outside [0, num_embeddings) (see SynthOptions::oob_fraction).
int64_t wild_id(SplitMix64& rng, const FeatureInfo& f, const SynthOptions& o) {
  const bool i32 = o.index_type == IndexType::i32;
  if (f.dist_type != DistType::continuous) {  // a raw key: any value of the index dtype
    const uint64_t x = rng.next();
    return i32 ? static_cast<int32_t>(static_cast<uint32_t>(x)) : static_cast<int64_t>(x);
  }
  if (rng.below(2) == 0) return -1 - static_cast<int64_t>(rng.below(1000));
  const int64_t n = f.hash_size;
  const int64_t hi = i32 ? std::min<int64_t>(n, std::numeric_limits<int32_t>::max() - n) : n;
  return hi > 0 ? n + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi))) : -1;
}

Hotness fixed(int64_t n) {
  return Hotness{Hotness::Kind::fixed, n, n, 1.0};
}
Hotness uniform(int64_t hi) {
  return Hotness{Hotness::Kind::uniform, 0, hi, 1.0};
}

struct PresetWorkload {
  const char* name;
  int64_t batch_size;
  std::vector<Hotness> hotness;
  bool big;  // default --store ctx only (local_embs/output would be gigabytes)
};

const std::vector<PresetWorkload>& presets() {
  // The workloads of the presets of plans/README.md.
  static const std::vector<PresetWorkload> p = {
      {"unit-seq-w2", 8, {uniform(16), uniform(8), uniform(20), uniform(1)}, false},
      {"unit-seq-w8", 128, {uniform(16), uniform(8), uniform(20), uniform(1)}, false},
      {"unit-pooled-w8", 128, {uniform(15), uniform(100), uniform(20), uniform(1)}, false},
      {"odd-dims", 8, {uniform(16), uniform(8), uniform(20), uniform(1)}, false},
      {"odd-dims-d15", 8, {uniform(16), uniform(8), uniform(20), uniform(1)}, false},
      {"ec-bench-criteo", 8192, {fixed(10)}, true},
      {"hstu-e2e", 32, {fixed(2048)}, true},
  };
  return p;
}

}  // namespace

std::string Hotness::str() const {
  switch (kind) {
    case Kind::fixed:
      return std::to_string(lo);
    case Kind::uniform:
      return fmt::format("{}..{}", lo, hi);
    case Kind::zipf:
      return fmt::format("zipf:{}:{}", alpha, hi);
  }
  return "?";
}

Hotness parse_hotness(const std::string& s) {
  const std::string what = "--hotness entry";
  if (s.rfind("zipf:", 0) == 0) {
    const size_t c = s.find(':', 5);
    if (c == std::string::npos)
      throw UsageError(fmt::format("{} '{}': want zipf:ALPHA:MAX", what, s));
    Hotness h{Hotness::Kind::zipf, 1, parse_int(s.substr(c + 1), what),
              parse_double(s.substr(5, c - 5), what)};
    if (!zipf_alpha_ok(h.alpha) || h.hi < 1)
      throw UsageError(
          fmt::format("{} '{}': want 0 < ALPHA <= {} and MAX >= 1", what, s, kMaxZipfAlpha));
    return h;
  }
  const size_t dots = s.find("..");
  if (dots != std::string::npos) {
    Hotness h{Hotness::Kind::uniform, parse_int(s.substr(0, dots), what),
              parse_int(s.substr(dots + 2), what), 1.0};
    if (h.lo < 0 || h.hi < h.lo)
      throw UsageError(fmt::format("{} '{}': want 0 <= LO <= HI", what, s));
    return h;
  }
  const int64_t n = parse_int(s, what);
  if (n < 0) throw UsageError(fmt::format("{} '{}': a length must be >= 0", what, s));
  return fixed(n);
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets()) names.emplace_back(p.name);
  return names;
}

Plan preset_plan(const std::string& name) {
  const char* text = embedded_plan_text(name);
  if (!text) {
    const auto names = embedded_plan_names();
    throw UsageError(
        fmt::format("unknown preset '{}' (presets: {})", name, fmt::join(names, ", ")));
  }
  return load_plan_or_throw(text, "preset " + name + " (plans/" + name + ".yaml)");
}

SynthOptions preset_workload(const std::string& name) {
  SynthOptions o;  // a shipped plan without a workload row: B = 8, U[0,8] everywhere
  for (const auto& p : presets())
    if (name == p.name) {
      o.batch_sizes = {p.batch_size};
      o.hotness = p.hotness;
      if (p.big) o.store_local_embs = o.store_output = false;
    }
  return o;
}

void check_synth_options(const Plan& plan, const SynthOptions& o) {
  const int64_t W = plan.world_size, F = plan.num_features();
  if (o.batches < 1) throw UsageError("--batches must be >= 1");
  if (o.batch_sizes.size() != 1 && static_cast<int64_t>(o.batch_sizes.size()) != W)
    throw UsageError(
        fmt::format("--batch-sizes: {} entries, want 1 or W = {}", o.batch_sizes.size(), W));
  for (int64_t b : o.batch_sizes)
    if (b < 0) throw UsageError(fmt::format("batch size {} < 0", b));
  if (o.hotness.size() != 1 && static_cast<int64_t>(o.hotness.size()) != F)
    throw UsageError(fmt::format("--hotness: {} entries, want 1 or F = {} (features: {})",
                                 o.hotness.size(), F, plan.num_features()));
  if (o.empty_rank && (*o.empty_rank < 0 || *o.empty_rank >= W))
    throw UsageError(fmt::format("--empty-rank {} out of range [0, {})", *o.empty_rank, W));
  if (o.zipf_ids && !zipf_alpha_ok(o.zipf_alpha))
    throw UsageError(
        fmt::format("--ids zipf:{}: want 0 < ALPHA <= {}", o.zipf_alpha, kMaxZipfAlpha));
  if (!(o.oob_fraction >= 0 && o.oob_fraction <= 1))
    throw UsageError(fmt::format("--oob-ids {}: want a fraction in [0, 1]", o.oob_fraction));
  if ((o.store_module_output || o.plant != SynthOptions::Plant::none) &&
      plan.module != ModuleKind::pooled)
    throw UsageError("module_output and the MEAN plants need a pooled plan");
  if (o.plant != SynthOptions::Plant::none && !plan.any_mean)
    throw UsageError("--plant: the MEAN faults need a plan with a MEAN table (pooling: mean)");
  if (o.plant == SynthOptions::Plant::output_after_callback && !o.store_output)
    throw UsageError("--plant output-after-callback needs --store with output");
  if (o.plant == SynthOptions::Plant::output_after_callback && plan.data_type() != DType::f32)
    throw UsageError("--plant output-after-callback needs float32 tables");
  if (o.plant == SynthOptions::Plant::local_embs_means && !o.store_local_embs)
    throw UsageError("--plant local-embs-means needs --store with local_embs");
  if (o.index_type == IndexType::i32) {
    for (const TableConfig& t : plan.tables)
      if (t.num_embeddings > std::numeric_limits<int32_t>::max())
        throw UsageError(
            fmt::format("--index-type int32: table {} has {} rows, more than int32 "
                        "ids can address",
                        t.name, t.num_embeddings));
  }
}

namespace {

// Rank r's KJT of batch `batch` into `k` (empty).
void synth_rank_kjt(const Plan& plan, const SynthOptions& o, int64_t batch, int64_t r, Kjt& k) {
  const int64_t F = plan.num_features();
  k.num_features = F;
  k.lengths_type = k.values_type = o.index_type;
  k.weighted = o.weighted;
  const int64_t B = o.batch_sizes.size() == 1 ? o.batch_sizes[0] : o.batch_sizes[r];
  // Separate streams for strides, lengths, ids and weights: changing one option (say
  // --weighted) leaves the other draws as they were.
  SplitMix64 rs = stream(o.seed, batch, r, 1), rl = stream(o.seed, batch, r, 2),
             ri = stream(o.seed, batch, r, 3), rw = stream(o.seed, batch, r, 4),
             ro = stream(o.seed, batch, r, 5);
  std::vector<int64_t> bf(static_cast<size_t>(F), B);  // B_{r,f}
  if (o.vbe) {
    for (int64_t f = 0; f < F; ++f) bf[f] = B == 0 ? 0 : 1 + static_cast<int64_t>(rs.below(B));
    k.stride_per_feature = bf;
  }
  const bool empty = o.empty_rank && *o.empty_rank == r;
  for (int64_t f = 0; f < F; ++f) {
    const Hotness& h = o.hotness.size() == 1 ? o.hotness[0] : o.hotness[f];
    const uint64_t n = static_cast<uint64_t>(plan.features[f].hash_size);
    for (int64_t b = 0; b < bf[f]; ++b) {
      const int64_t len = empty ? 0 : draw_length(rl, h);
      k.lengths.push_back(len);
      for (int64_t i = 0; i < len; ++i) {
        int64_t id = o.zipf_ids ? zipf(ri, o.zipf_alpha, static_cast<int64_t>(n)) - 1
                                : static_cast<int64_t>(ri.below(n));
        if (o.oob_fraction > 0 && ro.unit() < o.oob_fraction) id = wild_id(ro, plan.features[f], o);
        k.values.push_back(id);
        if (o.weighted) k.weights.push_back(static_cast<float>(rw.below(9)) / 4.0f);
      }
    }
  }
}

}  // namespace

std::vector<Kjt> synth_kjts(const Plan& plan, const SynthOptions& o, int64_t batch) {
  const int64_t W = plan.world_size;
  std::vector<Kjt> out(static_cast<size_t>(W));
  // Every rank draws from its own streams, so ranks are made on threads of their own.
  parallel_for(
      hardware_threads(), W,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) synth_rank_kjt(plan, o, batch, r, out[r]);
      },
      /*grain=*/1);
  return out;
}

std::vector<int64_t> synth_inverse_indices(const SynthOptions& o, const Kjt& kjt, int64_t batch,
                                           int64_t rank) {
  SplitMix64 rv = stream(o.seed, batch, rank, 6);  // its own stream: no other draw moves
  const int64_t B = kjt.stride();
  std::vector<int64_t> inv;
  for (int64_t f = 0; f < kjt.num_features; ++f)
    for (int64_t b = 0; b < B; ++b) {
      const uint64_t n = static_cast<uint64_t>(kjt.batch_size(f));
      inv.push_back(n == 0 ? 0 : static_cast<int64_t>(rv.below(n)));
    }
  return inv;
}

void synth_capture(const Plan& plan, const SynthOptions& o, const std::string& path,
                   const std::function<void(int64_t)>& progress) {
  check_synth_options(plan, o);
  auto out = std::make_shared<OutputFile>(path);
  synth_capture(plan, o, out, progress);
  out->commit();
}

namespace {

// The capture's HDF5 calls on a thread of their own, in the order they were queued, while the
// caller derives what comes next (libhdf5 is not thread-safe: one thread makes every call).
// A task that throws stops the queue: the caller gets its error at the next push or wait.
// Without a thread (none could be started), push runs the task itself.
class WriteQueue {
 public:
  WriteQueue() {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {
    }
  }
  ~WriteQueue() { stop(); }  // what was not written is dropped (the caller is failing)
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  // Queues `task`; returns its number (1, 2, ...), for wait.
  uint64_t push(std::function<void()> task) {
    if (!thread_.joinable()) {
      task();
      return ++pushed_;
    }
    std::lock_guard<std::mutex> lk(m_);
    if (error_) std::rethrow_exception(error_);
    q_.push_back(std::move(task));
    cv_work_.notify_one();
    return ++pushed_;
  }
  // Waits until tasks 1..n have run (and released what they held).
  void wait(uint64_t n) {
    if (!thread_.joinable()) return;
    std::unique_lock<std::mutex> lk(m_);
    cv_done_.wait(lk, [&] { return done_ >= n || error_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run() {
    quiet_hdf5_errors();  // libhdf5's error printing is per thread
    std::unique_lock<std::mutex> lk(m_);
    while (true) {
      cv_work_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (stop_ || error_) return;
      std::function<void()> task = std::move(q_.front());
      q_.pop_front();
      lk.unlock();
      std::exception_ptr e;
      try {
        task();
      } catch (...) {
        e = std::current_exception();
      }
      task = nullptr;  // a batch's tensors go with its last task
      lk.lock();
      if (e) {
        error_ = e;
        q_.clear();
      }
      ++done_;
      cv_done_.notify_all();
    }
  }
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_work_.notify_all();
    thread_.join();
  }

  std::mutex m_;
  std::condition_variable cv_work_, cv_done_;
  std::deque<std::function<void()>> q_;
  uint64_t pushed_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// Queues one batch's writes in the file's order (rank r's inputs, its outputs, then rank
// r + 1's), each as soon as what it writes exists: rank r's inputs once its lookup output
// does (when local_embs are stored), its outputs once the output dist has made them.
class BatchWrites {
 public:
  // `drop_lookups`: a rank's local_embs are freed once written (no dist reads them later).
  BatchWrites(WriteQueue& q, CaptureWriter& w, std::shared_ptr<Batch> batch,
              bool drop_lookups = false)
      : q_(q),
        w_(w),
        batch_(std::move(batch)),
        W_(static_cast<int64_t>(batch_->ranks.size())),
        drop_lookups_(drop_lookups) {
    out_task_.assign(static_cast<size_t>(W_), 0);
    const int64_t k = batch_->index;
    CaptureWriter* w_p = &w_;
    q_.push([w_p, k] { w_p->begin_batch(k); });
  }
  // Ranks [0, inputs) have their inputs, [0, outputs) their outputs.
  void ready(int64_t inputs, int64_t outputs) {
    CaptureWriter* w = &w_;
    while (true) {
      if (in_ == out_ && in_ < std::min(inputs, W_)) {
        const int64_t r = in_++;
        in_task_.push_back(q_.push([w, b = batch_, r, drop = drop_lookups_] {
          w->write_rank_inputs(r, b->ranks[r]);
          if (drop) b->ranks[r].local_embs.reset();
        }));
      } else if (out_ < in_ && out_ < outputs) {
        const int64_t r = out_++;
        out_task_[r] = q_.push([w, b = batch_, r] {
          RankBatch& rb = b->ranks[r];
          w->write_rank_outputs(r, rb);
          // Rank r is written, inputs (queued before) and outputs: what nothing reads again is
          // freed now, not kept while later ranks or the next batch are made. Not its lookup
          // output, which a whole batch's dist may still be reading on the main thread.
          rb.kjt = Kjt{};
          rb.ctx.reset();
          rb.output.reset();
          rb.keys.reset();
          rb.module_output.reset();
          rb.inverse_indices.reset();
        });
      } else {
        break;
      }
    }
  }
  // Returns once rank r's outputs are written.
  void wait_outputs(int64_t r) { q_.wait(out_task_[r]); }
  // Returns once rank r's inputs are written.
  void wait_inputs(int64_t r) { q_.wait(in_task_[size_t(r)]); }
  // Queues the end of the batch; returns its task number.
  uint64_t end() {
    ready(W_, W_);
    CaptureWriter* w = &w_;
    return q_.push([w] { w->end_batch(); });
  }

 private:
  WriteQueue& q_;
  CaptureWriter& w_;
  std::shared_ptr<Batch> batch_;
  int64_t W_, in_ = 0, out_ = 0;
  bool drop_lookups_;
  std::vector<uint64_t> out_task_, in_task_;
};

// The test hook DYNEMB_SYNTH_BY_DESTINATION=off (common/test_hooks.hpp): every batch's output
// dist whole.
bool synth_by_destination_allowed() {
  return !test_hooks::synth_by_destination_off();
}

// Whether every id of every rank's lookup is inside its table, as bounds_check=error demands.
// A batch with one that is not goes the whole way (derive_local_embs), so that its error names
// the first bad id in the whole lookups' order, not in a block's.
bool lookups_in_bounds(const Plan& plan, const DerivedBatch& derived) {
  if (plan.bounds_check != BoundsCheck::error) return true;
  std::atomic<bool> ok{true};
  for (int64_t r = 0; r < plan.world_size && ok; ++r) {
    const LookupKjt& lk = derived.ranks[r].lookup_kjt;
    const std::vector<int64_t> bag0 = lookup_output_layout(plan, lk).bag0;
    const std::vector<int64_t> off = complete_cumsum(lk.lengths);
    if (off.back() != static_cast<int64_t>(lk.values.size())) return false;
    parallel_for(hardware_threads(), bag0.back(), [&](int64_t j0, int64_t j1) {
      each_bag(bag0, j0, j1, [&](int64_t f, int64_t j) {
        for (int64_t p = off[j]; p < off[j + 1]; ++p)
          if (lookup_row(plan, f, r, lk.values[p]).oob) ok.store(false, std::memory_order_relaxed);
      });
    });
  }
  return ok;
}

// Rows of a pooled destination made at once: 64 MiB of its blocks (`row_floats` per row, all
// W blocks), at least one (the test hook DYNEMB_SYNTH_UNIT_ROWS=N: N).
int64_t unit_rows(int64_t row_floats) {
  if (const std::optional<int64_t> n = test_hooks::synth_unit_rows()) return *n;
  constexpr int64_t kUnitFloats = int64_t(16) << 20;
  return std::max<int64_t>(1, kUnitFloats / std::max<int64_t>(1, row_floats));
}

// The output dist of batch k one destination rank at a time, in the file's rank order: rank
// r's lookup (when stored), then its output from the blocks every rank s sends it, each the
// lookup of the bags r sent to s alone (engine/dest_blocks.hpp), through the backend's dist.
// Memory: one rank's lookup and 64 MiB of one destination's blocks, not the W lookups of the
// batch (each rank's output needs all of them); the blocks cost a second pass of lookups. The
// outputs are the whole dist's, bit for bit (tests/test_engine_dest_blocks.cpp), so the file
// is the same.
template <class Deliver>
void synth_by_destination(const Plan& plan, Backend& backend, const EmbeddingSource& source,
                          RwPooledEmbeddingDist* pooled, const DerivedBatch& derived, int64_t k,
                          bool store_local_embs, Batch& batch, BatchWrites& writes,
                          const Deliver& deliver) {
  const int64_t W = plan.world_size;
  std::vector<EmbTensor> shapes(static_cast<size_t>(W));  // the lookups' shapes, no data
  std::vector<TensorRef> lp(static_cast<size_t>(W));
  std::vector<const ShardingContext*> cp(static_cast<size_t>(W));
  std::vector<LookupKjtIndex> index(static_cast<size_t>(W));
  for (int64_t r = 0; r < W; ++r) {
    const LookupKjt& lk = derived.ranks[r].lookup_kjt;
    shapes[r].dtype = plan.data_type();
    shapes[r].shape = lookup_output_layout(plan, lk).shape;
    lp[r] = TensorRef(shapes[r]);
    cp[r] = &derived.ranks[r].ctx;
    index[r] = lookup_kjt_index(lk);
  }
  const bool variable_batch = pooled && pooled->check(k, lp, cp);  // latches as forward() does
  for (int64_t r = 0; r < W; ++r) {
    if (store_local_embs) {
      if (r >= 1) writes.wait_inputs(r - 1);  // one rank's lookup at a time
      batch.ranks[r].local_embs =
          backend.lookup(plan, int(r), derived.ranks[r].lookup_kjt, source, Place::host).t;
      writes.ready(r + 1, r);
    }
    // The blocks of a pooled destination (not VBE) a few of its rows at a time: its output is
    // their sum row by row, so its rows [b0, b1) are made from rows [b0, b1) of every block.
    const int64_t B = pooled && !variable_batch ? batch.ranks[r].kjt.stride() : 0;
    const int64_t step = unit_rows(W * plan.sum_dim);
    EmbTensor out;
    for (int64_t b0 = 0; b0 < std::max<int64_t>(B, 1); b0 += step) {
      const int64_t b1 = B > 0 ? std::min(B, b0 + step) : INT64_MAX;
      std::vector<EmbTensor> blocks(static_cast<size_t>(W));
      for (int64_t s = 0; s < W; ++s)
        blocks[s] = backend
                        .lookup(plan, int(s),
                                lookup_kjt_from(derived.ranks[s].lookup_kjt, index[s], r, b0, b1),
                                source, Place::host)
                        .t;
      EmbTensor part =
          destination_output(plan, backend, r, blocks, cp, variable_batch, Place::host).t;
      if (B == 0 || (b0 == 0 && b1 == B)) {
        out = std::move(part);
      } else {
        if (b0 == 0) {
          out = EmbTensor{part.dtype, {B, plan.sum_dim}, {}};
          out.data.reserve(size_t(B * plan.sum_dim));  // no regrowth: one output's memory
        }
        out.data.insert(out.data.end(), part.data.begin(), part.data.end());
      }
    }
    deliver(int(r), std::move(out), r + 1);
  }
}

}  // namespace

bool synth_by_destination_planned(const Plan& plan, const SynthOptions& o) {
  const bool need_dist = o.store_output || o.store_module_output;
  const bool in_bounds = plan.bounds_check != BoundsCheck::error || o.oob_fraction == 0;
  return need_dist && o.plant != SynthOptions::Plant::local_embs_means &&
         synth_by_destination_allowed() && in_bounds;
}

// Per batch: inputs, context, lookups, output dist, each handing its ranks' writes to the
// write queue as they complete, so that compressing and writing rank r overlaps deriving r + 1.
void synth_capture(const Plan& plan, const SynthOptions& o, std::shared_ptr<OutputFile> out,
                   const std::function<void(int64_t)>& progress) {
  check_synth_options(plan, o);
  const int64_t W = plan.world_size;
  CaptureWriter writer(std::move(out), plan, o.seed);
  const bool need_engine =
      o.store_ctx || o.store_local_embs || o.store_output || o.store_module_output;
  const bool need_lookup = o.store_local_embs || o.store_output || o.store_module_output;
  const bool need_dist = o.store_output || o.store_module_output;
  using Plant = SynthOptions::Plant;
  std::unique_ptr<Backend> backend = need_engine ? make_cpu_backend(0) : nullptr;
  OracleSource source(o.seed, plan);
  // The pooled module latches its variable-batch mode on the first batch, as TorchRec's does.
  std::optional<RwPooledEmbeddingDist> pooled;
  if (plan.module == ModuleKind::pooled && backend) pooled.emplace(plan);
  std::vector<std::string> keys;
  for (const FeatureInfo& f : plan.features) keys.push_back(f.name);
  // After the writer, so that its thread stops before the writer closes the file.
  WriteQueue queue;
  uint64_t last_end = 0;  // the task that ends the previous batch

  for (int64_t k = 0; k < o.batches; ++k) {
    // The previous batch is written (and its tensors freed) before this one is made: one
    // batch in memory at a time (its last rank's lookup output, written last, is the largest
    // thing a batch holds; the input dist's buckets are several times its KJTs).
    queue.wait(last_end);
    if (k > 0 && progress) progress(k - 1);
    auto batch = std::make_shared<Batch>();
    batch->index = k;
    batch->ranks.resize(static_cast<size_t>(W));
    std::vector<Kjt> kjts = synth_kjts(plan, o, k);
    parallel_for(
        hardware_threads(), W,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            RankBatch& rb = batch->ranks[r];
            rb.kjt = std::move(kjts[r]);
            rb.keys = keys;
            if (o.store_module_output && rb.kjt.is_vbe())
              rb.inverse_indices = synth_inverse_indices(o, rb.kjt, k, r);
          }
        },
        /*grain=*/1);
    DerivedBatch derived;
    if (need_engine) {
      std::vector<const Kjt*> kp(static_cast<size_t>(W));
      for (int64_t r = 0; r < W; ++r) kp[r] = &batch->ranks[r].kjt;
      derived = derive_input_dist(plan, kp);
      if (o.store_ctx)
        for (int64_t r = 0; r < W; ++r) {
          ShardingContext c = derived.ranks[r].ctx;
          c.batch_size_per_feature_pre_a2a.reset();  // not part of capture format v1
          batch->ranks[r].ctx = std::move(c);
        }
      // What is left to make needs the lookup KJTs and the contexts, not the bucketize outputs
      // (several times the ids of the batch).
      for (DerivedRank& d : derived.ranks) d.bucketized = BucketizedKjt{};
    }
    // The output dist one destination at a time (synth_by_destination): what it needs of every
    // rank's lookup is made for it, so a rank's local_embs go once written. Not when a planted
    // fault changes the lookups the dist runs on (DYNEMB_SYNTH_BY_DESTINATION=off: never).
    const bool by_destination =
        synth_by_destination_planned(plan, o) && lookups_in_bounds(plan, derived);
    BatchWrites writes(queue, writer, batch, /*drop_lookups=*/by_destination);
    if (!need_lookup) {
      writes.ready(W, W);
      last_end = writes.end();
      continue;
    }
    // What the dist makes of rank r: the module output, the planted fault, kept for the writer,
    // which is told that ranks [0, inputs) have their inputs.
    const auto deliver = [&](int rank, EmbTensor&& out, int64_t inputs) {
      RankBatch& rb = batch->ranks[rank];
      if (o.store_module_output)
        rb.module_output =
            module_output(plan, rb.kjt, out, rb.inverse_indices ? &*rb.inverse_indices : nullptr);
      if (o.plant == Plant::output_after_callback) out = mean_divided(plan, rb.kjt, out);
      if (o.store_output) rb.output = std::move(out);
      writes.ready(inputs, rank + 1);
      // At most three ranks' outputs wait for the writer.
      if (rank >= 2) writes.wait_outputs(rank - 2);
    };
    if (by_destination) {
      synth_by_destination(plan, *backend, source, pooled ? &*pooled : nullptr, derived, k,
                           o.store_local_embs, *batch, writes, deliver);
      last_end = writes.end();
      continue;
    }
    const int64_t inputs_wait_lookup = o.store_local_embs ? 0 : W;
    writes.ready(inputs_wait_lookup, need_dist ? 0 : W);
    std::vector<EmbTensor> local =
        derive_local_embs(plan, derived, source, *backend, k, [&](int64_t r, EmbTensor& e) {
          if (o.plant == Plant::local_embs_means)
            e = per_rank_means(plan, derived.ranks[r].lookup_kjt, e);
          if (o.store_local_embs) {
            batch->ranks[r].local_embs = std::move(e);  // the dist reads it there
            writes.ready(r + 1, need_dist ? 0 : W);
          }
        });
    if (need_dist) {
      std::vector<TensorRef> lp(static_cast<size_t>(W));
      std::vector<const ShardingContext*> cp(static_cast<size_t>(W));
      for (int64_t r = 0; r < W; ++r) {
        lp[r] = o.store_local_embs ? TensorRef(*batch->ranks[r].local_embs) : TensorRef(local[r]);
        cp[r] = &derived.ranks[r].ctx;
      }
      auto sink = [&](int rank, Tensor&& out) { deliver(rank, std::move(out.t), W); };
      if (plan.module == ModuleKind::sequence)
        RwSequenceEmbeddingDist(plan).forward(*backend, lp, cp, Place::host, sink);
      else
        pooled->forward(*backend, k, lp, cp, Place::host, sink);
    }
    last_end = writes.end();
  }
  queue.wait(last_end);
  if (o.batches > 0 && progress) progress(o.batches - 1);
  writer.finish();  // the caller commits `out`
}

}  // namespace dynemb
