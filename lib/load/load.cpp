// The load of each plan, batch by batch, from the KJTs alone (docs/load-report.md):
//
//   the source ranks split in one run per core: every id routed with the engine's rules
//     (PlanRouter), counted per (source, destination) [W * W] and per (table, destination)
//     bucket for its run [T * W]; then its key u64(id) placed by bucket with a counting sort
//     over the whole batch: keys [N], start [T * W + 1];
//   per destination d (on its own core): each table's keys, sorted, give the distinct rows
//     and their counts (the hot-row summary of d);
//   then O(W^2) sums: both dists' bytes, the per-batch column, the estimates.
// Memory: the batch's ids twice, plus O(cores * T * W + W * W), whatever the capture's size.
#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <map>
#include <set>
#include <system_error>
#include <utility>

#include "capture/capture.hpp"
#include "common/error.hpp"
#include "common/memory.hpp"
#include "common/parallel.hpp"
#include "engine/ops.hpp"
#include "load/alternatives.hpp"
#include "load/compute.hpp"

namespace dynemb::load {

void TrafficMatrix::add(const TrafficMatrix& o) {
  if (bytes.empty()) *this = TrafficMatrix(o.world_size);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] += o.bytes[i];
}

std::vector<int64_t> TrafficMatrix::sent() const {
  std::vector<int64_t> v(static_cast<size_t>(world_size), 0);
  for (int64_t s = 0; s < world_size; ++s)
    for (int64_t d = 0; d < world_size; ++d)
      if (s != d) v[static_cast<size_t>(s)] += at(s, d);
  return v;
}

std::vector<int64_t> TrafficMatrix::received() const {
  std::vector<int64_t> v(static_cast<size_t>(world_size), 0);
  for (int64_t s = 0; s < world_size; ++s)
    for (int64_t d = 0; d < world_size; ++d)
      if (s != d) v[static_cast<size_t>(d)] += at(s, d);
  return v;
}

int64_t TrafficMatrix::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

double imbalance(const std::vector<int64_t>& per_rank) {
  if (per_rank.empty()) return 0;
  int64_t mx = 0, sum = 0;
  for (int64_t v : per_rank) mx = std::max(mx, v), sum += v;
  if (sum == 0) return 0;
  return static_cast<double>(mx) * static_cast<double>(per_rank.size()) / static_cast<double>(sum);
}

int64_t batch_group_size(int64_t num_batches, int64_t max_columns) {
  if (max_columns < 1 || num_batches <= max_columns) return 1;
  return (num_batches + max_columns - 1) / max_columns;
}

uint64_t batch_memory_estimate(int64_t lengths, int64_t ids, int64_t weights,
                               int64_t other_world_sizes) {
  const uint64_t held = static_cast<uint64_t>(lengths) * 8 + static_cast<uint64_t>(ids) * 8 +
                        static_cast<uint64_t>(weights) * 4;
  // The shared id buffers: every id placed by (table, destination), and its sort's spare.
  const uint64_t scratch = static_cast<uint64_t>(ids) * 16;
  return held * (1 + static_cast<uint64_t>(other_world_sizes)) + scratch;
}

double link_seconds(int64_t bytes, double gbps) {
  return gbps > 0 ? static_cast<double>(bytes) * 8.0 / (gbps * 1e9) : 0.0;
}

double critical_path_seconds(const TrafficMatrix& m, double gbps) {
  const std::vector<int64_t> s = m.sent(), r = m.received();
  int64_t worst = 0;
  for (size_t i = 0; i < s.size(); ++i) worst = std::max({worst, s[i], r[i]});
  return link_seconds(worst, gbps);
}

int index_bytes(IndexType t) {
  return t == IndexType::i32 ? 4 : 8;
}

// What the output dist carries (lib/engine/output_dist.cpp, docs/semantics.md §8): the codec's
// type when comm_precision is not fp32, else the lookup's output dtype.
int comm_element_bytes(const Plan& plan) {
  return dtype_bytes(pooled_reduce_dtype(plan));
}

