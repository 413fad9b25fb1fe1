#include "replay/batch_run.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <future>
#include <set>
#include <system_error>

#include "common/error.hpp"
#include "common/test_hooks.hpp"
#include "engine/dist_checks.hpp"
#include "engine/ops.hpp"
#include "replay/column_slice.hpp"
#include "replay/lookup_check.hpp"
#include "replay/output_check.hpp"
#include "replay/spare_rows.hpp"

namespace dynemb::replay_detail {

namespace {

// fn(arg) on another thread (`ahead`), or deferred to the get() of the future: when not ahead, or
// when no thread can be started (the work then runs in turn).
template <class Fn, class Arg>
auto read_ahead_task(Fn& fn, Arg arg, bool ahead) -> std::future<decltype(fn(arg))> {
  try {
    if (ahead) return std::async(std::launch::async, [&fn, arg] { return fn(arg); });
    return std::async(std::launch::deferred, [&fn, arg] { return fn(arg); });
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, [&fn, arg] { return fn(arg); });
  }
}

int64_t same(int64_t e) {
  return e;
}

// Whether the batch's outputs may stay where the backend makes them: not when the host needs
// them whole (--write-output, module_output, a MEAN diagnosis of a golden output).
bool outputs_may_stay(const RunContext& rc, const BatchState& st) {
  if (rc.writing) return false;
  for (const RankBatch& rb : st.batch().ranks)
    if (rb.module_output || (rb.output && rc.pooled_mean())) return false;
  return true;
}

// A kept tensor as a step reads it, with the shape of `like`.
TensorRef kept_ref(const EmbTensor& like, const Kept& k) {
  TensorRef r(like);
  r.host = nullptr;
  r.kept = k;
  return r;
}

// The sink of an output dist: a host output is checked as it arrives (and dropped, unless
// kept); a kept one waits in `held` until the dist returned, so that no check runs inside the
// backend's dist.
struct Arrivals {
  std::vector<std::pair<int, Tensor>> held;
  template <class Check>
  OutputSink sink(RunContext& rc, Check& check) {
    return [this, &rc, &check](int r, Tensor&& out) {
      if (out.kept)
        held.emplace_back(r, std::move(out));
      else
        check(r, std::move(out));
      rc.clock.enter("output dist");
    };
  }
  template <class Check>
  void check_held(Check& check) {
    for (auto& [r, out] : held) check(r, std::move(out));
    held.clear();
  }
};

// The dist of the run's module over `local` with the chosen contexts.
void forward(RunContext& rc, const BatchState& st, const std::vector<TensorRef>& local, Place place,
             const OutputSink& sink) {
  Backend& backend = rc.backend.get();
  if (rc.seq_dist)
    rc.seq_dist->forward(backend, local, st.used_ptr, place, sink);
  else
    rc.pooled_dist->forward(backend, st.k, local, st.used_ptr, place, sink);
  rc.note_latch(st.k);
}

// Once the first slice or unit is looked up, the bucketize outputs are read no more (they trace
// an out-of-table id to its origin, and the first lookup met every id): W times three id-sized
// vectors, given back.
void drop_bucketized(BatchState& st) {
  for (DerivedRank& d : st.der.ranks) d.bucketized = BucketizedKjt{};
}

}  // namespace

