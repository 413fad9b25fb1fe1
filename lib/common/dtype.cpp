#include "common/dtype.hpp"

#include <cmath>
#include <limits>

namespace dynemb {

uint16_t f32_to_f16_bits(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absx < 0x38800000u) {
    // Result is subnormal (or zero) in fp16: value = m * 2^-24.
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to 0
    const uint32_t e = absx >> 23;
    const uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 + (112 - e) ... so that result = mant >> (shift)
    // value = mant * 2^(e-150); want q = value / 2^-24 = mant * 2^(e-126)
    const uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias exponent 127 -> 15, keep 10 mantissa bits, round to nearest even.
  uint32_t r = absx - 0x38000000u;  // exponent -= 112
  const uint32_t low = r & 0x1fffu;
  r >>= 13;
  if (low > 0x1000u || (low == 0x1000u && (r & 1u))) ++r;  // may carry into exponent: fine
  return static_cast<uint16_t>(sign | r);
}

float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_bf16_bits(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

float codec_encode(DType t, float x) {
  if (std::isnan(x)) return x;
  switch (t) {
    case DType::f32:
      return x;
    case DType::f16: {
      const float lim = 65504.0f;
      return round_to(t, x < -lim ? -lim : (x > lim ? lim : x));
    }
    case DType::bf16: {
      const float lim = bf16_bits_to_f32(0x7f7fu);  // largest finite bf16
      return round_to(t, x < -lim ? -lim : (x > lim ? lim : x));
    }
  }
  return x;
}

}  // namespace dynemb