namespace {

// Sorts [v, v + n) ascending (LSD radix sort over the 11-bit digits in which its keys differ,
// std::sort for short runs): the keys are ids, usually far narrower than 64 bits.
void sort_keys(uint64_t* v, size_t n, std::vector<uint64_t>& tmp) {
  if (n < 512) {
    std::sort(v, v + n);
    return;
  }
  uint64_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ |= v[i] ^ v[0];
  tmp.resize(n);
  constexpr int kBits = 11;
  constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  std::vector<size_t> count(size_t{kMask + 1});
  uint64_t* from = v;
  uint64_t* to = tmp.data();
  for (int shift = 0; shift < 64; shift += kBits) {
    if (((differ >> shift) & kMask) == 0) continue;
    std::fill(count.begin(), count.end(), 0);
    for (size_t i = 0; i < n; ++i) ++count[(from[i] >> shift) & kMask];
    size_t acc = 0;
    for (size_t& c : count) acc += std::exchange(c, acc);
    for (size_t i = 0; i < n; ++i) to[count[(from[i] >> shift) & kMask]++] = from[i];
    std::swap(from, to);
  }
  if (from != v) std::copy(from, from + n, v);
}

}  // namespace

struct PlanAccumulator::Impl {
  LoadOptions opt;
  PlanLoad out;
  int64_t W = 0, T = 0, F = 0, num_batches = 0;
  PlanRouter router;
  std::vector<SpaceSaving> hot;  // [W]
  // The batch being counted, reused batch after batch:
  std::vector<int64_t> id0;                 // [W + 1]: first id of each source rank
  std::shared_ptr<BatchScratch> scratch;    // bucket, keys [N]
  std::vector<int64_t> start;               // [T * W + 1]: where each bucket's keys start
  std::vector<int64_t> ids_sd;              // [W * W]: ids routed from s to d
  std::vector<std::vector<int64_t>> chunk;  // [runs][T * W]: counts, then placement cursors
  std::vector<int64_t> unique;              // [W] of the batch
  int comm_bytes = 0;

  explicit Impl(const Plan& plan) : router(plan) {}
  void route(const std::vector<const Kjt*>& kjts);
  void add(int64_t batch, const std::vector<const Kjt*>& kjts);
  void add_traffic(int64_t batch, const std::vector<const Kjt*>& kjts);
};

PlanAccumulator::PlanAccumulator(PlanSpec spec, int64_t num_batches, const LoadOptions& opt,
                                 std::shared_ptr<BatchScratch> scratch)
    : impl_(std::make_unique<Impl>(spec.plan)) {
  Impl& m = *impl_;
  m.scratch = scratch ? std::move(scratch) : std::make_shared<BatchScratch>();
  m.opt = opt;
  m.out.name = std::move(spec.name);
  m.out.origin = std::move(spec.origin);
  m.out.plan = std::move(spec.plan);
  const Plan& p = m.out.plan;
  m.W = p.world_size;
  m.T = static_cast<int64_t>(p.tables.size());
  m.F = p.num_features();
  m.num_batches = num_batches;
  m.hot.assign(static_cast<size_t>(m.W), SpaceSaving(static_cast<size_t>(opt.hot_row_capacity)));
  m.comm_bytes = comm_element_bytes(p);
  m.out.batch_group = batch_group_size(num_batches, opt.max_batch_columns);
  m.out.total.assign(static_cast<size_t>(m.W), RankLoad{});
  m.out.table_ids.assign(static_cast<size_t>(m.T * m.W), 0);
  m.out.input_dist = TrafficMatrix(m.W);
  m.out.output_dist = TrafficMatrix(m.W);
}

PlanAccumulator::~PlanAccumulator() = default;
PlanAccumulator::PlanAccumulator(PlanAccumulator&&) noexcept = default;

void PlanAccumulator::add_batch(int64_t batch, const std::vector<const Kjt*>& kjts) {
  if (static_cast<int64_t>(kjts.size()) != impl_->W)
    throw Error(fmt::format("load: plan '{}' has world size {} but batch {} has {} KJTs",
                            impl_->out.name, impl_->W, batch, kjts.size()));
  impl_->add(batch, kjts);
}

