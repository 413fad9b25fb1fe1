// The steps of a batch before its output dist (run_context.hpp): the input dist derived, the
// captured contexts checked against it, the contexts the output dist gets; and the words of
// every check.
#include <fmt/format.h>

#include "common/error.hpp"
#include "common/parallel.hpp"
#include "replay/ctx_check.hpp"
#include "replay/run_context.hpp"

namespace dynemb::replay_detail {

namespace {

// The context fed to the output dist in --ctx captured mode: the captured fields, and the
// derived ones for fields the capture does not carry (optional in docs/capture-format.md).
// The derived id-sized fields (unbucketize_permute [N_r], lengths_after_input_dist) are moved
// out of `der`, not copied: nothing reads them there after the context checks, and a captured
// field then takes the moved vector's memory.
ShardingContext merge_ctx(const ShardingContext& cap, ShardingContext& der) {
  std::optional<std::vector<int64_t>> perm = std::move(der.unbucketize_permute);
  std::optional<std::vector<int64_t>> lens = std::move(der.lengths_after_input_dist);
  der.unbucketize_permute.reset();
  der.lengths_after_input_dist.reset();
  ShardingContext m = der;
  m.unbucketize_permute = std::move(perm);
  m.lengths_after_input_dist = std::move(lens);
  if (cap.input_splits) m.input_splits = cap.input_splits;
  if (cap.output_splits) m.output_splits = cap.output_splits;
  if (cap.batch_size_per_rank) m.batch_size_per_rank = cap.batch_size_per_rank;
  if (cap.batch_size_per_rank_per_feature)
    m.batch_size_per_rank_per_feature = cap.batch_size_per_rank_per_feature;
  if (cap.sparse_features_recat) m.sparse_features_recat = cap.sparse_features_recat;
  if (cap.unbucketize_permute) m.unbucketize_permute = cap.unbucketize_permute;
  if (cap.lengths_after_input_dist) {
    m.lengths_after_input_dist = cap.lengths_after_input_dist;
    m.lengths_after_input_dist_cols = cap.lengths_after_input_dist_cols;
  }
  if (cap.variable_batch_per_feature) m.variable_batch_per_feature = cap.variable_batch_per_feature;
  if (cap.batch_size_per_feature_pre_a2a)
    m.batch_size_per_feature_pre_a2a = cap.batch_size_per_feature_pre_a2a;
  return m;
}

}  // namespace

// A CheckResult from a tensor diff. `what` names the pair, e.g. "replayed vs golden".
CheckResult tensor_check(int64_t batch, int rank, const std::string& stage,
                         const std::string& check, const std::string& got_label,
                         const std::string& want_label, const TensorDiff& d, const Tolerance& tol) {
  CheckResult c;
  c.batch = batch;
  c.rank = rank;
  c.stage = stage;
  c.check = check;
  c.got_label = got_label;
  c.want_label = want_label;
  c.compared = d.compared;
  if (!d.shape_ok) {
    c.status = CheckStatus::fail;
    c.mismatches = 1;
    c.message =
        fmt::format("{} has a different shape than {}: {}", got_label, want_label, d.shape_note);
    return c;
  }
  c.mismatches = d.mismatches;
  c.max_abs_err = d.max_abs_err;
  c.max_rel_err = d.max_rel_err;
  for (const ElementMismatch& m : d.first)
    c.details.push_back({m.where, value_text(m.got), value_text(m.want), ""});
  if (d.mismatches == 0) {
    c.message = fmt::format("{} elements within {} (max abs err {:g}, max rel err {:g})",
                            d.compared, tol.str(), d.max_abs_err, d.max_rel_err);
    return c;
  }
  c.status = CheckStatus::fail;
  c.message = fmt::format("{} of {} elements differ ({})", d.mismatches, d.compared, tol.str());
  if (!d.first.empty()) {
    const ElementMismatch& m = d.first.front();
    c.message += fmt::format("; first at {}: {} {}, {} {}", to_string(m.where), got_label,
                             value_text(m.got), want_label, value_text(m.want));
  }
  c.message += fmt::format("; max abs err {:g}, max rel err {:g}", d.max_abs_err, d.max_rel_err);
  return c;
}

CheckResult skipped(int64_t batch, int rank, const std::string& stage, const std::string& check,
                    const std::string& why) {
  CheckResult c;
  c.batch = batch;
  c.rank = rank;
  c.stage = stage;
  c.check = check;
  c.status = CheckStatus::skipped;
  c.message = why;
  return c;
}

BatchState::BatchState(int64_t k_, const Batch& batch, int64_t W_) : k(k_), W(W_) {
  rebind(batch);
}

void BatchState::rebind(const Batch& batch) {
  batch_ = &batch;
  kjts.assign(size_t(W), nullptr);
  cap_ctx.assign(size_t(W), nullptr);
  cap_local.assign(size_t(W), nullptr);
  golden.assign(size_t(W), nullptr);
  for (int64_t r = 0; r < W; ++r) {
    const RankBatch& rb = batch.ranks[size_t(r)];
    kjts[size_t(r)] = &rb.kjt;
    if (rb.ctx) cap_ctx[size_t(r)] = &*rb.ctx;
    if (rb.local_embs) cap_local[size_t(r)] = &*rb.local_embs;
    if (rb.output) golden[size_t(r)] = &*rb.output;
  }
}

// The input dist every rank ran: bucketize, the KJT all-to-all, the contexts. The backend
// bucketizes once it has started (the CUDA backend's kernels, all ranks at once); a batch that
// would wait for it (the first, while the GPU's context starts) is bucketized on the host, which
// gives the same result bit for bit.
void derive_batch(RunContext& rc, BatchState& st) {
  rc.clock.enter("input dist");
  try {
    Backend* stage1 = rc.backend.ready() && !rc.backend.failed() ? &rc.backend.get() : nullptr;
    st.der = derive_input_dist(rc.plan, st.kjts, stage1);
  } catch (const OutputDistFailure& e) {
    throw Error(fmt::format("batch {}: input dist: {}", st.k, e.what()));
  } catch (const CaptureError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("{}:/batches/{}: {}", rc.opt.capture_path, st.k, e.what()));
  }
}

