// One batch of captured lookups, one destination rank at a time (replayer.hpp, dest_blocks.hpp):
// only the rows a destination's output is made of are read, while it is checked.
#include <algorithm>
#include <mutex>

#include "capture/h5util.hpp"
#include "engine/dist_checks.hpp"
#include "engine/ops.hpp"
#include "replay/replayer.hpp"
#include "replay/spare_rows.hpp"

namespace dynemb::replay_detail {

namespace {

// fn(arg) on another thread (`ahead`), or deferred to the get() of the future: when not
// ahead, or when no thread can be started (the work then runs in turn).
template <class Fn, class Arg>
auto read_ahead_task(Fn& fn, Arg arg, bool ahead) -> std::future<decltype(fn(arg))> {
  try {
    if (ahead) return std::async(std::launch::async, [&fn, arg] { return fn(arg); });
    return std::async(std::launch::deferred, [&fn, arg] { return fn(arg); });
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, [&fn, arg] { return fn(arg); });
  }
}

// Every row of a captured tensor as the ranges of CaptureReader::read_rows.
std::vector<std::pair<int64_t, int64_t>> whole_rows(const EmbTensor& t) {
  if (t.rows() == 0) return {};
  return {{0, t.rows()}};
}

}  // namespace

// Batch k one destination rank at a time (dest_blocks.hpp), its checks emitted only once the
// whole batch went through; false, with nothing of it counted (checks, warnings, progress),
// when the batch must run whole: a rank without local_embs or with a module_output, --ctx
// derived, a context that differs from the derived one (the blocks then are not the lookup's
// bags), or trouble of any kind (the whole run reports it in its own words).
bool Replayer::replay_by_destination(const CaptureReader& reader, int64_t k) {
  clock_.enter("read");
  std::optional<Batch> batch;
  if (shapes_ahead_.valid()) {  // read while the batch before was checked (nullopt: failed)
    std::optional<Batch> ahead = shapes_ahead_.get();
    if (shapes_ahead_k_ == k) batch = std::move(ahead);
  }
  if (!batch) {
    ReadParts shapes;  // the KJTs and contexts; local_embs and outputs checked, not read
    shapes.float_data = false;
    try {
      batch = reader.read_batch(read_plan(), k, shapes);
    } catch (const std::exception&) {  // Error, bad_alloc: the whole read says what and where
      return false;
    }
  }
  for (const RankBatch& rb : batch->ranks)
    if (!rb.local_embs || rb.module_output) return false;
  begin(k, *batch);
  if (!use_captured_) return false;
  const size_t warned = rep_.warnings.size();
  const ReplayProgress progress = progress_;
  const int64_t ranks_done = ranks_done_in_batch_;
  deferring_ = true;
  bool ok = false;
  try {
    BatchState st(k, *batch, plan_.world_size);
    ok = stream_batch(reader, st);
  } catch (const std::exception&) {
    ok = false;
  }
  deferring_ = false;
  std::vector<CheckResult> checks = std::move(pending_);
  pending_.clear();
  if (!ok) {
    rep_.warnings.resize(warned);
    progress_ = progress;
    ranks_done_in_batch_ = ranks_done;
    return false;
  }
  for (CheckResult& c : checks) emit(std::move(c));
  clock_.enter("replay");
  return true;
}

void Replayer::start_shapes_ahead(const CaptureReader& reader) {
  if (next_by_destination_ < 0 || shapes_ahead_.valid()) return;
  const int64_t k = next_by_destination_;
  try {
    shapes_ahead_ = std::async(std::launch::async, [this, &reader, k]() -> std::optional<Batch> {
      h5::quiet();  // libhdf5's error printing is per thread: errors are reported, not dumped
      ReadParts shapes;
      shapes.float_data = false;
      try {
        return reader.read_batch(read_plan(), k, shapes);
      } catch (...) {  // Error, bad_alloc: read again, and reported, on the replay's thread
        return std::nullopt;
      }
    });
    shapes_ahead_k_ = k;
  } catch (const std::system_error&) {  // no thread to be had: read in turn
  }
}

// A unit of a batch replayed by destination: destination d's whole output, or rows [r0, r1) of
// it (pooled, not variable-batch: the senders' chunks are summed row by row, so a few rows at a
// time keep a unit's blocks within kUnitBytes whatever the batch size).
struct DestUnit {
  int64_t d = 0;
  bool rows = false;  // false: the whole destination
  int64_t r0 = 0, r1 = 0;
};

