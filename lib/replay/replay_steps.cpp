// One batch replayed whole (replayer.hpp): the input dist derived, the contexts checked and
// chosen, the lookups checked, the output dist run and each rank's output checked against its
// golden output, its unsharded reference and the module output after it.
#include <fmt/format.h>

#include "common/error.hpp"
#include "engine/mean_pooling.hpp"
#include "engine/ops.hpp"
#include "engine/reference.hpp"
#include "replay/ctx_check.hpp"
#include "replay/replayer.hpp"

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

namespace {

// Values computed two ways (a division, or a multiplication by 1/len) agree to a few ulps:
// the diagnoses below compare with this instead of the replay's tolerance.
Tolerance diagnosis_tolerance() {
  return Tolerance::rel(1e-5, 1e-6);
}

// The MEAN columns a mismatch report names: "table t1 (features f1, f3)".
std::string mean_tables(const Plan& plan) {
  std::vector<std::string> out;
  for (const TableConfig& t : plan.tables)
    if (t.pooling == PoolingMode::mean) out.push_back(t.name);
  return fmt::format("{}", fmt::join(out, ", "));
}

}  // namespace

void Replayer::diagnose_local_means(CheckResult& c, const EmbTensor& captured,
                                    const EmbTensor& sums, const LookupKjt& lk,
                                    const TensorLayout& layout) const {
  const EmbTensor means = per_rank_means(plan_, lk, sums);
  // Evidence first: a MEAN element whose mean differs from its sum (a bag of two or more ids)
  // and whose captured value differs from the sum. Where every MEAN bag holds 0 or 1 ids a
  // mean is its sum, and a difference elsewhere (a SUM column) says nothing about MEAN.
  if (captured.data.size() != sums.data.size() || means.data.size() != sums.data.size()) return;
  bool evidence = false;
  for (size_t e = 0; e < sums.data.size() && !evidence; ++e)
    evidence = means.data[e] != sums.data[e] && !tol_.accepts(captured.data[e], sums.data[e]);
  if (!evidence) return;
  const TensorDiff d = diff_tensors(captured, means, diagnosis_tolerance(), layout, 1);
  if (!d.shape_ok || d.mismatches != 0) return;
  c.cause = "lookup kept MEAN pooling under RW";
  std::string where;
  if (!c.details.empty()) where = fmt::format(" (first at {})", to_string(c.details[0].where));
  c.message =
      fmt::format(
          "local_embs of MEAN table(s) {} hold per-rank means, not per-rank sums{}: the lookup "
          "kept "
          "PoolingMode.MEAN under row-wise sharding, so the module divides a second time. Under RW "
          "the lookup must run MEAN tables as SUM and leave the division to the module's "
          "mean-pooling step. ",
          mean_tables(plan_), where) +
      c.message;
}

void Replayer::diagnose_output_after_callback(CheckResult& c, const EmbTensor& replayed,
                                              const EmbTensor& golden, const Kjt& kjt,
                                              const TensorLayout& layout) const {
  const EmbTensor divided = mean_divided(plan_, kjt, replayed);
  const TensorDiff d = diff_tensors(golden, divided, diagnosis_tolerance(), layout, 1);
  if (!d.shape_ok || d.mismatches != 0) return;
  c.cause = "output captured after the module's mean pooling";
  c.message =
      "output equals the MEAN-divided result: it was captured after the module's "
      "mean-pooling callback, not from the output dist (which returns the sums of MEAN "
      "tables). Capture the dist's result as output and the module's result as module_output "
      "(a capture written by a dynemb-dist synth older than this rule holds divided values "
      "too: regenerate it with synth). " +
      c.message;
}

