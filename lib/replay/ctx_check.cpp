#include "replay/ctx_check.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>

#include "engine/ops.hpp"
#include "replay/ctx_check_parts.hpp"

namespace dynemb {
using ctx_parts::make;
using ctx_parts::own_batch_size;
using ctx_parts::scalar_equal;

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
            const int64_t id = size_t(i) < kjt.values.size() ? kjt.values[size_t(i)] : 0;
            const int64_t dest =
                size_t(i) < kjt.values.size() && p.feature >= 0 && p.feature < F
                    ? route_feature(plan.features[size_t(p.feature)], id, kjt.values_type, W).dest
                    : -1;
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

}  // namespace dynemb