// 1. Captured context vs derived, field by field, and the plan-free checks.
void check_contexts(RunContext& rc, BatchState& st) {
  const int64_t k = st.k, W = st.W;
  bool all_ctx = true;
  for (const RankBatch& rb : st.batch().ranks) {
    rc.ctx_seen |= rb.ctx.has_value();
    all_ctx &= rb.ctx.has_value();
  }
  if (!all_ctx && !rc.ctx_seen && rc.ctx_before) rc.ctx_seen = rc.ctx_before();
  rc.ctx_before = nullptr;      // asked at most once: from here on, this process's batches tell
  std::vector<int64_t> no_ctx;  // ranks of this batch without ctx/ while others have one
  // Each rank's fields on its own core (id-sized vectors: unbucketize_permute, the lengths after
  // the input dist), recorded in rank order.
  rc.clock.enter("ctx");
  std::vector<std::vector<CheckResult>> diffs(static_cast<size_t>(W));
  parallel_for(
      hardware_threads(), W,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          if (const RankBatch& rb = st.batch().ranks[size_t(r)]; rb.ctx)
            diffs[size_t(r)] = diff_context(rc.plan, k, int(r), rb.kjt, st.der.ranks[size_t(r)],
                                            *rb.ctx, rc.opt.max_mismatches);
      },
      /*grain=*/1);
  for (int64_t r = 0; r < W; ++r) {
    if (!st.batch().ranks[size_t(r)].ctx) {
      if (rc.ctx_seen) no_ctx.push_back(r);
      continue;
    }
    for (CheckResult& c : diffs[size_t(r)]) {
      st.ctx_bad |= c.status == CheckStatus::fail;
      rc.log.record(std::move(c));
    }
  }
  if (!no_ctx.empty()) {
    rc.log.warn(
        fmt::format("batch {}: rank(s) {} have no ctx/ group while other rank-batches have one: "
                    "their context checks are skipped and the output dist uses the derived "
                    "context for them",
                    k, fmt::join(no_ctx, ", ")));
    for (int64_t r : no_ctx)
      rc.log.record(
          skipped(k, int(r), "ctx", "context",
                  "no ctx/ group in this rank-batch (other rank-batches have one): the captured "
                  "context cannot be compared"));
  }
  for (CheckResult& c : consistency_checks(rc.plan, k, st.kjts, st.cap_ctx, st.cap_local, st.golden,
                                           rc.opt.max_mismatches)) {
    st.ctx_bad |= c.status == CheckStatus::fail;
    rc.log.record(std::move(c));
  }
}