namespace {

// Rows x columns of feature f of two module outputs [B, sum_D] agree within `tol`.
bool feature_columns_agree(const EmbTensor& a, const EmbTensor& b, const FeatureInfo& fi,
                           int64_t sum_dim, const Tolerance& tol) {
  if (a.shape != b.shape || a.shape.size() != 2) return false;
  for (int64_t r = 0; r < a.rows(); ++r)
    for (int64_t c = fi.column_offset; c < fi.column_offset + fi.dim; ++c)
      if (!tol.accepts(a.data[size_t(r * sum_dim + c)], b.data[size_t(r * sum_dim + c)]))
        return false;
  return true;
}

// `kjt` with every feature's MEAN divisor set to `d`; `positions`: its weights replaced by each
// id's 0-based position in its bag (what TorchRec's input dist carries as the weights of a
// feature-processed module's KJT).
Kjt with_divisor(const Kjt& kjt, MeanDivisor d, bool positions) {
  Kjt k = kjt;
  if (positions) {
    k.weights.clear();
    for (int64_t len : kjt.lengths)
      for (int64_t i = 0; i < len; ++i) k.weights.push_back(static_cast<float>(i));
    k.weighted = true;
  }
  k.mean_divisor.assign(size_t(k.num_features), d);
  return k;
}

}  // namespace

// A failing module check whose MEAN columns match a division by another divisor than the
// documented one (the capture's mean_divisor): names each such feature and that divisor.
void Replayer::diagnose_module_divisor(CheckResult& m, const EmbTensor& out,
                                       const RankBatch& rb) const {
  if (!plan_.any_mean || !rb.module_output) return;
  const std::vector<int64_t>* inv = rb.inverse_indices ? &*rb.inverse_indices : nullptr;
  const Kjt& kjt = rb.kjt;
  auto by_weights = [&](size_t f) {
    return kjt.weighted &&
           (kjt.mean_divisor.empty() || kjt.mean_divisor[f] == MeanDivisor::weights);
  };
  struct Alt {
    Kjt kjt;
    std::string what;
    int weights;  // 1: the capture's weights, 0: the id count, -1: neither
  };
  std::vector<Alt> alts;
  alts.push_back({with_divisor(kjt, MeanDivisor::count, false), "the id count", 0});
  if (kjt.weighted)
    alts.push_back(
        {with_divisor(kjt, MeanDivisor::weights, false), "Σ of the captured weights", 1});
  alts.push_back({with_divisor(kjt, MeanDivisor::weights, true),
                  "Σ weights at the input dist: each id's 0-based position in its bag, which "
                  "TorchRec's position-weighted feature processor carries as the KJT's weights",
                  -1});
  std::vector<EmbTensor> outs;
  try {
    const EmbTensor documented = module_output(plan_, kjt, out, inv);
    for (const Alt& a : alts) outs.push_back(module_output(plan_, a.kjt, out, inv));
    std::vector<std::string> found;
    for (size_t f = 0; f < plan_.features.size(); ++f) {
      const FeatureInfo& fi = plan_.features[f];
      if (fi.pooling != PoolingMode::mean) continue;
      if (feature_columns_agree(documented, *rb.module_output, fi, plan_.sum_dim, tol_)) continue;
      const int documented_kind = by_weights(f) ? 1 : 0;
      for (size_t i = 0; i < alts.size(); ++i)
        if (alts[i].weights != documented_kind &&
            feature_columns_agree(outs[i], *rb.module_output, fi, plan_.sum_dim,
                                  diagnosis_tolerance())) {
          found.push_back(fmt::format("feature {}: module output = sums / ({}); MEAN expects {}",
                                      fi.name, alts[i].what,
                                      documented_kind ? "the sum of its weights" : "the id count"));
          break;
        }
    }
    if (found.empty()) return;
    m.cause = "module divides MEAN by another divisor (TorchRec's mean pooling)";
    m.message = fmt::format("{}. ", fmt::join(found, "; ")) + m.message;
  } catch (const Error&) {
  }
}

TensorLayout Replayer::output_layout(const Kjt& kjt, const EmbTensor& t) const {
  if (plan_.module == ModuleKind::sequence) return TensorLayout::sequence_output(plan_, kjt);
  if (t.shape.size() == 1) {
    std::vector<int64_t> bpf;
    for (int64_t f = 0; f < plan_.num_features(); ++f)
      bpf.push_back(kjt.is_vbe() ? kjt.stride_per_feature[size_t(f)] : kjt.stride());
    return TensorLayout::pooled_vbe_output(plan_, bpf);
  }
  return TensorLayout::pooled_output(plan_);
}

