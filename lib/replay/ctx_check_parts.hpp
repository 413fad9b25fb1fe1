// What the context checks share (ctx_check.cpp: the captured context against the derived one;
// consistency_check.cpp: what the contexts must satisfy whatever the plan).
#pragma once

#include <fmt/core.h>

#include <algorithm>
#include <string>

#include "model/types.hpp"
#include "replay/report.hpp"

namespace dynemb::ctx_parts {

inline CheckResult make(int64_t batch, int rank, const std::string& check) {
  CheckResult c;
  c.batch = batch;
  c.rank = rank;
  c.stage = "ctx";
  c.check = check;
  return c;
}

// A plan-free equality of two derived quantities, e.g. sum(input_splits) == ids of the KJT.
inline CheckResult scalar_equal(int64_t batch, int rank, const std::string& check,
                                const std::string& got_label, int64_t got,
                                const std::string& want_label, int64_t want,
                                const std::string& note, int64_t index = -1) {
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
inline int64_t own_batch_size(const Kjt& kjt) {
  if (!kjt.stride_per_feature.empty())
    return *std::max_element(kjt.stride_per_feature.begin(), kjt.stride_per_feature.end());
  return kjt.num_features > 0 ? int64_t(kjt.lengths.size()) / kjt.num_features : 0;
}

}  // namespace dynemb::ctx_parts