void PlanAccumulator::Impl::route(const std::vector<const Kjt*>& kjts) {
  id0.assign(static_cast<size_t>(W + 1), 0);
  for (int64_t s = 0; s < W; ++s) id0[s + 1] = id0[s] + kjts[static_cast<size_t>(s)]->num_ids();
  const int64_t N = id0[W], TW = T * W;
  std::vector<uint32_t>& bucket = scratch->bucket;
  std::vector<uint64_t>& keys = scratch->keys;
  bucket.resize(static_cast<size_t>(N));
  keys.resize(static_cast<size_t>(N));
  ids_sd.assign(static_cast<size_t>(W * W), 0);
  const int64_t runs = std::max<int64_t>(1, std::min<int64_t>(hardware_threads(), W));
  chunk.resize(static_cast<size_t>(runs));
  for (auto& c : chunk) c.assign(static_cast<size_t>(TW), 0);
  // Sources [W * c / runs, W * (c + 1) / runs) are run c's. route() does not throw.
  run_on_pool(runs, [&](int64_t c) {
    std::vector<int64_t>& cnt = chunk[static_cast<size_t>(c)];
    for (int64_t s = W * c / runs; s < W * (c + 1) / runs; ++s) {
      const Kjt& kjt = *kjts[static_cast<size_t>(s)];
      int64_t i = 0;
      for (int64_t f = 0; f < kjt.num_features && f < F; ++f) {
        const int64_t j0 = kjt.bag_begin(f), nb = kjt.batch_size(f);
        int64_t n = 0;
        for (int64_t j = j0; j < j0 + nb; ++j) n += kjt.lengths[static_cast<size_t>(j)];
        const int64_t base = int64_t{out.plan.features[static_cast<size_t>(f)].table} * W;
        for (const int64_t end = i + n; i < end; ++i) {
          const int64_t d =
              router.route(f, kjt.values[static_cast<size_t>(i)], kjt.values_type).dest;
          bucket[static_cast<size_t>(id0[s] + i)] = static_cast<uint32_t>(base + d);
          ++cnt[static_cast<size_t>(base + d)];
          ++ids_sd[static_cast<size_t>(s * W + d)];
        }
      }
    }
  });
  // Bucket b's keys start after every earlier bucket's, run c's after earlier runs' in b.
  start.assign(static_cast<size_t>(TW + 1), 0);
  for (int64_t b = 0; b < TW; ++b) {
    int64_t at = start[b];
    for (auto& c : chunk) at += std::exchange(c[static_cast<size_t>(b)], at);
    start[b + 1] = at;
  }
  run_on_pool(runs, [&](int64_t c) {
    std::vector<int64_t>& next = chunk[static_cast<size_t>(c)];
    for (int64_t s = W * c / runs; s < W * (c + 1) / runs; ++s) {
      const Kjt& kjt = *kjts[static_cast<size_t>(s)];
      for (int64_t i = 0; i < id0[s + 1] - id0[s]; ++i)
        keys[static_cast<size_t>(next[bucket[static_cast<size_t>(id0[s] + i)]]++)] =
            index_unsigned(kjt.values[static_cast<size_t>(i)], kjt.values_type);
    }
  });
}

void PlanAccumulator::Impl::add(int64_t batch, const std::vector<const Kjt*>& kjts) {
  route(kjts);
  for (int64_t b = 0; b < T * W; ++b)
    out.table_ids[static_cast<size_t>(b)] += start[b + 1] - start[b];
  // Distinct rows and the hot-row summaries, one destination rank per core.
  unique.assign(static_cast<size_t>(W), 0);
  parallel_for(
      hardware_threads(), W,
      [&](int64_t d0, int64_t d1) {
        std::vector<uint64_t> tmp;
        std::vector<CountedRow> rows;  // the batch's distinct rows of d, by (table, row)
        for (int64_t d = d0; d < d1; ++d) {
          rows.clear();
          for (int64_t t = 0; t < T; ++t) {
            // Bucket (t, d)'s keys, sorted where they lie (no other core touches them).
            const int64_t b = t * W + d;
            uint64_t* k = scratch->keys.data() + start[b];
            const size_t n = static_cast<size_t>(start[b + 1] - start[b]);
            sort_keys(k, n, tmp);
            for (size_t i = 0; i < n;) {
              size_t j = i + 1;
              while (j < n && k[j] == k[i]) ++j;
              rows.push_back({static_cast<int>(t), k[i], static_cast<int64_t>(j - i), 0});
              i = j;
            }
          }
          unique[static_cast<size_t>(d)] = static_cast<int64_t>(rows.size());
          hot[static_cast<size_t>(d)].add_batch(rows);
        }
      },
      1);
  add_traffic(batch, kjts);
}

