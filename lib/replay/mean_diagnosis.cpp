// The MEAN diagnoses of a replay (mean_diagnosis.hpp).
#include "replay/mean_diagnosis.hpp"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "common/error.hpp"
#include "engine/mean_pooling.hpp"
#include "replay/diff.hpp"

namespace dynemb::replay_detail {

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

void diagnose_local_means(const Plan& plan, const Tolerance& tol, CheckResult& c,
                          const EmbTensor& captured, const EmbTensor& sums, const LookupKjt& lk,
                          const TensorLayout& layout) {
  const EmbTensor means = per_rank_means(plan, lk, sums);
  // Evidence first: a MEAN element whose mean differs from its sum (a bag of two or more ids)
  // and whose captured value differs from the sum. Where every MEAN bag holds 0 or 1 ids a
  // mean is its sum, and a difference elsewhere (a SUM column) says nothing about MEAN.
  if (captured.data.size() != sums.data.size() || means.data.size() != sums.data.size()) return;
  bool evidence = false;
  for (size_t e = 0; e < sums.data.size() && !evidence; ++e)
    evidence = means.data[e] != sums.data[e] && !tol.accepts(captured.data[e], sums.data[e]);
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
          mean_tables(plan), where) +
      c.message;
}

void diagnose_output_after_callback(const Plan& plan, CheckResult& c, const EmbTensor& replayed,
                                    const EmbTensor& golden, const Kjt& kjt,
                                    const TensorLayout& layout) {
  const EmbTensor divided = mean_divided(plan, kjt, replayed);
  const TensorDiff d = diff_tensors(golden, divided, diagnosis_tolerance(), layout, 1);
  if (!d.shape_ok || d.mismatches != 0) return;
  c.cause = "output captured after the module's mean pooling";
  c.message =
      "output equals the MEAN-divided result: it was captured after the module's "
      "mean-pooling callback, not from the output dist (which returns the sums of MEAN "
      "tables). Capture the dist's result as output and the module's result as module_output "
      "(a synthetic capture whose output holds divided values is remade by synth). " +
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
void diagnose_module_divisor(const Plan& plan, const Tolerance& tol, CheckResult& m,
                             const EmbTensor& out, const RankBatch& rb) {
  if (!plan.any_mean || !rb.module_output) return;
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
    const EmbTensor documented = module_output(plan, kjt, out, inv);
    for (const Alt& a : alts) outs.push_back(module_output(plan, a.kjt, out, inv));
    std::vector<std::string> found;
    for (size_t f = 0; f < plan.features.size(); ++f) {
      const FeatureInfo& fi = plan.features[f];
      if (fi.pooling != PoolingMode::mean) continue;
      if (feature_columns_agree(documented, *rb.module_output, fi, plan.sum_dim, tol)) continue;
      const int documented_kind = by_weights(f) ? 1 : 0;
      for (size_t i = 0; i < alts.size(); ++i)
        if (alts[i].weights != documented_kind &&
            feature_columns_agree(outs[i], *rb.module_output, fi, plan.sum_dim,
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

}  // namespace dynemb::replay_detail