namespace {

constexpr double kUnitBytes = 64.0 * (1 << 20);

// The block of sender s in unit u.
DestBlock unit_block(const std::vector<std::vector<DestBlock>>& where, int64_t s,
                     const DestUnit& u) {
  const DestBlock& b = where[size_t(s)][size_t(u.d)];
  return u.rows ? block_rows(b, u.r0, u.r1) : b;
}

// What a unit's checks read from the capture: the block of every sender and the unit's rows
// of the golden output (when captured).
struct DestRows {
  std::vector<EmbTensor> blocks;  // pooled: [W] the senders' chunks
  EmbTensor recv;                 // sequence: what d receives, the senders' blocks in rank order
  std::vector<int64_t> recv_off;  // sequence: [W + 1] where each block starts in recv (elements)
  std::optional<EmbTensor> golden;

  // Sender s's block: its first element.
  const float* block(size_t s) const {
    return blocks.empty() ? recv.data.data() + recv_off[s] : blocks[s].data.data();
  }
};

// Unit u's rows, read on the calling thread (the only one calling libhdf5 meanwhile).
DestRows read_unit(const CaptureReader& reader, int64_t k, const DestUnit& u, bool sequence,
                   const std::vector<std::vector<DestBlock>>& where,
                   const std::vector<const EmbTensor*>& local, const EmbTensor* golden,
                   SpareRows& spare) {
  const size_t W = where.size();
  std::vector<DestBlock> b;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges(W);
  for (size_t s = 0; s < W; ++s) {
    b.push_back(unit_block(where, int64_t(s), u));
    ranges[s] = b.back().ranges;
  }
  const DType dt = local[0]->dtype;  // the plan's data_type on every rank (read_batch checks)
  DestRows out;
  if (sequence) {  // one buffer: the blocks are what d receives, in rank order
    size_t recv = 0;
    for (const DestBlock& bs : b) recv += size_t(bs.numel());
    out.recv.dtype = dt;
    out.recv.data =
        reader.read_rows_concat(k, "local_embs", dt, ranges, out.recv_off, spare.take_one(recv));
    out.recv.shape = {out.recv_off.back() / std::max<int64_t>(1, b[0].row_elems), b[0].row_elems};
  } else {
    std::vector<size_t> need;
    for (const DestBlock& bs : b) need.push_back(size_t(bs.numel()));
    std::vector<std::vector<float>> rows =
        reader.read_rows(k, "local_embs", dt, ranges, spare.take(need));
    for (size_t s = 0; s < W; ++s) out.blocks.push_back({dt, b[s].shape, std::move(rows[s])});
  }
  if (!golden) return out;
  if (!u.rows) {
    out.golden = EmbTensor{golden->dtype, golden->shape,
                           reader.read_rows(k, u.d, "output", golden->dtype, whole_rows(*golden),
                                            spare.take_one(size_t(golden->numel())))};
  } else {
    std::vector<std::pair<int64_t, int64_t>> gr;
    if (u.r1 > u.r0) gr.emplace_back(u.r0, u.r1);
    out.golden =
        EmbTensor{golden->dtype,
                  {u.r1 - u.r0, golden->cols()},
                  reader.read_rows(k, u.d, "output", golden->dtype, gr,
                                   spare.take_one(size_t((u.r1 - u.r0) * golden->cols())))};
  }
  return out;
}

}  // namespace

// Where every unit's blocks lie ([s][d]) and the units, in destination order; false when the
// sequence dist's send order is not increasing (the batch then runs whole).
bool Replayer::plan_units(BatchState& st, std::vector<std::vector<DestBlock>>& where,
                          std::vector<DestUnit>& units, bool& variable_batch) {
  const int64_t W = st.W;
  std::optional<SequenceDistCheck> seq;
  std::optional<PooledDistCheck> pooled;
  variable_batch = false;
  if (seq_dist_) {
    seq = check_sequence_dist(plan_, st.cap_local, st.used_ptr);
  } else {
    variable_batch = pooled_dist_->check(st.k, st.cap_local, st.used_ptr);
    pooled = check_pooled_dist(plan_, variable_batch, st.cap_local, st.used_ptr);
  }
  where.assign(size_t(W), {});
  for (int64_t s = 0; s < W; ++s)
    for (int64_t d = 0; d < W; ++d) {
      if (pooled) {
        where[size_t(s)].push_back(pooled_block(*pooled, s, d, plan_.sum_dim, variable_batch));
        continue;
      }
      std::optional<DestBlock> b = sequence_block(seq->senders[size_t(s)], d, plan_.seq_dim());
      if (!b) return false;
      where[size_t(s)].push_back(std::move(*b));
    }
  int64_t step = std::max<int64_t>(1, int64_t(kUnitBytes / (4.0 * double(W * plan_.sum_dim))));
  if (const char* e = std::getenv("DYNEMB_DESTINATION_ROWS"); e && std::atoll(e) > 0)
    step = std::atoll(e);  // test hook: units of at most this many rows
  for (int64_t d = 0; d < W; ++d) {
    if (!pooled || variable_batch || plan_.sum_dim == 0) {
      units.push_back({d});
      continue;
    }
    const int64_t B = pooled->chunk_len[size_t(d)] / plan_.sum_dim;
    if (B == 0) units.push_back({d, true, 0, 0});
    for (int64_t r0 = 0; r0 < B; r0 += step) units.push_back({d, true, r0, std::min(B, r0 + step)});
  }
  return true;
}

