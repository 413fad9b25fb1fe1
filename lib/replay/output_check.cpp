#include "replay/output_check.hpp"

#include <fmt/format.h>

#include "common/error.hpp"
#include "engine/mean_pooling.hpp"
#include "engine/reference.hpp"
#include "replay/mean_diagnosis.hpp"

namespace dynemb::replay_detail {

OutputChecks::OutputChecks(RunContext& rc, BatchState& st)
    : rc_(rc), st_(st), ranks_(static_cast<size_t>(st.W)) {}

void OutputChecks::check(const OutputPart& p) {
  const int r = p.rank;
  const int64_t n = p.out->numel(), maxm = rc_.opt.max_mismatches;
  Rank& d = ranks_[size_t(r)];
  const RankBatch& rb = st_.batch().ranks[size_t(r)];
  rc_.clock.enter("output", r);
  if (d.whole_shape.empty()) {
    d.whole_shape = p.whole_shape;
    if (rb.output)  // its data may be unread (a batch cut by destination reads it by unit)
      d.gold = rb.output->shape == p.whole_shape ? TensorDiff{}
                                                 : shape_mismatch(p.whole_shape, rb.output->shape);
    if (rc_.source) {
      const std::vector<int64_t> want = reference_shape(rc_.plan, rb.kjt);
      d.ref = want == p.whole_shape ? TensorDiff{} : shape_mismatch(p.whole_shape, want);
    }
  }
  // A host output is compared on the host (host_comparator), whatever the backend: it is never
  // sent back to a device to be compared. A kept one is compared where the backend keeps it.
  Comparator& cmp = p.out->kept ? rc_.backend.get().comparator() : host_comparator();
  const TileCompare how = rc_.how();
  if (d.gold && d.gold->shape_ok && p.golden) {
    const std::optional<std::vector<TileDiff>> tiles = cmp.compare(*p.out, *p.golden, how);
    if (!tiles)
      throw Error(
          fmt::format("batch {} rank {}: the backend holds no output of {} elements", st_.k, r, n));
    merge_diff(*d.gold, diff_tiles(n, *tiles, rc_.tol, p.to_whole, maxm), maxm);
  }
  if (!d.ref || !d.ref->shape_ok) return;
  rc_.clock.enter("reference", r);
  std::optional<std::vector<TileDiff>> tiles;
  try {
    tiles = cmp.compare_reference(*p.out, *p.plan, r, *p.kjt, *p.source, st_.k, how);
  } catch (const CaptureError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("unsharded reference: {}", e.what()));
  }
  if (!tiles)
    throw Error(
        fmt::format("unsharded reference of batch {} rank {}: not {} elements", st_.k, r, n));
  merge_diff(*d.ref, diff_tiles(n, *tiles, rc_.tol, p.to_whole, maxm), maxm);
}

void OutputChecks::decide(int r, const EmbTensor* whole) {
  Rank& d = ranks_[size_t(r)];
  if (d.whole_shape.empty()) return;  // never handed over
  rc_.clock.enter("output", r);
  const TensorLayout layout =
      output_layout(rc_.plan, st_.batch().ranks[size_t(r)].kjt, d.whole_shape);
  std::optional<CheckResult> gold, ref;
  if (d.gold) {
    if (d.gold->shape_ok) locate_mismatches(*d.gold, layout);
    gold = tensor_check(st_.k, r, "output", "golden", "replayed", "golden", *d.gold, rc_.tol);
  }
  if (d.ref) {
    if (d.ref->shape_ok) locate_mismatches(*d.ref, layout);
    ref = tensor_check(st_.k, r, "output", "reference", "replayed", "reference", *d.ref, rc_.tol);
  }
  d.gold.reset();
  d.ref.reset();
  record_checks(r, std::move(gold), std::move(ref), whole);
}