// 3. Lookup: captured local_embs vs the lookup derived from the embedding source. When the output
// dist needs derived lookups for some rank, all ranks are derived at once on the host (they are its
// inputs); otherwise rank by rank where the backend makes them. 4. The output dist on the chosen
// inputs (captured local_embs in --ctx captured, else the derived lookups).
std::vector<std::optional<EmbTensor>> run_whole(RunContext& rc, BatchState& st) {
  const int64_t W = st.W;
  bool need_all_derived = false;
  for (int64_t r = 0; r < W; ++r) need_all_derived |= !(rc.use_captured && st.cap_local[size_t(r)]);
  std::vector<Tensor> derived;                                          // [W] on the host, or none
  std::vector<std::optional<TensorRef>> kept(size_t(W), std::nullopt);  // captured, kept
  if (rc.source) {
    if (need_all_derived) {
      rc.clock.enter("lookup");
      derived = lookups(rc, st, -1, rc.plan, *rc.source, false);
    }
    LookupChecks checks(rc, st);
    for (int64_t r = 0; r < W; ++r) {
      const EmbTensor* captured = st.cap_local[size_t(r)];
      if (!captured) continue;
      rc.clock.enter("lookup", int(r));
      // The dist takes the captured lookups: kept where the backend compares them, sent once.
      if (!need_all_derived)
        if (const std::optional<Kept> k = rc.backend.get().keep(*captured, int(r)))
          kept[size_t(r)] = kept_ref(*captured, *k);
      checks.check_whole(int(r), kept[size_t(r)].value_or(TensorRef(*captured)),
                         need_all_derived ? &derived[size_t(r)].t : nullptr);
    }
  }
  std::vector<TensorRef> local(static_cast<size_t>(W));
  bool runnable = true;
  for (int64_t r = 0; r < W; ++r) {
    const EmbTensor* captured = st.cap_local[size_t(r)];
    if (rc.use_captured && captured)
      local[size_t(r)] = kept[size_t(r)].value_or(TensorRef(*captured));
    else if (!derived.empty())
      local[size_t(r)] = TensorRef(derived[size_t(r)]);
    else if (captured)  // --ctx derived without an embedding source
      local[size_t(r)] = TensorRef(*captured);
    else
      runnable = false;
  }
  OutputChecks checks(rc, st);
  std::vector<std::optional<EmbTensor>> outputs(static_cast<size_t>(W));
  if (!runnable) {
    if (!rc.warned_no_local)
      rc.log.warn(
          "some ranks have no local_embs and there is no embedding source to derive them: "
          "their output dist is not run; synth or capture with --store local_embs, or add /oracle "
          "or /tables/<name>/weight to the capture");
    rc.warned_no_local = true;
    checks.skip_rest("no local_embs captured and no embedding source to derive them");
    return outputs;
  }
  auto check = [&](int r, Tensor&& out) {
    OutputPart p;
    p.rank = r;
    p.out = &out;
    p.whole_shape = out.t.shape;
    p.to_whole = same;
    p.golden = st.golden[size_t(r)];
    p.plan = &rc.plan;
    p.source = rc.source.get();
    p.kjt = &st.batch().ranks[size_t(r)].kjt;
    checks.check(p);
    checks.decide(r, out.kept ? nullptr : &out.t);
    if (rc.writing) outputs[size_t(r)] = std::move(out.t);
  };
  Arrivals arrivals;
  rc.clock.enter("output dist");
  try {
    forward(rc, st, local, outputs_may_stay(rc, st) ? Place::kept : Place::host,
            arrivals.sink(rc, check));
  } catch (const OutputDistFailure& e) {
    checks.dist_failed(e);
    return outputs;
  }
  arrivals.check_held(check);
  return outputs;
}

namespace {

// A stand-in of rank r's whole lookup output with the shape alone (no data), from the shape of
// its slice `t` and its lookup KJT: [rows, columns], or pooled VBE 1-D [s][f][b][d] with
// sum_{s,f} B_{s,f} D_f elements. For the dist's context checks, which read shapes only.
EmbTensor whole_lookup_shape(const Plan& plan, const LookupKjt& lk, const EmbTensor& t) {
  EmbTensor e;
  e.dtype = t.dtype;
  if (t.shape.size() != 1) {
    e.shape = {t.rows(), embedding_columns(plan)};
    return e;
  }
  int64_t n = 0;
  for (int64_t f = 0; f < lk.num_features; ++f)
    for (int64_t s = 0; s < lk.world_size; ++s)
      n += lk.stride_per_key_per_rank[size_t(f)][size_t(s)] * plan.features[size_t(f)].dim;
  e.shape = {n};
  return e;
}

}  // namespace