// Unit u's output checks, merged into d's: `out` (the unit's rows of d's output, as the dist
// handed it to its sink; held by the backend when `held`) against the unit's golden rows and
// against the unsharded reference of its samples, each compared where the backend has them.
// False when the unit cannot be checked this way (the batch then runs whole).
bool Replayer::check_unit_output(BatchState& st, const DestUnit& u, const EmbTensor& out,
                                 const std::optional<EmbTensor>& golden, const TileCompare& how,
                                 bool held, DestChecks& dest) {
  const int64_t d = u.d, maxm = how.max_report;
  const int64_t off = u.rows ? u.r0 * out.cols() : 0;  // out's first element in d's output
  const auto to_whole = [off](int64_t e) { return off + e; };
  // The dist's output of d: rank d's of the pooled dist, the one rank's of the sequence
  // destination's dist (destination_output).
  const int held_rank = held ? int(seq_dist_ ? 0 : d) : -1;
  if (!held && int64_t(out.data.size()) != out.numel()) return false;
  if (golden) {
    if (golden->shape != out.shape) return false;
    const std::optional<std::vector<TileDiff>> tiles =
        held ? backend_.held_output_differences(held_rank, golden->data.data(), out.numel(), how)
             : tile_diffs(out.data.data(), golden->data.data(), out.numel(), how);
    if (!tiles) return false;
    merge_diff(dest.gold, diff_tiles(out.numel(), *tiles, tol_, to_whole, maxm), maxm);
  }
  dest.whole_shape = out.shape;  // of d's output
  if (u.rows)
    dest.whole_shape = {st.golden[size_t(d)] ? st.golden[size_t(d)]->rows() : 0, out.cols()};
  if (!source_) return true;
  at("reference", int(d));
  const Kjt& kjt_d = st.batch().ranks[size_t(d)].kjt;
  if (u.rows) dest.whole_shape = {kjt_d.stride(), out.cols()};
  const std::optional<std::vector<TileDiff>> tiles =
      backend_.reference_differences(plan_, int(d), u.rows ? kjt_samples(kjt_d, u.r0, u.r1) : kjt_d,
                                     *source_, st.k, out.data.data(), held_rank, out.numel(), how);
  if (!tiles) return false;
  merge_diff(dest.ref, diff_tiles(out.numel(), *tiles, tol_, to_whole, maxm), maxm);
  return true;
}