// Rank r's output checks decided (vs golden, vs reference), with their causes, and the module's
// output after the mean-pooling step. `out`, the whole replayed output, is needed for the MEAN
// diagnosis and the module output.
void OutputChecks::record_checks(int r, std::optional<CheckResult> gold,
                                 std::optional<CheckResult> ref, const EmbTensor* out) {
  const int64_t k = st_.k, maxm = rc_.opt.max_mismatches;
  const Plan& plan = rc_.plan;
  const RankBatch& rb = st_.batch().ranks[size_t(r)];
  const std::string upstream = st_.cause_before_output();
  const bool ref_ok = ref && ref->status == CheckStatus::pass;
  if (ref && ref->status == CheckStatus::fail)
    ref->cause = !upstream.empty() ? upstream
                                   : "engine (consistent context and lookup, yet the sharded "
                                     "path differs from the unsharded reference)";
  if (gold && gold->status == CheckStatus::fail) {
    gold->cause = !upstream.empty() ? upstream
                  : ref_ok          ? "data (golden output)"
                  : ref             ? "undetermined (the replay differs from the reference too)"
                                    : "undetermined (no embedding source for a reference)";
    if (rc_.pooled_mean() && out)
      diagnose_output_after_callback(plan, *gold, *out, *rb.output, rb.kjt,
                                     output_layout(plan, rb.kjt, out->shape));
  }
  if (gold) rc_.log.record(std::move(*gold));
  if (ref) rc_.log.record(std::move(*ref));
  if (rb.module_output && out) {
    rc_.clock.enter("module", r);
    CheckResult m;
    try {
      const EmbTensor mo =
          module_output(plan, rb.kjt, *out, rb.inverse_indices ? &*rb.inverse_indices : nullptr);
      m = tensor_check(
          k, r, "module", "module_output", "replayed", "captured",
          diff_tensors(mo, *rb.module_output, rc_.tol, TensorLayout::pooled_output(plan), maxm),
          rc_.tol);
    } catch (const Error& e) {
      m = skipped(k, r, "module", "module_output", e.what());
    }
    if (m.status == CheckStatus::fail) {
      m.cause = !upstream.empty() ? upstream
                : gold && gold->status == CheckStatus::fail
                    ? "the dist's output already differs"
                    : "module (the mean-pooling step after the dist)";
      if (upstream.empty() && !(gold && gold->status == CheckStatus::fail))
        diagnose_module_divisor(plan, rc_.tol, m, *out, rb);
    }
    rc_.log.record(std::move(m));
  }
  rc_.log.rank_done(k);
}

// Every output check of the ranks the output dist has not handed over, skipped with `why`.
void OutputChecks::skip(int r, const std::string& why) {
  ranks_[size_t(r)] = Rank{};
  const RankBatch& rb = st_.batch().ranks[size_t(r)];
  if (rb.output) rc_.log.record(skipped(st_.k, r, "output", "golden", why));
  if (rc_.source) rc_.log.record(skipped(st_.k, r, "output", "reference", why));
  if (rb.module_output) rc_.log.record(skipped(st_.k, r, "module", "module_output", why));
}

void OutputChecks::skip_rest(const std::string& why) {
  const BatchState& st = st_;
  for (int64_t r = 0; r < st.W; ++r) {
    if (handed_over(int(r))) continue;
    if (st.golden[size_t(r)]) rc_.log.record(skipped(st.k, int(r), "output", "golden", why));
    if (rc_.source) rc_.log.record(skipped(st.k, int(r), "output", "reference", why));
    if (st.batch().ranks[size_t(r)].module_output)
      rc_.log.record(skipped(st.k, int(r), "module", "module_output", why));
  }
}

// The crash a real rank would have had: a context mismatch finding, not trouble; no output
// checks for the ranks not handed over.
void OutputChecks::dist_failed(const OutputDistFailure& e) {
  CheckResult c;
  c.batch = st_.k;
  c.rank = e.rank();
  c.stage = "ctx";
  c.check = "output_dist";
  c.status = CheckStatus::fail;
  c.mismatches = 1;
  c.compared = 1;
  c.message = fmt::format("the output dist cannot run with this context (field {}): {}", e.field(),
                          e.what());
  rc_.log.record(std::move(c));
  // Under the lockstep split the failure is recorded by the process of its rank, and the skips by
  // each process of its ranks: a later phase keeps the failure first, as one process records it.
  if (rc_.lockstep()) rc_.log.split_phase(3);
  skip_rest(fmt::format("the output dist failed on rank {} ({})", e.rank(), e.field()));
}

}  // namespace dynemb::replay_detail