Replayer::BatchState::BatchState(int64_t k_, const Batch& batch_, int64_t W_)
    : k(k_),
      batch(batch_),
      W(W_),
      kjts(size_t(W_)),
      cap_ctx(size_t(W_), nullptr),
      cap_local(size_t(W_), nullptr),
      golden(size_t(W_), nullptr) {
  for (int64_t r = 0; r < W; ++r) {
    const RankBatch& rb = batch.ranks[size_t(r)];
    kjts[size_t(r)] = &rb.kjt;
    if (rb.ctx) cap_ctx[size_t(r)] = &*rb.ctx;
    if (rb.local_embs) cap_local[size_t(r)] = &*rb.local_embs;
    if (rb.output) golden[size_t(r)] = &*rb.output;
  }
}

// The input dist every rank ran: bucketize, the KJT all-to-all, the contexts.
void Replayer::derive_batch(BatchState& st) {
  at("input dist", -1);
  try {
    st.der = derive_input_dist(plan_, st.kjts);
  } catch (const OutputDistFailure& e) {
    throw Error(fmt::format("batch {}: input dist: {}", st.k, e.what()));
  } catch (const CaptureError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("{}:/batches/{}: {}", opt_.capture_path, st.k, e.what()));
  }
}

// 1. Captured context vs derived, field by field, and the plan-free checks.
void Replayer::check_contexts(BatchState& st) {
  const int64_t k = st.k, W = st.W;
  for (const RankBatch& rb : st.batch().ranks) ctx_seen_ |= rb.ctx.has_value();
  std::vector<int64_t> no_ctx;  // ranks of this batch without ctx/ while others have one
  for (int64_t r = 0; r < W; ++r) {
    at("ctx", int(r));
    const RankBatch& rb = st.batch().ranks[size_t(r)];
    if (!rb.ctx) {
      if (ctx_seen_) no_ctx.push_back(r);
      continue;
    }
    for (CheckResult& c : diff_context(plan_, k, int(r), rb.kjt, st.der.ranks[size_t(r)], *rb.ctx,
                                       opt_.max_mismatches)) {
      st.ctx_bad |= c.status == CheckStatus::fail;
      emit(std::move(c));
    }
  }
  if (!no_ctx.empty()) {
    warn(
        fmt::format("batch {}: rank(s) {} have no ctx/ group while other rank-batches have one: "
                    "their context checks are skipped and the output dist uses the derived "
                    "context for them",
                    k, fmt::join(no_ctx, ", ")));
    for (int64_t r : no_ctx)
      emit(skipped(k, int(r), "ctx", "context",
                   "no ctx/ group in this rank-batch (other rank-batches have one): the captured "
                   "context cannot be compared"));
  }
  at("ctx", -1);
  for (CheckResult& c : consistency_checks(plan_, k, st.kjts, st.cap_ctx, st.cap_local, st.golden,
                                           opt_.max_mismatches)) {
    st.ctx_bad |= c.status == CheckStatus::fail;
    emit(std::move(c));
  }
}

// 2. The context the output dist gets (captured fields over derived ones in --ctx captured),
// and the pooled module's variable-batch latch checked on it.
void Replayer::choose_contexts(BatchState& st) {
  const int64_t W = st.W;
  st.used.resize(size_t(W));
  st.used_ptr.resize(size_t(W));
  for (int64_t r = 0; r < W; ++r) {
    ShardingContext& d = st.der.ranks[size_t(r)].ctx;
    if (use_captured_ && st.cap_ctx[size_t(r)]) {
      st.used[size_t(r)] = merge_ctx(*st.cap_ctx[size_t(r)], d);
      st.used_ptr[size_t(r)] = &st.used[size_t(r)];
    } else {
      st.used_ptr[size_t(r)] = &d;  // not copied: a context holds id-sized vectors
    }
  }
  if (!pooled_dist_) return;
  const std::optional<bool> latched = pooled_dist_->latched_variable_batch();
  const bool mode = latched ? *latched : st.used_ptr[0]->variable_batch_per_feature.value_or(false);
  for (int64_t r = 0; r < W; ++r) {
    CheckResult c = latch_check(st.k, int(r),
                                st.used_ptr[size_t(r)]->variable_batch_per_feature.value_or(false),
                                mode, latched_batch_.value_or(st.k));
    st.ctx_bad |= c.status == CheckStatus::fail;
    emit(std::move(c));
  }
}

