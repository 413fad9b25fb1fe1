#include "replay/lookup_check.hpp"

#include <fmt/format.h>

#include "common/error.hpp"
#include "engine/ops.hpp"
#include "replay/mean_diagnosis.hpp"

namespace dynemb::replay_detail {

namespace {

// fn() with a lookup's errors said in the capture's words.
template <class Fn>
auto capture_words(RunContext& rc, const BatchState& st, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const LookupBoundsError& e) {
    throw Error(fmt::format("{}:/batches/{}: {}", rc.opt.capture_path, st.k,
                            describe_lookup_bounds_error(rc.plan, st.kjts, st.der, e)));
  } catch (const Error& e) {  // bounds_check=error: name the file and the batch
    throw Error(fmt::format("{}:/batches/{}: {}", rc.opt.capture_path, st.k, e.what()));
  }
}

}  // namespace

std::vector<Tensor> lookups(RunContext& rc, const BatchState& st, int r, const Plan& plan,
                            const EmbeddingSource& source, bool dist_inputs) {
  Backend& backend = rc.backend.get();
  return capture_words(rc, st, [&] {
    if (r < 0 && dist_inputs) return derive_dist_inputs(plan, st.der, source, backend, st.k);
    std::vector<Tensor> out;
    if (r < 0) {
      for (EmbTensor& t : derive_local_embs(plan, st.der, source, backend, st.k))
        out.push_back(Tensor{std::move(t), std::nullopt});
      return out;
    }
    out.push_back(backend.lookup(plan, r, st.der.ranks[size_t(r)].lookup_kjt, source, Place::host));
    return out;
  });
}

LookupChecks::LookupChecks(RunContext& rc, BatchState& st)
    : rc_(rc),
      st_(st),
      diffs_(static_cast<size_t>(st.W)),
      comparable_(static_cast<size_t>(st.W), true) {}

bool LookupChecks::check(int s, const TensorRef& got, const LookupKjt& kjt,
                         const std::function<int64_t(int64_t)>& to_whole) {
  rc_.clock.enter("lookup", s);
  const int64_t maxm = rc_.opt.max_mismatches;
  const std::optional<std::vector<TileDiff>> tiles = capture_words(rc_, st_, [&] {
    return rc_.backend.get().comparator().compare_lookup(got, rc_.plan, s, kjt, *rc_.source,
                                                         rc_.how());
  });
  if (!tiles) {
    comparable_[size_t(s)] = false;
    return false;
  }
  merge_diff(diffs_[size_t(s)], diff_tiles(got.n, *tiles, rc_.tol, to_whole, maxm), maxm);
  return true;
}

void LookupChecks::check_whole(int s, const TensorRef& got, const EmbTensor* derived) {
  const EmbTensor& captured = *st_.cap_local[size_t(s)];
  const LookupKjt& lk = st_.der.ranks[size_t(s)].lookup_kjt;
  // Where the backend makes the lookup, unless the host holds it already or the shapes differ
  // (the host's diff then says how).
  if (!derived && lookup_output_shape(rc_.plan, lk) == captured.shape &&
      int64_t(captured.data.size()) == captured.numel())
    check(s, got, lk, [](int64_t e) { return e; });
  else
    comparable_[size_t(s)] = false;
  decide(s, derived);
}

void LookupChecks::decide(int s, const EmbTensor* derived) {
  rc_.clock.enter("lookup", s);
  const EmbTensor& got = *st_.cap_local[size_t(s)];
  const TensorLayout layout = lookup_layout(rc_, st_, s);
  std::vector<Tensor> made;
  auto want = [&]() -> const EmbTensor& {
    if (derived) return *derived;
    if (made.empty()) made = lookups(rc_, st_, s, rc_.plan, *rc_.source, false);
    return made[0].t;
  };
  TensorDiff& d = diffs_[size_t(s)];
  if (comparable_[size_t(s)])
    locate_mismatches(d, layout);
  else
    d = diff_tensors(got, want(), rc_.tol, layout, rc_.opt.max_mismatches);
  CheckResult c =
      tensor_check(st_.k, s, "lookup", "local_embs", "captured", "derived", std::move(d), rc_.tol);
  if (c.status == CheckStatus::fail && rc_.pooled_mean())
    diagnose_local_means(rc_.plan, rc_.tol, c, got, want(), st_.der.ranks[size_t(s)].lookup_kjt,
                         layout);
  st_.lookup_bad |= c.status == CheckStatus::fail;
  rc_.log.record(std::move(c));
}

}  // namespace dynemb::replay_detail
