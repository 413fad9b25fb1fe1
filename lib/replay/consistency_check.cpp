// The checks every set of contexts must pass whatever the plan (ctx_check.hpp): permutes that
// are bijections, splits that agree between senders and receivers, batch sizes that agree with
// the KJTs, and the pooled module's variable-batch latch.
#include <fmt/core.h>

#include <algorithm>
#include <numeric>
#include <optional>

#include "replay/ctx_check.hpp"
#include "replay/ctx_check_parts.hpp"

namespace dynemb {
using ctx_parts::make;
using ctx_parts::own_batch_size;
using ctx_parts::scalar_equal;

namespace {

// Element r of a per-rank vector of pointers, nullptr past its end.
template <class T>
const T* at(const std::vector<const T*>& v, int64_t r) {
  return r < int64_t(v.size()) ? v[size_t(r)] : nullptr;
}

// unbucketize_permute `p` of a rank with N ids is a bijection of [0, N) (output index i reads
// recv row p[i]).
CheckResult check_bijection(int64_t batch, int rank, const std::vector<int64_t>& p, int64_t N,
                            int64_t max_report) {
  CheckResult cr = make(batch, rank, "unbucketize_permute.bijection");
  cr.compared = int64_t(p.size());
  cr.got_label = "value";
  cr.want_label = "expected";
  std::vector<int64_t> first_use(size_t(std::max<int64_t>(N, 0)), -1);
  for (int64_t i = 0; i < int64_t(p.size()); ++i) {
    const int64_t v = p[size_t(i)];
    std::string why;
    if (v < 0 || v >= N) {
      why = fmt::format("out of range [0, {})", N);
    } else if (first_use[size_t(v)] >= 0) {
      why = fmt::format("duplicate of index {}", first_use[size_t(v)]);
    } else {
      first_use[size_t(v)] = i;
      continue;
    }
    ++cr.mismatches;
    if (int64_t(cr.details.size()) < max_report)
      cr.details.push_back(
          {{{"index", i, ""}}, std::to_string(v), "a bucketized position used once", why});
  }
  if (int64_t(p.size()) != N) ++cr.mismatches;
  if (cr.mismatches == 0) {
    cr.message = fmt::format("a permutation of [0, {})", N);
  } else {
    cr.status = CheckStatus::fail;
    if (int64_t(p.size()) != N)
      cr.message = fmt::format("length {} but rank {} has {} ids; ", p.size(), rank, N);
    if (!cr.details.empty()) {
      const Detail& d = cr.details.front();
      cr.message += fmt::format("not a bijection: {} bad entries, first at {}: value {} {}",
                                cr.mismatches, to_string(d.where), d.got, d.note);
    }
  }
  return cr;
}

// input_splits of rank r to d == output_splits of rank d from r, for every d (W ranks);
// nullopt unless every rank's context has output_splits.
std::optional<CheckResult> check_split_symmetry(int64_t batch, int64_t r, int64_t W,
                                                const std::vector<const ShardingContext*>& ctx,
                                                int64_t max_report) {
  const ShardingContext* c = at(ctx, r);
  const int rank = int(r);
  bool all = true;
  for (int64_t d = 0; d < W; ++d) all &= at(ctx, d) && at(ctx, d)->output_splits;
  if (!all) return std::nullopt;
  CheckResult cr = make(batch, rank, "input_splits.symmetry");
  cr.got_label = "input_splits";
  cr.want_label = "peer output_splits";
  const auto& in = *c->input_splits;
  for (int64_t d = 0; d < W && d < int64_t(in.size()); ++d) {
    const auto& peer = *at(ctx, d)->output_splits;
    if (r >= int64_t(peer.size())) continue;
    ++cr.compared;
    if (in[size_t(d)] == peer[size_t(r)]) continue;
    ++cr.mismatches;
    if (int64_t(cr.details.size()) < max_report)
      cr.details.push_back({{{"index", d, ""}},
                            std::to_string(in[size_t(d)]),
                            std::to_string(peer[size_t(r)]),
                            fmt::format("rank {} sends {} ids to rank {}, which expects {} (its "
                                        "output_splits[{}])",
                                        rank, in[size_t(d)], d, peer[size_t(r)], rank)});
  }
  if (cr.mismatches) {
    cr.status = CheckStatus::fail;
    const Detail& d = cr.details.front();
    cr.message = fmt::format(
        "{} of {} differ; first at {}: input_splits {} vs output_splits "
        "of the peer {} — {}",
        cr.mismatches, cr.compared, to_string(d.where), d.got, d.want, d.note);
  } else {
    cr.message = "input_splits[d] == output_splits[d][rank] for every d";
  }
  return cr;
}

}  // namespace

std::vector<CheckResult> consistency_checks(const Plan& plan, int64_t batch,
                                            const std::vector<const Kjt*>& kjts,
                                            const std::vector<const ShardingContext*>& ctx,
                                            const std::vector<const EmbTensor*>& local_embs,
                                            const std::vector<const EmbTensor*>& outputs,
                                            int64_t max_report) {
  std::vector<CheckResult> out;
  const int64_t W = int64_t(kjts.size());
  const bool sequence = plan.module == ModuleKind::sequence;

  for (int64_t r = 0; r < W; ++r) {
    const Kjt& kjt = *kjts[size_t(r)];
    const ShardingContext* c = at(ctx, r);
    const EmbTensor* le = at(local_embs, r);
    const EmbTensor* go = at(outputs, r);
    const int rank = int(r);
    const int64_t N = int64_t(kjt.values.size());

    // unbucketize_permute: a bijection of [0, N_r).
    if (c && c->unbucketize_permute)
      out.push_back(check_bijection(batch, rank, *c->unbucketize_permute, N, max_report));

    // input_splits of rank r to d == output_splits of rank d from r.
    if (c && c->input_splits) {
      if (auto cr = check_split_symmetry(batch, r, W, ctx, max_report))
        out.push_back(std::move(*cr));
      // The ids a rank sends are all its ids.
      out.push_back(scalar_equal(
          batch, rank, "input_splits.sum", "sum(input_splits)",
          std::accumulate(c->input_splits->begin(), c->input_splits->end(), int64_t{0}), "ids", N,
          fmt::format("rank {}'s KJT has {} ids", rank, N)));
    }

    // The rows rank r received are the rows of its local_embs (sequence).
    if (sequence && c && c->output_splits && le) {
      const auto& os = *c->output_splits;
      out.push_back(scalar_equal(
          batch, rank, "output_splits.sum", "sum(output_splits)",
          std::accumulate(os.begin(), os.end(), int64_t{0}), "local_embs rows", le->rows(),
          fmt::format("local_embs of rank {} has {} rows", rank, le->rows())));
    }
    if (sequence && c && c->lengths_after_input_dist && le) {
      const auto& l = *c->lengths_after_input_dist;
      out.push_back(scalar_equal(
          batch, rank, "lengths_after_input_dist.sum", "sum(lengths_after_input_dist)",
          std::accumulate(l.begin(), l.end(), int64_t{0}), "local_embs rows", le->rows(),
          fmt::format("local_embs of rank {} has {} rows", rank, le->rows())));
    }

    // Pooled: the reduce-scatter splits rows by batch_size_per_rank.
    if (!sequence && c && c->batch_size_per_rank) {
      const auto& bs = *c->batch_size_per_rank;
      if (le && le->shape.size() == 2) {
        out.push_back(scalar_equal(
            batch, rank, "batch_size_per_rank.sum", "sum(batch_size_per_rank)",
            std::accumulate(bs.begin(), bs.end(), int64_t{0}), "local_embs rows", le->rows(),
            fmt::format("local_embs of rank {} has {} rows", rank, le->rows())));
      }
      if (r < int64_t(bs.size())) {
        const int64_t own = own_batch_size(kjt);
        if (go && go->shape.size() == 2) {
          out.push_back(scalar_equal(
              batch, rank, "batch_size_per_rank.output_rows",
              fmt::format("batch_size_per_rank[{}]", r), bs[size_t(r)], "output rows", go->rows(),
              fmt::format("the golden output of rank {} has {} rows", rank, go->rows()), r));
        } else {
          out.push_back(scalar_equal(batch, rank, "batch_size_per_rank.own",
                                     fmt::format("batch_size_per_rank[{}]", r), bs[size_t(r)],
                                     "KJT batch size", own,
                                     fmt::format("rank {}'s KJT has batch size {}", rank, own), r));
        }
      }
    }
    // Pooled VBE: the 1-D layout's lengths follow batch_size_per_rank_per_feature.
    if (!sequence && c && c->batch_size_per_rank_per_feature) {
      const auto& m = *c->batch_size_per_rank_per_feature;
      auto elements = [&](const std::vector<int64_t>& row) {
        int64_t n = 0;
        for (int64_t f = 0; f < plan.num_features() && f < int64_t(row.size()); ++f)
          n += row[size_t(f)] * plan.features[size_t(f)].dim;
        return n;
      };
      if (le && le->shape.size() == 1) {
        int64_t n = 0;
        for (const auto& row : m) n += elements(row);
        out.push_back(
            scalar_equal(batch, rank, "batch_size_per_rank_per_feature.sum",
                         "sum_s sum_f B_{s,f} * D_f", n, "local_embs elements", le->numel(),
                         fmt::format("local_embs of rank {} has {} elements", rank, le->numel())));
      }
      if (go && go->shape.size() == 1 && r < int64_t(m.size())) {
        out.push_back(scalar_equal(
            batch, rank, "batch_size_per_rank_per_feature.output",
            fmt::format("sum_f B_{{{},f}} * D_f", r), elements(m[size_t(r)]), "output elements",
            go->numel(),
            fmt::format("the golden output of rank {} has {} elements", rank, go->numel()), r));
      }
    }
  }
  return out;
}

CheckResult latch_check(int64_t batch, int rank, bool flag, bool latched, int64_t latched_batch) {
  CheckResult c = make(batch, rank, "variable_batch_per_feature.latch");
  c.compared = 1;
  c.got_label = "flag";
  c.want_label = "latched";
  if (flag == latched) {
    c.message = fmt::format("{} matches the mode latched at batch {}", int(flag), latched_batch);
    return c;
  }
  c.status = CheckStatus::fail;
  c.mismatches = 1;
  const std::string note = fmt::format(
      "the output dist was built {} at batch {} and stays so; this batch's context says {}",
      latched ? "variable-batch" : "non-variable-batch", latched_batch,
      flag ? "variable batch" : "not variable batch");
  c.details.push_back(
      {{{"index", 0, ""}}, std::to_string(int(flag)), std::to_string(int(latched)), note});
  c.message = fmt::format("at index 0: flag {}, latched {} — {}", int(flag), int(latched), note);
  return c;
}

}  // namespace dynemb