// The lookup of rank r (all ranks when r < 0) from the embedding source, with the file and the
// batch named on trouble (an out-of-table id gets the id, sample and routing).
// `slice`: only its columns (its plan and source).
template <class Fn>
auto Replayer::lookup_errors(const BatchState& st, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const LookupBoundsError& e) {
    throw Error(fmt::format("{}:/batches/{}: {}", opt_.capture_path, st.k,
                            describe_lookup_bounds_error(plan_, st.kjts, st.der, e)));
  } catch (const Error& e) {  // bounds_check=error: name the file and the batch
    throw Error(fmt::format("{}:/batches/{}: {}", opt_.capture_path, st.k, e.what()));
  }
}

std::vector<EmbTensor> Replayer::lookup(const BatchState& st, int r, const ColumnSlice* slice) {
  const Plan& plan = slice ? slice->plan : plan_;
  const EmbeddingSource& source = slice ? *slice->source : *source_;
  return lookup_errors(st, [&] {
    // A slice's lookups are only its dist's inputs: a device backend keeps them (lookup_for_dist).
    if (r < 0 && slice) return derive_dist_inputs(plan, st.der, source, backend_, st.k);
    if (r < 0) return derive_local_embs(plan, st.der, source, backend_, st.k);
    std::vector<EmbTensor> one;
    one.push_back(backend_.lookup(plan, r, st.der.ranks[size_t(r)].lookup_kjt, source));
    return one;
  });
}

// Rank r's lookup against the captured `got`, compared where the backend makes the lookup
// (Backend::lookup_differences: a device backend brings back only the tiles that differ, and
// keeps `got` for the pooled dist that follows). nullopt when the shapes differ: the host's diff
// says how.
std::optional<TensorDiff> Replayer::lookup_diff_where_made(const BatchState& st, int r,
                                                           const EmbTensor& got,
                                                           const TensorLayout& layout) {
  const LookupKjt& lk = st.der.ranks[size_t(r)].lookup_kjt;
  const int64_t n = got.numel(), maxm = opt_.max_mismatches;
  if (lookup_output_layout(plan_, lk).shape != got.shape || int64_t(got.data.size()) != n)
    return std::nullopt;
  const std::optional<std::vector<TileDiff>> tiles = lookup_errors(st, [&] {
    return backend_.lookup_differences(plan_, r, lk, *source_, got.data.data(), n,
                                       TileCompare{tol_, kCompareTile, maxm});
  });
  if (!tiles) return std::nullopt;
  TensorDiff d = diff_tiles(
      n, *tiles, tol_, [](int64_t e) { return e; }, maxm);
  locate_mismatches(d, layout);
  return d;
}

