// One batch whose lookups are derived, over column slices of the embeddings (replayer.hpp,
// column_slice.hpp): the slices' checks merge into exactly the whole batch's.
#include <fmt/format.h>

#include <algorithm>

#include "common/error.hpp"
#include "engine/dist_checks.hpp"
#include "engine/reference.hpp"
#include "replay/replayer.hpp"

namespace dynemb::replay_detail {

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

// The width of this batch's column slices, 0 to run it whole. Slices pay off when the output
// dist runs on lookups derived from the embedding source (all W of them in memory at once
// otherwise), and are taken only where the sliced checks are exactly the whole ones and no whole
// output must be kept: no --write-output, no captured local_embs (their lookup check and the
// dist over captured rows stay whole), no module_output (the mean-pooling step and its check
// take whole outputs), no golden output of a MEAN pooled plan (its diagnosis divides whole
// outputs), and for a variable batch the contexts' batch_size_per_rank_per_feature as derived
// (the reduce-scatter's chunks then hold whole bags, so a column of each is reduced on its own;
// a captured context that cuts bags elsewhere runs whole, to give the whole batch's result).
int64_t Replayer::slice_width(const BatchState& st) const {
  if (slice_cols_ <= 0 || slice_cols_ >= embedding_columns(plan_) || !source_ || writer_) return 0;
  for (int64_t r = 0; r < st.W; ++r) {
    const RankBatch& rb = st.batch().ranks[size_t(r)];
    if (rb.local_embs || rb.module_output) return 0;
    if (rb.output && plan_.any_mean && plan_.module == ModuleKind::pooled) return 0;
  }
  if (plan_.module == ModuleKind::pooled) {
    bool vbe = st.der.variable_batch || pooled_dist_->latched_variable_batch().value_or(false);
    for (const ShardingContext* c : st.used_ptr)
      vbe |= c->variable_batch_per_feature.value_or(false);
    for (int64_t r = 0; vbe && r < st.W; ++r)
      if (st.used_ptr[size_t(r)]->batch_size_per_rank_per_feature !=
          st.der.ranks[size_t(r)].ctx.batch_size_per_rank_per_feature)
        return 0;
  }
  return slice_cols_;
}

// 3-4 over column slices [c0, c0 + width): the W lookups of the slice, the output dist on them
// and each rank's output slice diffed with the golden output's and the reference's; the checks
// are emitted once every slice is merged, in the order the whole batch emits them. The context
// checks the dist makes (dist_checks.hpp) run first on the whole shapes, so a context that
// cannot work fails with the whole batch's words and numbers.
void Replayer::run_output_dist_sliced(BatchState& st, int64_t width) {
  const int64_t W = st.W, C = embedding_columns(plan_), k = st.k;
  st.got.assign(size_t(W), false);
  std::vector<SlicedDiffs> diffs(static_cast<size_t>(W));
  std::vector<EmbTensor> local;  // [W]: the slice of every rank's lookup
  std::vector<const EmbTensor*> local_ptr(static_cast<size_t>(W));
  bool variable_batch = false;
  // Each output slice checked where the backend makes it (slice_width: the host needs none
  // whole).
  const HeldOutputs held(backend_);
  // The first slice is one column: the bucketize outputs (W times three id-sized vectors) stay
  // until a first lookup has met every id (drop_derived_extras), so they sit beside one
  // column's lookups, not a whole slice's. The peak is then the larger of the two, not their sum.
  for (int64_t c0 = 0, c1 = std::min<int64_t>(C, 1); c0 < C;
       c0 = c1, c1 = std::min(C, c1 + width)) {
    ColumnSlice slice = make_column_slice(plan_, source_, c0, c1);
    // warn_zero_row warns of out-of-table ids once per lookup of the batch: on the first slice.
    // The rows looked up are those of `ignore` (lookup_row does not tell them apart).
    if (c0 > 0 && slice.plan.bounds_check == BoundsCheck::warn_zero_row)
      slice.plan.bounds_check = BoundsCheck::ignore;
    local.clear();  // the previous slice's, before the next is made
    at("lookup", -1);
    local = lookup(st, -1, &slice);
    for (int64_t r = 0; r < W; ++r) local_ptr[size_t(r)] = &local[size_t(r)];
    if (c0 == 0) drop_derived_extras(st);
    at("output dist", -1);
    try {
      if (c0 == 0) {
        std::vector<EmbTensor> whole(static_cast<size_t>(W));  // shapes only
        std::vector<const EmbTensor*> whole_ptr(static_cast<size_t>(W));
        for (int64_t r = 0; r < W; ++r) {
          whole[size_t(r)] =
              whole_lookup_shape(plan_, st.der.ranks[size_t(r)].lookup_kjt, local[size_t(r)]);
          whole_ptr[size_t(r)] = &whole[size_t(r)];
        }
        if (seq_dist_)
          check_sequence_dist(plan_, whole_ptr, st.used_ptr);
        else
          variable_batch = pooled_dist_->check(k, whole_ptr, st.used_ptr);
      }
      auto sink = [&](int r, EmbTensor&& out) {
        check_output_slice(st, r, slice, out, held.on, diffs[size_t(r)]);
        at("output dist", -1);
      };
      if (seq_dist_)
        backend_.sequence_output_dist(slice.plan, local_ptr, st.used_ptr, sink);
      else
        backend_.pooled_output_dist(slice.plan, variable_batch, local_ptr, st.used_ptr, sink);
    } catch (const OutputDistFailure& e) {
      output_dist_failed(st, e);
      return;
    }
  }
  local.clear();
  if (pooled_dist_ && !latched_batch_ && pooled_dist_->latched_variable_batch()) latched_batch_ = k;
  for (int64_t r = 0; r < W; ++r) {
    SlicedDiffs& d = diffs[size_t(r)];
    if (d.whole_shape.empty()) continue;  // never handed over
    at("output", int(r));
    st.got[size_t(r)] = true;
    EmbTensor shape;
    shape.shape = d.whole_shape;
    const TensorLayout layout = output_layout(st.batch().ranks[size_t(r)].kjt, shape);
    std::optional<CheckResult> gold, ref;
    if (d.gold) {
      locate_mismatches(*d.gold, layout);
      gold = tensor_check(k, int(r), "output", "golden", "replayed", "golden", *d.gold, tol_);
    }
    locate_mismatches(*d.ref, layout);
    ref = tensor_check(k, int(r), "output", "reference", "replayed", "reference", *d.ref, tol_);
    emit_output_checks(st, int(r), std::move(gold), std::move(ref), nullptr);
  }
}

// Once the first slice is looked up, the bucketize outputs are read no more (they trace an
// out-of-table id to its origin, and the first slice's lookup met every id): W times three
// id-sized vectors, given to the slices.
void Replayer::drop_derived_extras(BatchState& st) {
  for (DerivedRank& d : st.der.ranks) d.bucketized = BucketizedKjt{};
}

// Rank r's output slice `out`: diffed with the same columns of its golden output and of its
// unsharded reference, merged into `d`. A pair whose whole shapes differ is decided on the
// first slice (shape_mismatch, as the whole diff says it) and not compared further. `held`: the
// backend holds the slice (out has its shape, no data), and both are compared where it is.
void Replayer::check_output_slice(BatchState& st, int r, const ColumnSlice& slice,
                                  const EmbTensor& out, bool held, SlicedDiffs& d) {
  const int64_t maxm = opt_.max_mismatches;
  at("output", r);
  const RankBatch& rb = st.batch().ranks[size_t(r)];
  const SliceLayout l = output_slice_layout(plan_, slice, out, rb.kjt);
  const auto to_whole = [&l](int64_t e) { return l.to_whole(e); };
  if (d.whole_shape.empty()) {
    d.whole_shape = l.whole_shape;
    if (rb.output) {
      const int64_t n = EmbTensor{DType::f32, l.whole_shape, {}}.numel();
      d.gold = rb.output->shape == l.whole_shape && int64_t(rb.output->data.size()) == n
                   ? TensorDiff{}
                   : shape_mismatch(l.whole_shape, rb.output->shape);
    }
  }
  if (d.gold && d.gold->shape_ok) {
    EmbTensor want{rb.output->dtype, out.shape, std::vector<float>(size_t(out.numel()))};
    l.gather(rb.output->data.data(), want.data.data());
    if (!held) {
      merge_diff(*d.gold, diff_part(out, want, tol_, to_whole, maxm), maxm);
    } else {
      const std::optional<std::vector<TileDiff>> tiles = backend_.held_output_differences(
          r, want.data.data(), out.numel(), TileCompare{tol_, kCompareTile, maxm});
      if (!tiles)
        throw Error(fmt::format("batch {} rank {}: the backend holds no output of {} elements",
                                st.k, r, out.numel()));
      merge_diff(*d.gold, diff_tiles(out.numel(), *tiles, tol_, to_whole, maxm), maxm);
    }
  }
  if (d.ref && !d.ref->shape_ok) return;
  at("reference", r);
  if (!d.ref) {
    const EmbTensor want{out.dtype, reference_shape(slice.plan, rb.kjt), {}};
    const SliceLayout lw = output_slice_layout(plan_, slice, want, rb.kjt);
    d.ref = lw.whole_shape == l.whole_shape ? TensorDiff{}
                                            : shape_mismatch(l.whole_shape, lw.whole_shape);
    if (!d.ref->shape_ok) return;
  }
  // Compared as the backend makes the reference's runs: no reference tensor when they agree.
  std::optional<std::vector<TileDiff>> tiles;
  try {
    tiles = backend_.reference_differences(slice.plan, r, rb.kjt, *slice.source, st.k,
                                           held ? nullptr : out.data.data(), held ? r : -1,
                                           out.numel(), TileCompare{tol_, kCompareTile, maxm});
  } catch (const CaptureError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("unsharded reference: {}", e.what()));
  }
  if (!tiles)
    throw Error(fmt::format("unsharded reference of batch {} rank {}: not {} elements", st.k, r,
                            out.numel()));
  merge_diff(*d.ref, diff_tiles(out.numel(), *tiles, tol_, to_whole, maxm), maxm);
}

}  // namespace dynemb::replay_detail
