#include "replay/diff.hpp"

#include <fmt/core.h>

#include <cmath>
#include <cstring>

namespace dynemb {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

TensorDiff diff_tensors(const EmbTensor& got, const EmbTensor& want, const Tolerance& tol,
                        const TensorLayout& layout, int64_t max_report) {
  TensorDiff d;
  if (got.shape != want.shape || got.data.size() != want.data.size()) {
    d.shape_ok = false;
    d.shape_note = fmt::format("shape {} vs {}", shape_str(got.shape), shape_str(want.shape));
    return d;
  }
  const int64_t n = static_cast<int64_t>(got.data.size());
  d.compared = n;
  // A pair with the same bits adds nothing: no error, and every tolerance accepts it (NaN
  // matches NaN). Blocks that compare equal as bytes are skipped at memcmp speed, so a
  // passing replay pays for one pass over memory, not for the per-element arithmetic.
  constexpr int64_t kBlock = 2048;
  const float* gp = got.data.data();
  const float* wp = want.data.data();
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    if (std::memcmp(gp + b0, wp + b0, sizeof(float) * size_t(b1 - b0)) == 0) continue;
    for (int64_t i = b0; i < b1; ++i) {
      const float g = gp[i], w = wp[i];
      if (!std::isnan(g) && !std::isnan(w)) {
        const double diff = std::fabs(double(g) - double(w));
        if (std::isfinite(diff)) {
          d.max_abs_err = std::max(d.max_abs_err, diff);
          if (w != 0) d.max_rel_err = std::max(d.max_rel_err, diff / std::fabs(double(w)));
          d.max_ulp = std::max(d.max_ulp, ulp_distance(g, w));
        }
      }
      if (tol.accepts(g, w)) continue;
      ++d.mismatches;
      if (int64_t(d.first.size()) < max_report) d.first.push_back({i, layout(i), g, w});
    }
  }
  return d;
}

}  // namespace dynemb