// 3. Lookup: captured local_embs vs the lookup derived from the embedding source. When the
// output dist needs derived lookups for some rank, all ranks are derived at once (they are kept
// for step 4); otherwise rank by rank, so only one derived lookup is in memory.
void Replayer::check_lookup(BatchState& st) {
  const int64_t W = st.W;
  bool need_all_derived = false;
  for (int64_t r = 0; r < W; ++r) need_all_derived |= !(use_captured_ && st.cap_local[size_t(r)]);
  if (!source_) return;  // no lookup to compare with (reported once in the warnings)
  if (need_all_derived) {
    at("lookup", -1);
    st.derived_local = lookup(st, -1);
  }
  for (int64_t r = 0; r < W; ++r) {
    if (!st.cap_local[size_t(r)]) continue;
    at("lookup", int(r));
    const TensorLayout layout = lookup_layout(st, int(r));
    const EmbTensor& got = *st.cap_local[size_t(r)];
    // Rank by rank, where the backend makes the lookup; the host makes it whole only when the
    // shapes differ or a MEAN diagnosis needs its sums.
    std::optional<TensorDiff> diff;
    if (!need_all_derived) diff = lookup_diff_where_made(st, int(r), got, layout);
    std::vector<EmbTensor> one;
    auto want = [&]() -> const EmbTensor& {
      if (need_all_derived) return st.derived_local[size_t(r)];
      if (one.empty()) one = lookup(st, int(r));
      return one[0];
    };
    if (!diff) diff = diff_tensors(got, want(), tol_, layout, opt_.max_mismatches);
    CheckResult c = tensor_check(st.k, int(r), "lookup", "local_embs", "captured", "derived",
                                 std::move(*diff), tol_);
    if (c.status == CheckStatus::fail && plan_.any_mean && plan_.module == ModuleKind::pooled)
      diagnose_local_means(c, got, want(), st.der.ranks[size_t(r)].lookup_kjt, layout);
    st.lookup_bad |= c.status == CheckStatus::fail;
    emit(std::move(c));
  }
}

// Where an element of rank r's local_embs lies: feature, source rank, sample, position.
TensorLayout Replayer::lookup_layout(const BatchState& st, int r) const {
  const ShardingContext& dc = st.der.ranks[size_t(r)].ctx;
  if (plan_.module == ModuleKind::sequence)
    return TensorLayout::sequence_local_embs(
        plan_, st.der.ranks[size_t(r)].lookup_kjt.lengths,
        dc.batch_size_per_rank.value_or(std::vector<int64_t>{}));
  if (dc.batch_size_per_rank_per_feature)
    return TensorLayout::pooled_vbe_local_embs(plan_, *dc.batch_size_per_rank_per_feature);
  return TensorLayout::pooled_local_embs(plan_,
                                         dc.batch_size_per_rank.value_or(std::vector<int64_t>{}));
}

// The cause a failed check names, from the evidence of the batch so far.
std::string Replayer::BatchState::cause_before_output() const {
  return ctx_bad ? "context" : lookup_bad ? "lookup/local_embs" : "";
}

// 4a. Rank r's output as the output dist hands it over: vs golden, vs the unsharded reference,
// and the module's output after the mean-pooling step.
// `held`: the backend holds the output (out has its shape, no data), and both checks are made
// where it is.
void Replayer::check_output(BatchState& st, int r, EmbTensor&& out,
                            std::vector<std::optional<EmbTensor>>& kept, bool held) {
  const int64_t k = st.k, maxm = opt_.max_mismatches;
  at("output", r);
  st.got[size_t(r)] = true;
  const RankBatch& rb = st.batch().ranks[size_t(r)];
  const TensorLayout layout = output_layout(rb.kjt, out);
  std::optional<CheckResult> gold, ref;
  if (rb.output)
    gold = tensor_check(k, r, "output", "golden", "replayed", "golden",
                        held ? held_golden_diff(st, r, out, layout)
                             : diff_tensors(out, *rb.output, tol_, layout, maxm),
                        tol_);
  if (source_) {
    at("reference", r);
    TensorDiff d = held ? held_reference_diff(st, r, out, layout)
                        : diff_tensors(out, reference(st, r), tol_, layout, maxm);
    ref = tensor_check(k, r, "output", "reference", "replayed", "reference", std::move(d), tol_);
  }
  emit_output_checks(st, r, std::move(gold), std::move(ref), held ? nullptr : &out);
  if (!opt_.write_output.empty()) kept[size_t(r)] = std::move(out);
}

bool Replayer::outputs_may_stay(const BatchState& st) const {
  if (!opt_.write_output.empty()) return false;
  for (const RankBatch& rb : st.batch().ranks) {
    if (rb.module_output) return false;
    if (rb.output && plan_.any_mean && plan_.module == ModuleKind::pooled) return false;
  }
  return true;
}

