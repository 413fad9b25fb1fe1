#include "replay/ctx_check.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>

namespace dynemb {
namespace {

const std::string& fname(const Plan& plan, int64_t f) {
  static const std::string kUnknown = "?";
  return f >= 0 && f < plan.num_features() ? plan.features[size_t(f)].name : kUnknown;
}

// Coordinates of element i of a vector field; 2-D fields ([rows, cols]) add row and col.
Coords field_coords(int64_t i, int64_t cols) {
  if (cols <= 0) return {{"index", i, ""}};
  return {{"index", i, ""}, {"row", i / cols, ""}, {"col", i % cols, ""}};
}

CheckResult make(int64_t batch, int rank, const std::string& check) {
  CheckResult c;
  c.batch = batch;
  c.rank = rank;
  c.stage = "ctx";
  c.check = check;
  return c;
}

// Element-wise diff of a captured integer vector against the derived one. `cols` > 0 marks
// a 2-D field; `note(i)` says what the plan implies for element i.
template <class T>
CheckResult diff_vector(int64_t batch, int rank, const std::string& field,
                        const std::vector<T>& got, const std::vector<T>& want, int64_t cols,
                        const std::function<std::string(int64_t)>& note, int64_t max_report) {
  CheckResult c = make(batch, rank, field);
  const int64_t n = int64_t(std::min(got.size(), want.size()));
  c.compared = int64_t(std::max(got.size(), want.size()));
  for (int64_t i = 0; i < n; ++i) {
    if (got[size_t(i)] == want[size_t(i)]) continue;
    ++c.mismatches;
    if (int64_t(c.details.size()) < max_report)
      c.details.push_back({field_coords(i, cols), std::to_string(got[size_t(i)]),
                           std::to_string(want[size_t(i)]), note(i)});
  }
  const bool length_differs = got.size() != want.size();
  if (length_differs) c.mismatches += int64_t(std::max(got.size(), want.size())) - n;
  if (c.mismatches == 0) {
    c.message = fmt::format("{} elements equal the derived context", n);
    return c;
  }
  c.status = CheckStatus::fail;
  if (length_differs) {
    c.message = fmt::format("captured length {}, derived length {}", got.size(), want.size());
    if (!c.details.empty()) c.message += "; ";
  } else {
    c.message = fmt::format("{} of {} elements differ; ", c.mismatches, n);
  }
  if (!c.details.empty()) {
    const Detail& d = c.details.front();
    c.message +=
        fmt::format("first at {}: captured {}, derived {}", to_string(d.where), d.got, d.want);
    if (!d.note.empty()) c.message += " — " + d.note;
  }
  return c;
}

CheckResult scalar_flag(int64_t batch, int rank, const std::string& field, bool got, bool want,
                        const std::string& note) {
  CheckResult c = make(batch, rank, field);
  c.compared = 1;
  if (got == want) {
    c.message = fmt::format("{} as derived", int(got));
    return c;
  }
  c.status = CheckStatus::fail;
  c.mismatches = 1;
  c.details.push_back(
      {{{"index", 0, ""}}, std::to_string(int(got)), std::to_string(int(want)), note});
  c.message = fmt::format("at index 0: captured {}, derived {} — {}", int(got), int(want), note);
  return c;
}

// Field present in the capture that the derived context does not set at all.
CheckResult unexpected(int64_t batch, int rank, const std::string& field, const std::string& why) {
  CheckResult c = make(batch, rank, field);
  c.status = CheckStatus::fail;
  c.compared = 1;
  c.mismatches = 1;
  c.message = fmt::format("captured but the derived context has none: {}", why);
  return c;
}

template <class T>
std::vector<T> flatten(const std::vector<std::vector<T>>& m) {
  std::vector<T> v;
  for (const auto& row : m) v.insert(v.end(), row.begin(), row.end());
  return v;
}

// A plan-free equality of two derived quantities, e.g. sum(input_splits) == ids of the KJT.
CheckResult scalar_equal(int64_t batch, int rank, const std::string& check,
                         const std::string& got_label, int64_t got, const std::string& want_label,
                         int64_t want, const std::string& note, int64_t index = -1) {
  CheckResult c = make(batch, rank, check);
  c.compared = 1;
  c.got_label = got_label;
  c.want_label = want_label;
  const Coords where = index >= 0 ? Coords{{"index", index, ""}} : Coords{};
  if (got == want) {
    c.message = fmt::format("{} == {} = {}", got_label, want_label, want);
    return c;
  }
  c.status = CheckStatus::fail;
  c.mismatches = 1;
  c.details.push_back({where, std::to_string(got), std::to_string(want), note});
  c.message =
      fmt::format("{}{} {} != {} {} — {}", index >= 0 ? fmt::format("at index {}: ", index) : "",
                  got_label, got, want_label, want, note);
  return c;
}

// B_r of a KJT: the stride (non-VBE) or max_f B_f (VBE).
int64_t own_batch_size(const Kjt& kjt) {
  if (!kjt.stride_per_feature.empty())
    return *std::max_element(kjt.stride_per_feature.begin(), kjt.stride_per_feature.end());
  return kjt.num_features > 0 ? int64_t(kjt.lengths.size()) / kjt.num_features : 0;
}

}  // namespace

namespace {

// diff_context of the splits and the batch sizes (input_splits, output_splits,
// batch_size_per_rank, batch_size_per_rank_per_feature), appended to `out`.
void diff_splits_and_batch_sizes(const Plan& plan, int64_t batch, int rank,
                                 const ShardingContext& want, const ShardingContext& captured,
                                 int64_t max_report, std::vector<CheckResult>& out) {
  const int64_t F = plan.num_features();
  if (captured.input_splits) {
    if (!want.input_splits) {
      out.push_back(unexpected(batch, rank, "input_splits", "the module does not set it"));
    } else {
      const auto& w = *want.input_splits;
      out.push_back(diff_vector<int64_t>(
          batch, rank, "input_splits", *captured.input_splits, w, 0,
          [&](int64_t d) {
            return fmt::format("plan routes {} ids of rank {} to rank {}", w[size_t(d)], rank, d);
          },
          max_report));
    }
  }
  if (captured.output_splits) {
    if (!want.output_splits) {
      out.push_back(unexpected(batch, rank, "output_splits", "the module does not set it"));
    } else {
      const auto& w = *want.output_splits;
      out.push_back(diff_vector<int64_t>(
          batch, rank, "output_splits", *captured.output_splits, w, 0,
          [&](int64_t s) {
            return fmt::format("plan routes {} ids of rank {} to rank {}", w[size_t(s)], s, rank);
          },
          max_report));
    }
  }
  if (captured.batch_size_per_rank) {
    if (!want.batch_size_per_rank) {
      out.push_back(unexpected(batch, rank, "batch_size_per_rank",
                               "TorchRec never sets it in a variable-batch batch"));
    } else {
      const auto& w = *want.batch_size_per_rank;
      out.push_back(diff_vector<int64_t>(
          batch, rank, "batch_size_per_rank", *captured.batch_size_per_rank, w, 0,
          [&](int64_t s) {
            return fmt::format("rank {}'s KJT has batch size {}", s, w[size_t(s)]);
          },
          max_report));
    }
  }
  if (captured.batch_size_per_rank_per_feature) {
    if (!want.batch_size_per_rank_per_feature) {
      out.push_back(unexpected(batch, rank, "batch_size_per_rank_per_feature",
                               "the batch is not variable-batch (no KJT has stride_per_feature)"));
    } else {
      const auto w = flatten(*want.batch_size_per_rank_per_feature);
      const auto g = flatten(*captured.batch_size_per_rank_per_feature);
      out.push_back(diff_vector<int64_t>(
          batch, rank, "batch_size_per_rank_per_feature", g, w, F,
          [&](int64_t i) {
            return fmt::format("rank {}'s KJT has {} samples of feature {}",
                               i / std::max<int64_t>(1, F), w[size_t(i)],
                               fname(plan, i % std::max<int64_t>(1, F)));
          },
          max_report));
    }
  }
}

// diff_context of the layout of the lookup KJT (sparse_features_recat, unbucketize_permute,
// lengths_after_input_dist), appended to `out`.
void diff_lookup_layout(const Plan& plan, int64_t batch, int rank, const Kjt& kjt,
                        const DerivedRank& derived, const ShardingContext& captured,
                        int64_t max_report, std::vector<CheckResult>& out) {
  const ShardingContext& want = derived.ctx;
  const int64_t W = plan.world_size, F = plan.num_features();
  if (captured.sparse_features_recat) {
    if (!want.sparse_features_recat) {
      out.push_back(unexpected(batch, rank, "sparse_features_recat", "the module does not set it"));
    } else {
      const auto& w = *want.sparse_features_recat;
      const bool segments = int64_t(w.size()) == F * W;
      out.push_back(diff_vector<int32_t>(
          batch, rank, "sparse_features_recat", *captured.sparse_features_recat, w, 0,
          [&](int64_t k) {
            if (segments) {
              const int64_t f = k / std::max<int64_t>(1, W), s = k % std::max<int64_t>(1, W);
              return fmt::format(
                  "segment (feature {}, source rank {}) takes input segment {} = s*F+f",
                  fname(plan, f), s, w[size_t(k)]);
            }
            return fmt::format(
                "recat is expanded per bag (batch sizes differ): output bag {} takes input bag {}",
                k, w[size_t(k)]);
          },
          max_report));
    }
  }
  if (captured.unbucketize_permute) {
    if (!want.unbucketize_permute) {
      out.push_back(unexpected(batch, rank, "unbucketize_permute", "pooled modules do not set it"));
    } else {
      const auto& w = *want.unbucketize_permute;
      const KjtIndex index(kjt);
      out.push_back(diff_vector<int64_t>(
          batch, rank, "unbucketize_permute", *captured.unbucketize_permute, w, 0,
          [&](int64_t i) {
            const IdPosition p = index.locate(i);
            const int64_t dest = size_t(i) < derived.bucketized.dest_rank.size()
                                     ? derived.bucketized.dest_rank[size_t(i)]
                                     : -1;
            const int64_t id = size_t(i) < kjt.values.size() ? kjt.values[size_t(i)] : 0;
            return fmt::format(
                "id {} (feature {}, sample {}, position {}) is routed to rank {}, bucketized "
                "position {}",
                id, fname(plan, p.feature), p.sample, p.position, dest, w[size_t(i)]);
          },
          max_report));
    }
  }
  if (captured.lengths_after_input_dist) {
    if (!want.lengths_after_input_dist) {
      out.push_back(
          unexpected(batch, rank, "lengths_after_input_dist", "pooled modules do not set it"));
    } else {
      const auto& w = *want.lengths_after_input_dist;
      const int64_t C = std::max<int64_t>(1, want.lengths_after_input_dist_cols);
      // Column j of feature f is (source rank s, sample b): B_s from the derived context.
      std::vector<int64_t> rank_begin{0};
      if (want.batch_size_per_rank)
        for (int64_t b : *want.batch_size_per_rank) rank_begin.push_back(rank_begin.back() + b);
      out.push_back(diff_vector<int64_t>(
          batch, rank, "lengths_after_input_dist", *captured.lengths_after_input_dist, w, C,
          [&](int64_t i) {
            const int64_t f = i / C, j = i % C;
            int64_t s = 0;
            while (s + 1 < int64_t(rank_begin.size()) - 1 && rank_begin[size_t(s + 1)] <= j) ++s;
            const int64_t b = rank_begin.size() > 1 ? j - rank_begin[size_t(s)] : j;
            return fmt::format(
                "plan routes {} ids of bag (feature {}, source rank {}, sample {}) to rank {}",
                w[size_t(i)], fname(plan, f), s, b, rank);
          },
          max_report));
    }
  }
}

}  // namespace

std::vector<CheckResult> diff_context(const Plan& plan, int64_t batch, int rank, const Kjt& kjt,
                                      const DerivedRank& derived, const ShardingContext& captured,
                                      int64_t max_report) {
  std::vector<CheckResult> out;
  const ShardingContext& want = derived.ctx;
  const bool vbe = want.variable_batch_per_feature.value_or(false);
  diff_splits_and_batch_sizes(plan, batch, rank, want, captured, max_report, out);
  diff_lookup_layout(plan, batch, rank, kjt, derived, captured, max_report, out);
  if (captured.batch_size_per_feature_pre_a2a && want.batch_size_per_feature_pre_a2a) {
    const auto& w = *want.batch_size_per_feature_pre_a2a;
    out.push_back(diff_vector<int64_t>(
        batch, rank, "batch_size_per_feature_pre_a2a", *captured.batch_size_per_feature_pre_a2a, w,
        0,
        [&](int64_t f) {
          return fmt::format("rank {}'s KJT has {} samples of feature {}", rank, w[size_t(f)],
                             fname(plan, f));
        },
        max_report));
  }
  if (captured.variable_batch_per_feature) {
    const bool w = want.variable_batch_per_feature.value_or(vbe);
    out.push_back(scalar_flag(
        batch, rank, "variable_batch_per_feature", *captured.variable_batch_per_feature, w,
        w ? "a KJT of this batch has stride_per_feature (variable batch per feature)"
          : "no KJT of this batch has stride_per_feature"));
  }
  return out;
}

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