// Both dists' bytes of one batch (docs/load-report.md), its column and its estimates.
void PlanAccumulator::Impl::add_traffic(int64_t batch, const std::vector<const Kjt*>& kjts) {
  const Plan& plan = out.plan;
  const bool sequence = plan.module == ModuleKind::sequence;
  TrafficMatrix in(W), outd(W);
  std::vector<int64_t> ids_to(static_cast<size_t>(W), 0);
  for (int64_t s = 0; s < W; ++s) {
    const Kjt& k = *kjts[static_cast<size_t>(s)];
    // Every destination gets a length for every bag of s; sequence plans send VBE KJTs padded
    // to max_f B_f (derive_input_dist), pooled ones send their strides too.
    const int64_t bags = sequence && k.is_vbe() ? F * k.stride() : k.num_bags();
    const bool strides = !sequence && k.is_vbe();
    const int64_t lsz = index_bytes(k.lengths_type), vsz = index_bytes(k.values_type);
    int64_t pooled_elems = 0;  // sum_f B_{s,f} * D_f
    if (!sequence)
      for (int64_t f = 0; f < F; ++f) pooled_elems += k.batch_size(f) * plan.features[f].dim;
    for (int64_t d = 0; d < W; ++d) {
      const int64_t ids = ids_sd[static_cast<size_t>(s * W + d)];
      ids_to[static_cast<size_t>(d)] += ids;
      int64_t b = bags * lsz + ids * vsz;
      if (k.weighted) b += ids * 4;  // float32 weights
      if (strides) b += F * 8;       // torch.tensor(stride_per_key()): int64
      in.add(s, d, b);
      // Results travel back from d to s.
      outd.add(d, s, sequence ? ids * plan.seq_dim() * comm_bytes : pooled_elems * comm_bytes);
    }
  }
  const int64_t g = out.batch_group;
  const size_t col = static_cast<size_t>(batch / g);
  while (out.batches.size() <= col) {
    BatchLoad bl;
    bl.batch = static_cast<int64_t>(out.batches.size()) * g;
    bl.ranks.assign(static_cast<size_t>(W), RankLoad{});
    bl.input_received.assign(static_cast<size_t>(W), 0);
    bl.output_received.assign(static_cast<size_t>(W), 0);
    out.batches.push_back(std::move(bl));
  }
  BatchLoad& bl = out.batches[col];
  const std::vector<int64_t> in_recv = in.received(), out_recv = outd.received();
  for (int64_t r = 0; r < W; ++r) {
    const size_t i = static_cast<size_t>(r);
    bl.ranks[i].ids += ids_to[i];
    bl.ranks[i].unique_rows += unique[i];
    bl.input_received[i] += in_recv[i];
    bl.output_received[i] += out_recv[i];
    out.total[i].ids += ids_to[i];
    out.total[i].unique_rows += unique[i];
  }
  const double tin = critical_path_seconds(in, opt.link_gbps);
  const double tout = critical_path_seconds(outd, opt.link_gbps);
  bl.input_dist_seconds += tin;
  bl.output_dist_seconds += tout;
  out.input_dist_seconds += tin;
  out.output_dist_seconds += tout;
  out.input_dist.add(in);
  out.output_dist.add(outd);
}

PlanLoad PlanAccumulator::finish() {
  Impl& m = *impl_;
  int64_t h = 0;
  for (int64_t r = 1; r < m.W; ++r)
    if (m.out.total[static_cast<size_t>(r)].ids > m.out.total[static_cast<size_t>(h)].ids) h = r;
  m.out.hottest_rank = h;
  m.out.hottest_rows.clear();
  if (m.W > 0)
    for (const CountedRow& c : m.hot[static_cast<size_t>(h)].top(
             static_cast<size_t>(std::max<int64_t>(0, m.opt.top_rows))))
      m.out.hottest_rows.push_back({c.table, static_cast<int64_t>(c.row), c.count, c.overcount});
  return std::move(m.out);
}

namespace {

// A batch re-split for another world size, once per batch and size, for every plan of it;
// its trouble names the plan and the batch.
std::vector<Kjt> resplit_for(const std::vector<const Kjt*>& kjts, int64_t world_size,
                             const std::string& plan, int64_t batch) {
  try {
    return resplit_batch(kjts, world_size);
  } catch (const UsageError& e) {
    throw UsageError(
        fmt::format("plan '{}' (world size {}), batch {}: {}", plan, world_size, batch, e.what()));
  }
}

}  // namespace