// The held output of rank r against its golden output: what diff_tensors says of the pair.
TensorDiff Replayer::held_golden_diff(const BatchState& st, int r, const EmbTensor& out,
                                      const TensorLayout& layout) {
  const EmbTensor& golden = *st.batch().ranks[size_t(r)].output;
  const int64_t n = out.numel(), maxm = opt_.max_mismatches;
  if (golden.shape != out.shape || int64_t(golden.data.size()) != n)
    return shape_mismatch(out.shape, golden.shape);
  const std::optional<std::vector<TileDiff>> tiles = backend_.held_output_differences(
      r, golden.data.data(), n, TileCompare{tol_, kCompareTile, maxm});
  if (!tiles)
    throw Error(
        fmt::format("batch {} rank {}: the backend holds no output of {} elements", st.k, r, n));
  TensorDiff d = diff_tiles(
      n, *tiles, tol_, [](int64_t e) { return e; }, maxm);
  locate_mismatches(d, layout);
  return d;
}

// The held output of rank r against its unsharded reference, made and compared where the
// output is: what diff_tensors says of the pair.
TensorDiff Replayer::held_reference_diff(const BatchState& st, int r, const EmbTensor& out,
                                         const TensorLayout& layout) {
  const Kjt& kjt = st.batch().ranks[size_t(r)].kjt;
  const int64_t n = out.numel(), maxm = opt_.max_mismatches;
  std::optional<std::vector<TileDiff>> tiles;
  try {
    tiles = backend_.reference_differences(plan_, r, kjt, *source_, st.k, nullptr, r, n,
                                           TileCompare{tol_, kCompareTile, maxm});
  } catch (const CaptureError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("unsharded reference: {}", e.what()));
  }
  const std::vector<int64_t> want = reference_shape(plan_, kjt);
  if (!tiles || want != out.shape) return shape_mismatch(out.shape, want);
  TensorDiff d = diff_tiles(
      n, *tiles, tol_, [](int64_t e) { return e; }, maxm);
  locate_mismatches(d, layout);
  return d;
}

// The unsharded reference of rank r (`slice`: its columns).
EmbTensor Replayer::reference(const BatchState& st, int r, const ColumnSlice* slice) {
  try {
    return reference_output(slice ? slice->plan : plan_, r, st.batch().ranks[size_t(r)].kjt,
                            slice ? *slice->source : *source_, st.k);
  } catch (const CaptureError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("unsharded reference: {}", e.what()));
  }
}

// Rank r's output checks decided (vs golden, vs reference), with their causes, and the module's
// output after the mean-pooling step. `out`, the replayed output, is needed for the MEAN
// diagnosis and the module output (a sliced batch has neither: slice_width).
void Replayer::emit_output_checks(BatchState& st, int r, std::optional<CheckResult> gold,
                                  std::optional<CheckResult> ref, const EmbTensor* out) {
  const int64_t k = st.k, maxm = opt_.max_mismatches;
  const RankBatch& rb = st.batch().ranks[size_t(r)];
  const std::string upstream = st.cause_before_output();
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
    if (plan_.any_mean && plan_.module == ModuleKind::pooled && out)
      diagnose_output_after_callback(*gold, *out, *rb.output, rb.kjt, output_layout(rb.kjt, *out));
  }
  if (gold) emit(std::move(*gold));
  if (ref) emit(std::move(*ref));
  if (rb.module_output && out) {
    at("module", r);
    CheckResult m;
    try {
      const EmbTensor mo =
          module_output(plan_, rb.kjt, *out, rb.inverse_indices ? &*rb.inverse_indices : nullptr);
      m = tensor_check(
          k, r, "module", "module_output", "replayed", "captured",
          diff_tensors(mo, *rb.module_output, tol_, TensorLayout::pooled_output(plan_), maxm),
          tol_);
    } catch (const Error& e) {
      m = skipped(k, r, "module", "module_output", e.what());
    }
    if (m.status == CheckStatus::fail) {
      m.cause = !upstream.empty() ? upstream
                : gold && gold->status == CheckStatus::fail
                    ? "the dist's output already differs"
                    : "module (the mean-pooling step after the dist)";
      if (upstream.empty() && !(gold && gold->status == CheckStatus::fail))
        diagnose_module_divisor(m, *out, rb);
    }
    emit(std::move(m));
  }
  progress_rank_done(k);
}

