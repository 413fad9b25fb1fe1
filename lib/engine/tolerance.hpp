// Element comparison for output diffs: `--tolerance exact|ulp:N|rtol:X,atol:Y`, NaN-aware.
//
//   exact   bit-for-bit equal as float32 values (+0 == -0), NaN == NaN at the same place
//   ulp:N   |ordered(got) - ordered(want)| <= N, distance in float32 units in the last place
//   rtol:X,atol:Y   |got - want| <= atol + rtol * |want|   (numpy.isclose's rule)
// In every mode a NaN equals only a NaN, and +inf/-inf equal only themselves.
#pragma once

#include <cstdint>
#include <string>

#include "plan/plan.hpp"

namespace dynemb {

struct Tolerance {
  enum class Kind : uint8_t { exact, ulp, rel };
  Kind kind = Kind::exact;
  int64_t ulps = 0;   // ulp:N
  double rtol = 0.0;  // rtol:X,atol:Y
  double atol = 0.0;

  static Tolerance exact() { return {}; }
  static Tolerance ulp(int64_t n) {
    Tolerance t;
    t.kind = Kind::ulp;
    t.ulps = n;
    return t;
  }
  static Tolerance rel(double rtol, double atol) {
    Tolerance t;
    t.kind = Kind::rel;
    t.rtol = rtol;
    t.atol = atol;
    return t;
  }
  // Canonical text, parseable again: "exact", "ulp:2", "rtol:0.001,atol:0.001".
  std::string str() const;
  // True when `got` is acceptable for `want`.
  bool accepts(float got, float want) const;
};

// Parses the --tolerance text; throws UsageError saying what is accepted.
Tolerance parse_tolerance(const std::string& text);

// Distance in float32 ulps between two finite-or-infinite non-NaN floats (monotone integer
// mapping of the bit patterns; +0 and -0 are 0 apart). Saturates at INT64_MAX.
int64_t ulp_distance(float a, float b);

// The default of cli.md: exact where the semantics are exact, else a relative tolerance of
// the low precision involved. See default_tolerance_help() for the wording --help prints.
//   exact: data_type fp32 and comm_precision fp32, SUM or MEAN (the dist carries MEAN tables'
//          sums; the module's step divides in float32 by float32(len) + 1e-6 exactly as
//          TorchRec does: one correctly rounded division, deterministic);
//          sequence plans with a fp16/bf16 data_type and no codec (the path only moves data).
//   else:  rtol = atol = eps * (W for pooled plans, 1 for sequence), eps of the lowest
//          precision involved (fp16: 2^-10, bf16: 2^-7): a pooled reduce-scatter with a
//          codec rounds up to W partial sums in the low precision.
Tolerance default_tolerance(const Plan& plan);
const char* default_tolerance_help();

}  // namespace dynemb
