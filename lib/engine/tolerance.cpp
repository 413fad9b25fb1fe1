#include "engine/tolerance.hpp"

#include <fmt/core.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "common/dtype.hpp"
#include "common/error.hpp"

namespace dynemb {
namespace {

// Maps float bits onto a line where adjacent floats are adjacent integers and the order is
// the float order: negative floats are mirrored below zero (-0 and +0 both map to 0).
int64_t ordered(float f) {
  const uint32_t u = f32_bits(f);
  const int64_t mag = static_cast<int64_t>(u & 0x7fffffffu);
  return (u & 0x80000000u) ? -mag : mag;
}

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw UsageError(fmt::format(
      "--tolerance '{}': {}; expected exact, ulp:N (N >= 0) or rtol:X,atol:Y (X, Y >= 0)", text,
      why));
}

double parse_nonneg(const std::string& text, const std::string& s, const char* what) {
  if (s.empty()) bad(text, fmt::format("missing value of {}", what));
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v) || v < 0)
    bad(text, fmt::format("{} must be a finite number >= 0, got '{}'", what, s));
  return v;
}

}  // namespace

std::string Tolerance::str() const {
  switch (kind) {
    case Kind::exact:
      return "exact";
    case Kind::ulp:
      return fmt::format("ulp:{}", ulps);
    case Kind::rel:
      return fmt::format("rtol:{:g},atol:{:g}", rtol, atol);
  }
  return "?";
}

int64_t ulp_distance(float a, float b) {
  const int64_t d = ordered(a) - ordered(b);  // both within +-2^31: no overflow
  return d < 0 ? -d : d;
}

bool Tolerance::accepts(float got, float want) const {
  const bool gn = std::isnan(got), wn = std::isnan(want);
  if (gn || wn) return gn && wn;  // NaN only matches NaN
  if (got == want) return true;   // covers +0 == -0 and equal infinities
  if (std::isinf(got) || std::isinf(want)) return false;
  switch (kind) {
    case Kind::exact:
      return false;
    case Kind::ulp:
      return ulp_distance(got, want) <= ulps;
    case Kind::rel: {
      const double diff = std::fabs(double(got) - double(want));
      return diff <= atol + rtol * std::fabs(double(want));
    }
  }
  return false;
}

Tolerance parse_tolerance(const std::string& text) {
  if (text == "exact") return Tolerance::exact();
  if (text.rfind("ulp:", 0) == 0) {
    const std::string n = text.substr(4);
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || n.size() > 10)
      bad(text, "N of ulp:N must be a decimal integer >= 0");
    return Tolerance::ulp(std::stoll(n));
  }
  if (text.rfind("rtol:", 0) == 0) {
    const size_t comma = text.find(',');
    if (comma == std::string::npos) bad(text, "missing ',atol:Y'");
    const std::string rest = text.substr(comma + 1);
    if (rest.rfind("atol:", 0) != 0) bad(text, "expected 'atol:Y' after the comma");
    const double rtol = parse_nonneg(text, text.substr(5, comma - 5), "rtol");
    const double atol = parse_nonneg(text, rest.substr(5), "atol");
    return Tolerance::rel(rtol, atol);
  }
  bad(text, "unknown form");
}

Tolerance default_tolerance(const Plan& plan) {
  const DType data = plan.data_type();
  const DType comm = plan.comm_precision;
  if (data == DType::f32 && comm == DType::f32) return Tolerance::exact();
  if (plan.module == ModuleKind::sequence && comm == DType::f32) return Tolerance::exact();
  // The lowest precision involved: bf16 (8 significant bits) below fp16 (11).
  const bool any_bf16 = data == DType::bf16 || comm == DType::bf16;
  const double eps = any_bf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  const double scale = plan.module == ModuleKind::pooled ? double(plan.world_size) : 1.0;
  return Tolerance::rel(eps * scale, eps * scale);
}

const char* default_tolerance_help() {
  return "Default: 'exact' when the plan's data_type and comm_precision are both fp32 (SUM and "
         "MEAN alike: the dist carries MEAN sums, and the module's mean pooling is one float32 "
         "division by float32(len) + 1e-6, deterministic), and "
         "for sequence plans without a codec; otherwise rtol = atol = eps x (W for pooled "
         "plans, 1 for sequence) with eps = 2^-10 for fp16, 2^-7 when bf16 is involved (e.g. "
         "pooled W=8 fp16 codec: rtol:0.0078125,atol:0.0078125).";
}

}  // namespace dynemb