// 3-4 over column slices [c0, c0 + width): the W lookups of the slice, the output dist on them and
// each rank's output slice checked against the golden output's and the reference's same columns.
// The context checks the dist makes (dist_checks.hpp) run first on the whole shapes, so a context
// that cannot work fails with the whole batch's words and numbers.
void run_columns(RunContext& rc, BatchState& st, int64_t width) {
  const int64_t W = st.W, C = embedding_columns(rc.plan);
  if (test_hooks::slice_columns())  // the test hook says it was taken
    std::fprintf(stderr, "DYNEMB_SLICE_COLUMNS: batch %lld: slices of %lld columns\n",
                 static_cast<long long>(st.k), static_cast<long long>(width));
  OutputChecks checks(rc, st);
  std::vector<Tensor> local;  // [W]: the slice of every rank's lookup
  bool variable_batch = false;
  // The first slice is one column: the bucketize outputs (W times three id-sized vectors) stay
  // until a first lookup has met every id, so they sit beside one column's lookups, not a whole
  // slice's. The peak is then the larger of the two, not their sum.
  for (int64_t c0 = 0, c1 = std::min<int64_t>(C, 1); c0 < C;
       c0 = c1, c1 = std::min(C, c1 + width)) {
    ColumnSlice slice = make_column_slice(rc.plan, rc.source, c0, c1);
    // warn_zero_row warns of out-of-table ids once per lookup of the batch: on the first slice.
    // The rows looked up are those of `ignore` (lookup_row does not tell them apart).
    if (c0 > 0 && slice.plan.bounds_check == BoundsCheck::warn_zero_row)
      slice.plan.bounds_check = BoundsCheck::ignore;
    local.clear();  // the previous slice's, before the next is made
    rc.clock.enter("lookup");
    local = lookups(rc, st, -1, slice.plan, *slice.source, true);
    if (c0 == 0) drop_bucketized(st);
    auto check = [&](int r, Tensor&& out) {
      const RankBatch& rb = st.batch().ranks[size_t(r)];
      const SliceLayout l = output_slice_layout(rc.plan, slice, out.t, rb.kjt);
      EmbTensor golden;
      OutputPart p;
      if (rb.output && rb.output->shape == l.whole_shape &&
          int64_t(rb.output->data.size()) == rb.output->numel()) {
        golden = EmbTensor{rb.output->dtype, out.t.shape, std::vector<float>(size_t(out.numel()))};
        l.gather(rb.output->data.data(), golden.data.data());
        p.golden = &golden;
      }
      p.rank = r;
      p.out = &out;
      p.whole_shape = l.whole_shape;
      p.to_whole = [&l](int64_t e) { return l.to_whole(e); };
      p.plan = &slice.plan;
      p.source = slice.source.get();
      p.kjt = &rb.kjt;
      checks.check(p);
    };
    Arrivals arrivals;
    rc.clock.enter("output dist");
    try {
      Backend& backend = rc.backend.get();
      if (c0 == 0) {
        std::vector<EmbTensor> whole(static_cast<size_t>(W));  // shapes only
        std::vector<const EmbTensor*> whole_ptr(static_cast<size_t>(W));
        for (int64_t r = 0; r < W; ++r) {
          whole[size_t(r)] =
              whole_lookup_shape(rc.plan, st.der.ranks[size_t(r)].lookup_kjt, local[size_t(r)].t);
          whole_ptr[size_t(r)] = &whole[size_t(r)];
        }
        if (rc.seq_dist)
          check_sequence_dist(rc.plan, whole_ptr, st.used_ptr);
        else
          variable_batch = rc.pooled_dist->check(st.k, refs(whole_ptr), st.used_ptr);
      }
      if (rc.seq_dist)
        backend.sequence_output_dist(slice.plan, refs(local), st.used_ptr, Place::kept,
                                     arrivals.sink(rc, check));
      else
        backend.pooled_output_dist(slice.plan, variable_batch, refs(local), st.used_ptr,
                                   Place::kept, arrivals.sink(rc, check));
    } catch (const OutputDistFailure& e) {
      checks.dist_failed(e);
      return;
    }
    arrivals.check_held(check);
  }
  local.clear();
  rc.note_latch(st.k);
  for (int64_t r = 0; r < W; ++r) checks.decide(int(r), nullptr);
}