LoadReport compute_load(const CaptureReader& reader, const Plan& read_plan,
                        std::vector<PlanSpec> plans, const LoadOptions& opt,
                        const std::function<void(const std::vector<const Kjt*>&)>& observe,
                        const std::function<void(const LoadProgress&)>& progress) {
  LoadReport rep;
  rep.capture = reader.path();
  rep.capture_world_size = reader.world_size();
  rep.num_batches = reader.num_batches();
  rep.link_gbps = opt.link_gbps;
  rep.hot_row_capacity = opt.hot_row_capacity;
  std::vector<int64_t> sizes;
  std::vector<std::string> names;
  std::vector<PlanAccumulator> acc;
  const auto scratch = std::make_shared<BatchScratch>();  // the plans take turns
  for (PlanSpec& p : plans) {
    sizes.push_back(p.plan.world_size);
    names.push_back(p.name);
    acc.emplace_back(std::move(p), rep.num_batches, opt, scratch);
  }
  ReadParts kjt_only;
  kjt_only.ctx = kjt_only.local_embs = kjt_only.output = kjt_only.module_output = false;
  kjt_only.float_data = false;
  LoadProgress lp;
  lp.batches_total = rep.num_batches;
  // Batch k + 1 is read on another thread while batch k is counted (libhdf5 is called from
  // one thread at a time: the counting never calls it). Where no thread can start, in turn.
  auto read = [&](int64_t k) {
    quiet_hdf5_errors();
    return reader.read_batch(read_plan, k, kjt_only);
  };
  auto start = [&](int64_t k) {
    try {
      return std::async(std::launch::async, read, k);
    } catch (const std::system_error&) {
      return std::async(std::launch::deferred, read, k);
    }
  };
  // The memory budget, checked per batch from its datasets' extents before it is read.
  std::set<int64_t> other_sizes;
  for (int64_t w : sizes)
    if (w != rep.capture_world_size) other_sizes.insert(w);
  const uint64_t budget = opt.max_memory > 0 ? opt.max_memory : usable_memory_bytes();
  auto need = [&](int64_t k) {
    int64_t lengths = 0, ids = 0, weights = 0;
    for (const DatasetStat& d : reader.dataset_stats(k)) {
      const size_t slash = d.path.rfind('/');
      const std::string leaf = d.path.substr(slash + 1);
      const int64_t n = d.dims.empty() ? 1 : shape_numel(d.dims);
      if (d.path.find("/ctx/") != std::string::npos) continue;
      if (leaf == "lengths")
        lengths += n;
      else if (leaf == "values")
        ids += n;
      else if (leaf == "weights")
        weights += n;
    }
    return batch_memory_estimate(lengths, ids, weights, static_cast<int64_t>(other_sizes.size()));
  };
  auto check_fits = [&](int64_t k, uint64_t bytes) {
    if (budget > 0 && bytes > budget)
      throw Error(fmt::format(
          "{}: batch {}: counting its KJTs needs about {}, more than the {} this run may use "
          "({}); fewer alternatives of other world sizes need less",
          reader.path(), k, human_bytes(static_cast<double>(bytes)),
          human_bytes(static_cast<double>(budget)),
          opt.max_memory > 0 ? "--max-memory"
                             : "the machine's usable memory, DYNEMB_MEMORY_LIMIT"));
  };
  std::future<Batch> next;
  uint64_t now = 0;
  if (rep.num_batches > 0) {
    now = need(0);
    check_fits(0, now);
    next = start(0);
  }
  for (int64_t k = 0; k < rep.num_batches; ++k) {
    const Batch batch = next.get();
    if (k + 1 < rep.num_batches) {
      const uint64_t following = need(k + 1);
      check_fits(k + 1, following);
      // Read ahead only when this batch and the next fit together.
      next = budget == 0 || now + following <= budget
                 ? start(k + 1)
                 : std::async(std::launch::deferred, read, k + 1);
      now = following;
    }
    std::vector<const Kjt*> kjts;
    for (const RankBatch& rb : batch.ranks) {
      kjts.push_back(&rb.kjt);
      lp.bytes_done += static_cast<double>(rb.kjt.num_bags() * index_bytes(rb.kjt.lengths_type) +
                                           rb.kjt.num_ids() * index_bytes(rb.kjt.values_type) +
                                           (rb.kjt.weighted ? rb.kjt.num_ids() * 4 : 0));
    }
    if (observe) observe(kjts);
    std::map<int64_t, std::vector<Kjt>> resplit;
    for (size_t i = 0; i < acc.size(); ++i) {
      if (sizes[i] == rep.capture_world_size) {
        acc[i].add_batch(k, kjts);
        continue;
      }
      auto it = resplit.find(sizes[i]);
      if (it == resplit.end())
        it = resplit.emplace(sizes[i], resplit_for(kjts, sizes[i], names[i], k)).first;
      std::vector<const Kjt*> ptrs;
      for (const Kjt& kj : it->second) ptrs.push_back(&kj);
      acc[i].add_batch(k, ptrs);
    }
    lp.batches_done = k + 1;
    if (progress) progress(lp);
  }
  for (PlanAccumulator& a : acc) rep.plans.push_back(a.finish());
  return rep;
}

}  // namespace dynemb::load