// The steps of replay_batch with the data read block by block: for each unit (a destination d,
// or some rows of it), the block of every sender (a part of its lookup check), the unit's
// output from those blocks alone and its part of d's output checks, while the next unit's rows
// are read on another thread. Emitted in the whole batch's order: contexts, lookups by rank,
// outputs by rank.
bool Replayer::stream_batch(const CaptureReader& reader, BatchState& st) {
  const int64_t W = st.W, k = st.k, maxm = opt_.max_mismatches;
  derive_batch(st);
  check_contexts(st);
  choose_contexts(st);
  if (st.ctx_bad) return false;
  drop_derived_extras(st);  // trouble reruns the batch whole, which derives them again
  at("output dist", -1);    // the dist's own checks on the whole shapes (no data needed)
  std::vector<std::vector<DestBlock>> where;  // [s][d]
  std::vector<DestUnit> units;
  bool variable_batch = false;
  if (!plan_units(st, where, units, variable_batch)) return false;
  // A unit's blocks and its golden rows. Per batch: kept to the next one, they would sit beside
  // its input dist while it is derived, the replay's peak.
  SpareRows spare;
  spare.set_most(static_cast<size_t>(W) + 1);
  // Compared where the backend makes them: only the tiles that add to a diff come back, and the
  // dist's outputs stay where it makes them (a device backend's memory) for their checks.
  const TileCompare how{tol_, kCompareTile, maxm};
  const auto read = [&](size_t i) {
    h5::quiet();  // libhdf5's error printing is per thread: errors are reported, not dumped
    return read_unit(reader, k, units[i], seq_dist_ != nullptr, where, st.cap_local,
                     st.golden[size_t(units[i].d)], spare);
  };
  const bool ahead = opt_.read_ahead > 0;  // --read-ahead 0: read, then check, in turn
  std::future<DestRows> next = read_ahead_task(read, size_t{0}, ahead);
  // After the first read began: asking a GPU backend to hold its outputs waits for it to have
  // started (start_backend), which the read need not.
  const HeldOutputs held(backend_);
  std::vector<TensorDiff> looked(static_cast<size_t>(W));  // [s]: the lookup check, merged
  std::vector<std::vector<int64_t>> value_off(static_cast<size_t>(W));  // [s]: of its lookup KJT
  for (int64_t s = 0; source_ && s < W; ++s)
    value_off[size_t(s)] = complete_cumsum(st.der.ranks[size_t(s)].lookup_kjt.lengths);
  std::vector<std::optional<CheckResult>> gold(static_cast<size_t>(W)), ref(gold.size());
  DestChecks dest;  // destination d's output checks, merged over its units
  st.got.assign(size_t(W), false);
  for (size_t i = 0; i < units.size(); ++i) {
    const DestUnit& u = units[i];
    const int64_t d = u.d;
    at("read", int(d));
    DestRows rows = next.get();
    if (i + 1 < units.size())
      next = read_ahead_task(read, i + 1, ahead);
    else if (ahead)
      start_shapes_ahead(reader);
    for (int64_t s = 0; source_ && s < W; ++s) {
      at("lookup", int(s));
      const DestBlock b = unit_block(where, s, u);
      const LookupKjt& lk = st.der.ranks[size_t(s)].lookup_kjt;
      // Compared where the backend makes it: only the tiles that add to the diff come back.
      const float* got = rows.block(size_t(s));
      const std::optional<std::vector<TileDiff>> tiles =
          backend_.lookup_differences(plan_, int(s),
                                      lookup_kjt_from(lk, value_off[size_t(s)], d,
                                                      u.rows ? u.r0 : 0, u.rows ? u.r1 : INT64_MAX),
                                      *source_, got, b.numel(), how);
      if (!tiles) return false;
      const auto to_whole = [&b](int64_t e) { return b.to_whole(e); };
      merge_diff(looked[size_t(s)], diff_tiles(b.numel(), *tiles, tol_, to_whole, maxm), maxm);
    }
    at("output dist", int(d));
    const EmbTensor out =
        rows.blocks.empty()
            ? sequence_destination_output(plan_, backend_, rows.recv, *st.used_ptr[size_t(d)])
            : destination_output(plan_, backend_, d, rows.blocks, st.used_ptr, variable_batch);
    for (EmbTensor& b : rows.blocks) spare.give(std::move(b.data));
    rows.blocks.clear();
    if (!rows.recv.data.empty()) spare.give(std::move(rows.recv.data));
    rows.recv = EmbTensor{};
    at("output", int(d));
    if (!check_unit_output(st, u, out, rows.golden, how, held.on, dest)) return false;
    if (rows.golden) spare.give(std::move(rows.golden->data));
    rows.golden.reset();
    if (i + 1 < units.size() && units[i + 1].d == d) continue;
    // d's last unit: its checks, decided.
    st.got[size_t(d)] = true;
    EmbTensor shape;
    shape.shape = dest.whole_shape;
    const TensorLayout layout = output_layout(st.batch().ranks[size_t(d)].kjt, shape);
    if (st.golden[size_t(d)]) {
      locate_mismatches(dest.gold, layout);
      gold[size_t(d)] = tensor_check(k, int(d), "output", "golden", "replayed", "golden",
                                     std::exchange(dest.gold, TensorDiff{}), tol_);
    }
    if (source_) {
      locate_mismatches(dest.ref, layout);
      ref[size_t(d)] = tensor_check(k, int(d), "output", "reference", "replayed", "reference",
                                    std::exchange(dest.ref, TensorDiff{}), tol_);
    }
    progress_rank_done(k);
  }
  if (pooled_dist_ && !latched_batch_ && pooled_dist_->latched_variable_batch()) latched_batch_ = k;
  for (int64_t s = 0; source_ && s < W; ++s) {
    at("lookup", int(s));
    locate_mismatches(looked[size_t(s)], lookup_layout(st, int(s)));
    CheckResult c = tensor_check(k, int(s), "lookup", "local_embs", "captured", "derived",
                                 looked[size_t(s)], tol_);
    st.lookup_bad |= c.status == CheckStatus::fail;
    emit(std::move(c));
  }
  for (int64_t d = 0; d < W; ++d)
    emit_output_checks(st, int(d), std::move(gold[size_t(d)]), std::move(ref[size_t(d)]), nullptr);
  return true;
}

}  // namespace dynemb::replay_detail