namespace {

// Every row of a captured tensor as the ranges of CaptureReader::read_rows.
std::vector<std::pair<int64_t, int64_t>> whole_rows(const EmbTensor& t) {
  if (t.rows() == 0) return {};
  return {{0, t.rows()}};
}

// What a unit's checks read from the capture: the block of every sender and the unit's rows of
// the golden output (when captured).
struct UnitRows {
  std::vector<EmbTensor> blocks;  // pooled: [W] the senders' chunks
  EmbTensor recv;                 // sequence: what d receives, the senders' blocks in rank order
  std::vector<int64_t> recv_off;  // sequence: [W + 1] where each block starts in recv (elements)
  std::optional<EmbTensor> golden;
  const float* block(size_t s) const {  // sender s's block: its first element
    return blocks.empty() ? recv.data.data() + recv_off[s] : blocks[s].data.data();
  }
};

// The block of sender s in unit u.
DestBlock unit_block(const DestinationCut& cut, int64_t s, const Unit& u) {
  const DestBlock& b = cut.where[size_t(s)][size_t(u.d)];
  return u.rows ? block_rows(b, u.r0, u.r1) : b;
}

// Unit u's rows, read through `src` (on whichever thread it reads).
UnitRows read_unit(BatchSource& src, int64_t k, const Unit& u, bool sequence,
                   const DestinationCut& cut, const std::vector<const EmbTensor*>& local,
                   const EmbTensor* golden, SpareRows& spare) {
  const size_t W = cut.where.size();
  std::vector<DestBlock> b;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges(W);
  for (size_t s = 0; s < W; ++s) {
    b.push_back(unit_block(cut, int64_t(s), u));
    ranges[s] = b.back().ranges;
  }
  const DType dt = local[0]->dtype;  // the plan's data_type on every rank (read_batch checks)
  UnitRows out;
  if (sequence) {  // one buffer: the blocks are what d receives, in rank order
    size_t recv = 0;
    for (const DestBlock& bs : b) recv += size_t(bs.numel());
    out.recv.dtype = dt;
    out.recv.data =
        src.read_rows_concat(k, "local_embs", dt, ranges, out.recv_off, spare.take_one(recv));
    out.recv.shape = {out.recv_off.back() / std::max<int64_t>(1, b[0].row_elems), b[0].row_elems};
  } else {
    std::vector<size_t> need;
    for (const DestBlock& bs : b) need.push_back(size_t(bs.numel()));
    std::vector<std::vector<float>> rows =
        src.read_rows(k, "local_embs", dt, ranges, spare.take(need));
    for (size_t s = 0; s < W; ++s) out.blocks.push_back({dt, b[s].shape, std::move(rows[s])});
  }
  if (!golden) return out;
  std::vector<std::pair<int64_t, int64_t>> gr = whole_rows(*golden);
  std::vector<int64_t> shape = golden->shape;
  if (u.rows) {
    gr.clear();
    if (u.r1 > u.r0) gr.emplace_back(u.r0, u.r1);
    shape = {u.r1 - u.r0, golden->cols()};
  }
  const int64_t n = EmbTensor{golden->dtype, shape, {}}.numel();
  out.golden =
      EmbTensor{golden->dtype, shape,
                src.read_rows(k, u.d, "output", golden->dtype, gr, spare.take_one(size_t(n)))};
  return out;
}

}  // namespace

