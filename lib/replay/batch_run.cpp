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
  bool check_threw = false;  // the trouble out of the dist is a check's, not the backend's
  template <class Check>
  OutputSink sink(RunContext& rc, Check& check) {
    return [this, &rc, &check](int r, Tensor&& out) {
      if (out.kept) {
        held.emplace_back(r, std::move(out));
      } else {
        try {
          check(r, std::move(out));
        } catch (...) {
          check_threw = true;
          throw;
        }
      }
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

// `dist()` under the collective split (ReplayOptions::team_split): an OutputDistFailure or a
// UsageError is thrown in every process alike before any collective, and a check's trouble in the
// sink comes once the collective completed: they go on as in one process. Anything else may leave
// the peers waiting in the collective, so the run ends here.
template <class Dist>
void collectively(RunContext& rc, int64_t k, const Arrivals& arrivals, Dist&& dist) {
  if (!rc.lockstep() || rc.opt.team_split != TeamSplit::collective) return dist();
  try {
    dist();
  } catch (const OutputDistFailure&) {
    throw;
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    if (arrivals.check_threw) throw;
    rc.opt.team->abort(
        fmt::format("batch {}: the output dist across the processes: {}", k, e.what()));
  }
}

// Under the lockstep split, after this process decided its ranks' lookup checks (`stopped`:
// the trouble that ended them): whether any process's lookup check failed (the cause every output
// check names) and whether any process stopped. False when one did: the batch then ends for every
// process before the output dist, which would otherwise wait for the stopped one.
bool lookups_shared(RunContext& rc, BatchState& st, const std::exception_ptr& stopped) {
  bool any_stopped = false;
  for (const std::string& b :
       rc.log.exchange('L', fmt::format("{}{}", int(st.lookup_bad), int(bool(stopped))))) {
    st.lookup_bad = st.lookup_bad || (b.size() > 0 && b[0] == '1');
    any_stopped = any_stopped || (b.size() > 1 && b[1] == '1');
  }
  if (stopped) std::rethrow_exception(stopped);
  return !any_stopped;
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
  // Under the lockstep split each process decides its own ranks' lookup checks (phase 1) and
  // output checks (phase 2; the backend may hand over no other rank's output).
  const bool lockstep = rc.lockstep();
  if (lockstep) rc.log.split_phase(1);
  std::exception_ptr stopped;  // the lockstep split's: trouble in this process's lookup checks
  if (rc.source) try {
      if (need_all_derived) {
        rc.clock.enter("lookup");
        derived = lookups(rc, st, -1, rc.plan, *rc.source, false);
      }
      LookupChecks checks(rc, st);
      for (int64_t r = 0; r < W; ++r) {
        const EmbTensor* captured = st.cap_local[size_t(r)];
        if (!captured || !rc.owns(r)) continue;
        rc.clock.enter("lookup", int(r));
        // The dist takes the captured lookups: kept where the backend compares them, sent once.
        if (!need_all_derived)
          if (const std::optional<Kept> k = rc.backend.get().keep(*captured, int(r)))
            kept[size_t(r)] = kept_ref(*captured, *k);
        checks.check_whole(int(r), kept[size_t(r)].value_or(TensorRef(*captured)),
                           need_all_derived ? &derived[size_t(r)].t : nullptr);
      }
    } catch (...) {
      if (!lockstep) throw;
      stopped = std::current_exception();
    }
  if (lockstep) {
    if (!lookups_shared(rc, st, stopped)) return {};
    rc.log.split_phase(2);
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
    if (!rc.owns(r)) return;  // another process's (the CPU backend hands over every rank)
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
    collectively(rc, st.k, arrivals, [&] {
      forward(rc, st, local, outputs_may_stay(rc, st) ? Place::kept : Place::host,
              arrivals.sink(rc, check));
    });
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
void run_columns(RunContext& rc, BatchState& st, const ColumnSlices& slices) {
  const int64_t W = st.W, C = embedding_columns(rc.plan), width = slices.width;
  if (test_hooks::slice_columns() || test_hooks::device_memory())  // the hook says it was taken
    std::fprintf(stderr, "DYNEMB_SLICE_COLUMNS: batch %lld: slices of %lld columns\n",
                 static_cast<long long>(st.k), static_cast<long long>(width));
  OutputChecks checks(rc, st);
  if (rc.lockstep()) rc.log.split_phase(2);  // output checks only, each process its ranks'
  std::vector<Tensor> local;                 // [W]: the slice of every rank's lookup
  bool variable_batch = false;
  // The first slice is one column on the host (slice_width): the bucketize outputs (W times
  // three id-sized vectors) stay until a first lookup has met every id, so they sit beside one
  // column's lookups, not a whole slice's. The peak is then the larger of the two, not their sum.
  for (int64_t c0 = 0, c1 = std::min<int64_t>(C, slices.first); c0 < C;
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
      if (!rc.owns(r)) return;
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
      collectively(rc, st.k, arrivals, [&] {
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
      });
    } catch (const OutputDistFailure& e) {
      checks.dist_failed(e);
      return;
    }
    arrivals.check_held(check);
  }
  local.clear();
  rc.note_latch(st.k);
  for (int64_t r = 0; r < W; ++r)
    if (rc.owns(r)) checks.decide(int(r), nullptr);
}

}  // namespace dynemb::replay_detail