// Every output check of the ranks the output dist has not handed over, skipped with `why`.
void Replayer::skip_outputs(const BatchState& st, const std::string& why) {
  for (int64_t r = 0; r < st.W; ++r) {
    if (st.got[size_t(r)]) continue;
    if (st.golden[size_t(r)]) emit(skipped(st.k, int(r), "output", "golden", why));
    if (source_) emit(skipped(st.k, int(r), "output", "reference", why));
    if (st.batch().ranks[size_t(r)].module_output)
      emit(skipped(st.k, int(r), "module", "module_output", why));
  }
}

// 4. The output dist on the chosen inputs (captured local_embs in --ctx captured, else the
// derived lookups), each rank's output checked as it arrives. Returns the outputs for
// --write-output (rank order), nullopt where the dist did not run.
std::vector<std::optional<EmbTensor>> Replayer::run_output_dist(BatchState& st) {
  const int64_t W = st.W;
  std::vector<const EmbTensor*> local(size_t(W), nullptr);
  bool runnable = true;
  for (int64_t r = 0; r < W; ++r) {
    if (use_captured_ && st.cap_local[size_t(r)])
      local[size_t(r)] = st.cap_local[size_t(r)];
    else if (!st.derived_local.empty())
      local[size_t(r)] = &st.derived_local[size_t(r)];
    else if (st.cap_local[size_t(r)])  // --ctx derived without an embedding source
      local[size_t(r)] = st.cap_local[size_t(r)];
    runnable &= local[size_t(r)] != nullptr;
  }
  std::vector<std::optional<EmbTensor>> kept(static_cast<size_t>(W));
  st.got.assign(size_t(W), false);
  if (!runnable) {
    if (!warned_no_local_)
      warn(
          "some ranks have no local_embs and there is no embedding source to derive them: "
          "their output dist is not run; synth or capture with --store local_embs, or add /oracle "
          "or /tables/<name>/weight to the capture");
    warned_no_local_ = true;
    skip_outputs(st, "no local_embs captured and no embedding source to derive them");
    return kept;
  }
  at("output dist", -1);
  // Outputs checked where the backend makes them when the host needs none of them whole.
  std::optional<HeldOutputs> held;
  if (outputs_may_stay(st)) held.emplace(backend_);
  const bool on = held && held->on;
  auto sink = [&](int r, EmbTensor&& out) {
    check_output(st, r, std::move(out), kept, on);
    at("output dist", -1);
  };
  try {
    if (seq_dist_) {
      seq_dist_->forward(local, st.used_ptr, sink);
    } else {
      pooled_dist_->forward(st.k, local, st.used_ptr, sink);
      if (!latched_batch_ && pooled_dist_->latched_variable_batch()) latched_batch_ = st.k;
    }
  } catch (const OutputDistFailure& e) {
    output_dist_failed(st, e);
  }
  return kept;
}

// The crash a real rank would have had: a context mismatch finding, not trouble; no output
// checks for the ranks not handed over.
void Replayer::output_dist_failed(BatchState& st, const OutputDistFailure& e) {
  CheckResult c;
  c.batch = st.k;
  c.rank = e.rank();
  c.stage = "ctx";
  c.check = "output_dist";
  c.status = CheckStatus::fail;
  c.mismatches = 1;
  c.compared = 1;
  c.message = fmt::format("the output dist cannot run with this context (field {}): {}", e.field(),
                          e.what());
  emit(std::move(c));
  skip_outputs(st, fmt::format("the output dist failed on rank {} ({})", e.rank(), e.field()));
}

}  // namespace dynemb::replay_detail
