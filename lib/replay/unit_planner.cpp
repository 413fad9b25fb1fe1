#include "replay/unit_planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "common/error.hpp"
#include "common/memory.hpp"
#include "common/test_hooks.hpp"
#include "engine/dist_checks.hpp"
#include "engine/memory_estimate.hpp"
#include "engine/ops.hpp"
#include "replay/column_slice.hpp"

namespace dynemb::replay_detail {

int host_processes(const ReplayOptions& opt) {
  return opt.team ? std::max(1, opt.team->host_size()) : 1;
}

uint64_t memory_budget(const ReplayOptions& opt) {
  const uint64_t host = opt.max_memory > 0 ? opt.max_memory : usable_memory_bytes();
  return host / uint64_t(host_processes(opt));
}

namespace {

// The float tensors of a sliced batch (lookups, an output, its reference and golden slice) are
// held to this much, whatever the budget: wider slices would only save passes over the ids.
constexpr double kSliceBytes = 512.0 * (1 << 20);

}  // namespace

Sizing size_up(const RunContext& rc, const CaptureReader& reader, int64_t first_batch,
               bool replan) {
  const ReplayOptions& opt_ = rc.opt;
  const Plan& plan_ = rc.plan;
  Sizing sz;
  const uint64_t have = memory_budget(opt_);
  const int64_t k = first_batch;
  int64_t ids = 0, bags = 0;
  double captured_floats = 0;  // local_embs and output as the replay holds them (float32)
  bool whole_only = !opt_.write_output.empty() || opt_.write_output_file;
  int64_t local_ranks = 0;  // ranks with local_embs
  bool module_outputs = false;
  for (const DatasetStat& d : reader.dataset_stats(k)) {
    const auto ends = [&](const std::string& tail) {
      return d.path.size() >= tail.size() &&
             d.path.compare(d.path.size() - tail.size(), tail.size(), tail) == 0;
    };
    int64_t numel = 1;
    for (int64_t x : d.dims) numel *= x;
    if (ends("/local_embs") || ends("/output")) captured_floats += 4.0 * double(numel);
    whole_only |= ends("/local_embs") || ends("/module_output");  // slice_width's rules
    local_ranks += ends("/local_embs");
    module_outputs |= ends("/module_output");
    if (d.dims.size() != 1) continue;
    if (ends("/values")) ids += d.dims[0];
    if (ends("/lengths")) bags += d.dims[0];
  }
  const int64_t W = plan_.world_size, F = std::max<int64_t>(1, plan_.num_features());
  const int64_t b = bags / std::max<int64_t>(1, W * F);
  const double len = bags > 0 ? double(ids) / double(bags) : 0;
  const MemoryEstimate m = estimate_batch_memory(plan_, b, len);
  // The derived context and lookup, the replayed outputs, and what the capture holds.
  const double fixed = m.ids + 2 * m.context + captured_floats;
  const double need = fixed + m.lookup + m.output;
  // One destination at a time (by_destination.cpp) when every rank's lookup is captured and
  // each output can be checked on its own: no --write-output (it copies whole batches), no
  // re-sharding (--plan), no module_output and no MEAN diagnosis of a pooled lookup (both take
  // whole tensors). It holds the ids and contexts, and about two destinations' share of the
  // captured tensors (d's blocks, golden output, replayed output and reference).
  // The test hook DYNEMB_BY_DESTINATION=off keeps every batch whole (tests compare the two).
  sz.by_destination = opt_.write_output.empty() && !opt_.write_output_file && !replan &&
                      local_ranks == plan_.world_size && !module_outputs &&
                      !(plan_.module == ModuleKind::pooled && plan_.any_mean) &&
                      test_hooks::by_destination() != test_hooks::ByDestination::off;
  // Over column slices: the W lookups, and one rank's output, reference and golden slice at a
  // time, per column of the C.
  const int64_t C = std::max<int64_t>(1, embedding_columns(plan_));
  const double per_column = (m.lookup + 3 * m.output / double(std::max<int64_t>(1, W))) / double(C);
  const double room = std::min(kSliceBytes, double(have > 0 ? have : UINT64_MAX) - fixed);
  int64_t& slice_cols = sz.slice_cols;
  if (!whole_only && (need > fixed + kSliceBytes || (have > 0 && need > double(have))))
    slice_cols = std::clamp<int64_t>(int64_t(room / std::max(1.0, per_column)), 1, C);
  // The test hook DYNEMB_SLICE_COLUMNS=n: slices of at most n columns (tests compare sliced and
  // whole runs).
  if (const std::optional<int64_t> n = test_hooks::slice_columns(); n && !whole_only)
    slice_cols = std::min<int64_t>(slice_cols > 0 ? slice_cols : C, *n);
  // All columns in one slice still hold less than the whole batch (one output and reference
  // at a time, not W): a batch that does not fit whole runs as that one slice.
  if (slice_cols >= C) slice_cols = have > 0 && need > double(have) ? C : 0;
  if (slice_cols > 0)
    sz.kept_per_column =
        (m.lookup + m.output + 2 * m.output / double(std::max<int64_t>(1, W))) / double(C);
  const double sliced = fixed + double(slice_cols) * per_column;
  sz.batch_bytes = uint64_t(slice_cols > 0 ? sliced : need);
  if (sz.by_destination)
    sz.batch_bytes = uint64_t(m.ids + 2 * m.context + 2 * captured_floats / double(W));
  const int sharing = host_processes(opt_);
  const std::string limit = fmt::format(
      "{} {}{}", human_bytes(double(have)),
      opt_.max_memory > 0 ? "--max-memory allows"
                          : "this machine has (physical memory, cgroup limit or "
                            "DYNEMB_MEMORY_LIMIT)",
      sharing > 1 ? fmt::format(" for each of the {} processes on this host", sharing) : "");
  if (have == 0) return sz;
  if (sz.by_destination && double(sz.batch_bytes) > double(have))
    throw Error(fmt::format(
        "{}: replaying batch {} needs about {} even one destination rank at a time, more than "
        "the {}; W = {}, ids and contexts {}, captured local_embs and output {}",
        opt_.capture_path, k, human_bytes(double(sz.batch_bytes)), limit, W,
        human_bytes(m.ids + 2 * m.context), human_bytes(captured_floats)));
  if (sz.by_destination) return sz;
  if (slice_cols > 0 && sliced > double(have))
    throw Error(fmt::format(
        "{}: replaying batch {} needs about {} even one embedding column at a time, more than the "
        "{}; W = {}, ids and contexts {}, captured output {}, one column of the W lookups, an "
        "output and its reference {}; {}",
        opt_.capture_path, k, human_bytes(sliced), limit, W, human_bytes(m.ids + 2 * m.context),
        human_bytes(captured_floats), human_bytes(per_column), m.summary()));
  if (slice_cols == 0 && need > double(have))
    throw Error(
        fmt::format("{}: replaying batch {} needs about {}, more than the {}; W = {}, captured "
                    "local_embs and output {}; {}",
                    opt_.capture_path, k, human_bytes(need), limit, W, human_bytes(captured_floats),
                    m.summary()));
  return sz;
}

// How this batch is cut into column slices (width 0: whole). Slices pay off when the output
// dist runs on lookups derived from the embedding source (all W of them in memory at once
// otherwise), and are taken only where the sliced checks are exactly the whole ones and no whole
// output must be kept: no --write-output, no captured local_embs (their lookup check and the
// dist over captured rows stay whole), no module_output (the mean-pooling step and its check
// take whole outputs), no golden output of a MEAN pooled plan (its diagnosis divides whole
// outputs), and for a variable batch the contexts' batch_size_per_rank_per_feature as derived
// (the reduce-scatter's chunks then hold whole bags, so a column of each is reduced on its own;
// a captured context that cuts bags elsewhere runs whole, to give the whole batch's result).
ColumnSlices slice_width(const RunContext& rc, const BatchState& st, const Sizing& sizing) {
  const Plan& plan = rc.plan;
  const int64_t C = embedding_columns(plan);
  if (sizing.slice_cols <= 0 || !rc.source || rc.writing) return {};
  for (int64_t r = 0; r < st.W; ++r) {
    const RankBatch& rb = st.batch().ranks[size_t(r)];
    if (rb.local_embs || rb.module_output) return {};
    if (rb.output && rc.pooled_mean()) return {};
  }
  if (plan.module == ModuleKind::pooled) {
    bool vbe = st.der.variable_batch || rc.pooled_dist->latched_variable_batch().value_or(false);
    for (const ShardingContext* c : st.used_ptr)
      vbe |= c->variable_batch_per_feature.value_or(false);
    for (int64_t r = 0; vbe && r < st.W; ++r)
      if (st.used_ptr[size_t(r)]->batch_size_per_rank_per_feature !=
          st.der.ranks[size_t(r)].ctx.batch_size_per_rank_per_feature)
        return {};
  }
  // A device backend keeps a slice's lookups and outputs on its device (Place::kept), so the
  // host holds none of their floats: slices as wide as half its free memory holds, the first
  // as wide as the rest (a first slice of one column keeps a host peak down, the bucketize
  // outputs beside the first lookups, which device-resident lookups do not add to). Each slice
  // walks the batch's ids again, so fewer, wider slices are what make it fast.
  // Under a launcher the team's processes on this host may share the one device (each sees the
  // same free memory at once): each plans for its share.
  const uint64_t device = rc.backend.get().device_memory_for_kept();
  const int processes = host_processes(rc.opt);
  if (device > 0 && sizing.kept_per_column > 0) {
    const double share = 0.5 * double(device) / double(processes);
    int64_t w = std::clamp<int64_t>(int64_t(share / sizing.kept_per_column), 1, C);
    if (const std::optional<int64_t> n = test_hooks::slice_columns()) w = std::min(w, *n);
    return {w, w};
  }
  return {1, sizing.slice_cols};
}

namespace {

// Units of a pooled destination hold about this much of its blocks (all W senders' rows).
constexpr double kUnitBytes = 64.0 * (1 << 20);

// The shape of destination d's output as the output dist makes it from these contexts.
std::vector<int64_t> destination_shape(const Plan& plan, const BatchState& st, int64_t d,
                                       const std::optional<PooledDistCheck>& pooled,
                                       bool variable_batch) {
  if (!pooled) {
    const ShardingContext& c = *st.used_ptr[size_t(d)];
    const int64_t n = c.unbucketize_permute ? int64_t(c.unbucketize_permute->size()) : 0;
    return {n, plan.seq_dim()};
  }
  const int64_t len = pooled->chunk_len[size_t(d)];
  if (variable_batch) return {len};
  return {len / std::max<int64_t>(1, plan.sum_dim), plan.sum_dim};
}

}  // namespace

std::optional<DestinationCut> cut_destinations(RunContext& rc, BatchState& st) {
  const Plan& plan = rc.plan;
  const int64_t W = st.W;
  if (st.ctx_bad) return std::nullopt;
  for (int64_t s = 0; s < W; ++s)  // every block is a lookup of bags: the shapes must be its
    if (!st.cap_local[size_t(s)] ||
        st.cap_local[size_t(s)]->shape !=
            lookup_output_shape(plan, st.der.ranks[size_t(s)].lookup_kjt))
      return std::nullopt;
  DestinationCut cut;
  std::optional<SequenceDistCheck> seq;
  std::optional<PooledDistCheck> pooled;
  try {  // the dist's own checks on the whole shapes (no data needed)
    if (rc.seq_dist) {
      seq = check_sequence_dist(plan, st.cap_local, st.used_ptr);
    } else {
      cut.variable_batch = rc.pooled_dist->check(st.k, refs(st.cap_local), st.used_ptr);
      pooled = check_pooled_dist(plan, cut.variable_batch, st.cap_local, st.used_ptr);
    }
  } catch (const OutputDistFailure&) {
    return std::nullopt;  // the whole batch's dist says it, after its lookup checks
  }
  for (int64_t d = 0; d < W; ++d) {
    cut.shapes.push_back(destination_shape(plan, st, d, pooled, cut.variable_batch));
    const EmbTensor* golden = st.golden[size_t(d)];
    if (golden && golden->shape != cut.shapes.back())
      return std::nullopt;  // the whole batch's check says how the shapes differ
  }
  cut.where.assign(size_t(W), {});
  for (int64_t s = 0; s < W; ++s) {
    if (!pooled) {
      std::optional<std::vector<DestBlock>> b =
          sequence_blocks(seq->senders[size_t(s)], plan.seq_dim());
      if (!b) return std::nullopt;
      cut.where[size_t(s)] = std::move(*b);
      continue;
    }
    for (int64_t d = 0; d < W; ++d)
      cut.where[size_t(s)].push_back(pooled_block(*pooled, s, d, plan.sum_dim, cut.variable_batch));
  }
  int64_t step = std::max<int64_t>(1, int64_t(kUnitBytes / (4.0 * double(W * plan.sum_dim))));
  if (const std::optional<int64_t> n = test_hooks::destination_rows()) step = *n;
  for (int64_t d = 0; d < W; ++d) {
    Unit u;
    u.cut = Unit::Cut::destination;
    u.d = d;
    if (!pooled || cut.variable_batch || plan.sum_dim == 0) {
      cut.units.push_back(u);
      continue;
    }
    u.rows = true;
    const int64_t B = pooled->chunk_len[size_t(d)] / plan.sum_dim;
    if (B == 0) cut.units.push_back(u);
    for (int64_t r0 = 0; r0 < B; r0 += step) {
      u.r0 = r0;
      u.r1 = std::min(B, r0 + step);
      cut.units.push_back(u);
    }
  }
  return cut;
}

}  // namespace dynemb::replay_detail