// 2. The context the output dist gets (captured fields over derived ones in --ctx captured),
// and the pooled module's variable-batch latch checked on it.
void choose_contexts(RunContext& rc, BatchState& st) {
  const int64_t W = st.W;
  st.used.resize(size_t(W));
  st.used_ptr.resize(size_t(W));
  parallel_for(
      hardware_threads(), W,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          ShardingContext& d = st.der.ranks[size_t(r)].ctx;
          if (rc.use_captured && st.cap_ctx[size_t(r)]) {
            st.used[size_t(r)] = merge_ctx(*st.cap_ctx[size_t(r)], d);
            st.used_ptr[size_t(r)] = &st.used[size_t(r)];
          } else {
            st.used_ptr[size_t(r)] = &d;  // not copied: a context holds id-sized vectors
          }
        }
      },
      /*grain=*/1);
  if (!rc.pooled_dist) return;
  const std::optional<bool> latched = rc.pooled_dist->latched_variable_batch();
  const bool mode = latched ? *latched : st.used_ptr[0]->variable_batch_per_feature.value_or(false);
  for (int64_t r = 0; r < W; ++r) {
    CheckResult c = latch_check(st.k, int(r),
                                st.used_ptr[size_t(r)]->variable_batch_per_feature.value_or(false),
                                mode, rc.latched_batch.value_or(st.k));
    st.ctx_bad |= c.status == CheckStatus::fail;
    rc.log.record(std::move(c));
  }
}

// Where an element of rank r's local_embs lies: feature, source rank, sample, position.
TensorLayout lookup_layout(const RunContext& rc, const BatchState& st, int r) {
  const ShardingContext& dc = st.der.ranks[size_t(r)].ctx;
  if (rc.plan.module == ModuleKind::sequence)
    return TensorLayout::sequence_local_embs(
        rc.plan, st.der.ranks[size_t(r)].lookup_kjt.lengths,
        dc.batch_size_per_rank.value_or(std::vector<int64_t>{}));
  if (dc.batch_size_per_rank_per_feature)
    return TensorLayout::pooled_vbe_local_embs(rc.plan, *dc.batch_size_per_rank_per_feature);
  return TensorLayout::pooled_local_embs(rc.plan,
                                         dc.batch_size_per_rank.value_or(std::vector<int64_t>{}));
}

TensorLayout output_layout(const Plan& plan, const Kjt& kjt, const std::vector<int64_t>& shape) {
  if (plan.module == ModuleKind::sequence) return TensorLayout::sequence_output(plan, kjt);
  if (shape.size() == 1) {
    std::vector<int64_t> bpf;
    for (int64_t f = 0; f < plan.num_features(); ++f)
      bpf.push_back(kjt.is_vbe() ? kjt.stride_per_feature[size_t(f)] : kjt.stride());
    return TensorLayout::pooled_vbe_output(plan, bpf);
  }
  return TensorLayout::pooled_output(plan);
}

}  // namespace dynemb::replay_detail