// For each unit (a destination d, or some rows of it): the block of every sender (a part of its
// lookup check), the unit's output from those blocks alone and its part of d's output checks,
// while the next unit's rows are read on another thread. Decided in the whole batch's order:
// lookups by rank, then outputs by rank.
void run_destinations(RunContext& rc, BatchState& st, const DestinationCut& cut, BatchSource& src,
                      int64_t next_batch) {
  const int64_t W = st.W, k = st.k;
  const std::vector<Unit>& units = cut.units;
  drop_bucketized(st);
  // A unit's blocks and its golden rows. Per batch: kept to the next one, they would sit beside
  // its input dist while it is derived, the replay's peak.
  SpareRows spare;
  spare.set_most(static_cast<size_t>(W) + 1);
  const auto read = [&, sequence = rc.seq_dist.has_value()](size_t i) {
    return read_unit(src, k, units[i], sequence, cut, st.cap_local, st.golden[size_t(units[i].d)],
                     spare);
  };
  const bool ahead = rc.opt.read_ahead > 0;  // --read-ahead 0: read, then check, in turn
  std::future<UnitRows> next = read_ahead_task(read, size_t{0}, ahead);
  Backend& backend = rc.backend.get();
  LookupChecks looked(rc, st);
  OutputChecks checks(rc, st);
  std::vector<std::vector<int64_t>> value_off(static_cast<size_t>(W));  // [s]: of its lookup KJT
  for (int64_t s = 0; rc.source && s < W; ++s)
    value_off[size_t(s)] = complete_cumsum(st.der.ranks[size_t(s)].lookup_kjt.lengths);
  const auto run_unit = [&](size_t i) {
    const Unit& u = units[i];
    const int64_t d = u.d;
    rc.clock.enter("read", int(d));
    // This unit's rows, then the next unit's read begins (one read in flight at a time), whether
    // or not this one's could be read.
    std::optional<UnitRows> got;
    std::exception_ptr unread;
    try {
      got = next.get();
    } catch (...) {
      unread = std::current_exception();
    }
    if (i + 1 < units.size())
      next = read_ahead_task(read, i + 1, ahead);
    else if (ahead && next_batch >= 0)
      src.shapes_ahead(next_batch);
    if (unread) std::rethrow_exception(unread);
    UnitRows& rows = *got;
    for (int64_t s = 0; rc.source && s < W; ++s) {
      const DestBlock b = unit_block(cut, s, u);
      const LookupKjt part =
          lookup_kjt_from(st.der.ranks[size_t(s)].lookup_kjt, value_off[size_t(s)], d,
                          u.rows ? u.r0 : 0, u.rows ? u.r1 : INT64_MAX);
      looked.check(int(s),
                   TensorRef::span(rows.block(size_t(s)), b.numel(), st.cap_local[0]->dtype), part,
                   [&b](int64_t e) { return b.to_whole(e); });
    }
    rc.clock.enter("output dist", int(d));
    const Tensor out = rows.blocks.empty()
                           ? sequence_destination_output(rc.plan, backend, rows.recv,
                                                         *st.used_ptr[size_t(d)], Place::kept)
                           : destination_output(rc.plan, backend, d, rows.blocks, st.used_ptr,
                                                cut.variable_batch, Place::kept);
    for (EmbTensor& b : rows.blocks) spare.give(std::move(b.data));
    if (!rows.recv.data.empty()) spare.give(std::move(rows.recv.data));
    const Kjt& kjt_d = st.batch().ranks[size_t(d)].kjt;
    const Kjt samples = u.rows ? kjt_samples(kjt_d, u.r0, u.r1) : Kjt{};
    const int64_t off = u.rows ? u.r0 * out.t.cols() : 0;  // out's first element in d's output
    OutputPart p;
    p.rank = int(d);
    p.out = &out;
    p.whole_shape = cut.shapes[size_t(d)];
    p.to_whole = [off](int64_t e) { return off + e; };
    p.golden = rows.golden ? &*rows.golden : nullptr;
    p.plan = &rc.plan;
    p.source = rc.source.get();
    p.kjt = u.rows ? &samples : &kjt_d;
    checks.check(p);
    if (rows.golden) spare.give(std::move(rows.golden->data));
  };
  // A unit that meets trouble (its rows cannot be read, an id outside its table) is reported and
  // the next one runs; the checks it was part of are skipped, never decided on part of their data.
  std::set<int64_t> failed;  // destinations
  std::set<std::string> said;
  const auto trouble = [&](int64_t d, int rank, const std::string& stage, const std::string& msg) {
    failed.insert(d);
    if (said.insert(msg).second) rc.log.trouble(k, rank, stage, msg);
  };
  for (size_t i = 0; i < units.size(); ++i) {
    const Unit& u = units[i];
    const int64_t d = u.d;
    try {
      run_unit(i);
    } catch (const CaptureError& e) {
      trouble(d, rank_of_h5path(e.h5path()), "capture", e.what());
    } catch (const Error& e) {
      trouble(d, rc.clock.rank(), rc.clock.report_stage(), e.what());
    }
    if (i + 1 == units.size() || units[i + 1].d != d) rc.log.rank_done(k);
  }
  rc.note_latch(k);
  const std::string why =
      fmt::format("not every part of it could be checked: trouble in batch {} (destination {})", k,
                  failed.empty() ? 0 : *failed.begin());
  for (int64_t s = 0; rc.source && s < W; ++s) {
    if (failed.empty())
      looked.decide(int(s));
    else
      rc.log.emit(skipped(k, int(s), "lookup", "local_embs", why));
  }
  for (int64_t d = 0; d < W; ++d) {
    if (failed.count(d))
      checks.skip(int(d), why);
    else
      checks.decide(int(d), nullptr);
  }
}

}  // namespace dynemb::replay_detail
