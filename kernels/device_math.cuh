// Device math the kernels share with the CPU reference. fmix64 and the hash64 oracle are
// lib/common/hash.hpp's own constexpr functions (device-callable with --expt-relaxed-constexpr).
// The fp16/bf16 rounding below is a device copy of lib/common/dtype.cpp, which is not
// header-only; it must stay bit-identical to it: the GPU tests compare every element with the
// CPU reference. Float arithmetic here uses explicit _rn intrinsics so nvcc cannot contract a
// multiply-add into an FMA the CPU does not do.
#pragma once

#include <cstdint>

#include "common/hash.hpp"
#include "device_rows.hpp"

namespace dynemb::cuda {

__device__ __forceinline__ uint32_t d_f32_bits(float f) {
  return __float_as_uint(f);
}
__device__ __forceinline__ float d_bits_f32(uint32_t u) {
  return __uint_as_float(u);
}

// float32 -> binary16 bits, round to nearest even; same branches as f32_to_f16_bits().
__device__ __forceinline__ uint16_t d_f32_to_f16_bits(float f) {
  const uint32_t x = d_f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (absx < 0x38800000u) {
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = absx >> 23;
    const uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;
    const uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = absx - 0x38000000u;
  const uint32_t low = r & 0x1fffu;
  r >>= 13;
  if (low > 0x1000u || (low == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

__device__ __forceinline__ float d_f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // subnormal: mant * 2^-24, exact in fp32
    const float v = __fmul_rn(static_cast<float>(mant), 5.9604644775390625e-8f);
    return sign ? -v : v;
  }
  if (exp == 31) return d_bits_f32(sign | 0x7f800000u | (mant << 13));
  return d_bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

__device__ __forceinline__ uint16_t d_f32_to_bf16_bits(float f) {
  const uint32_t x = d_f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

__device__ __forceinline__ float d_bf16_bits_to_f32(uint16_t b) {
  return d_bits_f32(static_cast<uint32_t>(b) << 16);
}

// Precision codes used by the kernels: 0 fp32, 1 fp16, 2 bf16 (= DType's values).
__device__ __forceinline__ float d_round_to(int t, float x) {
  if (t == 1) return d_f16_bits_to_f32(d_f32_to_f16_bits(x));
  if (t == 2) return d_bf16_bits_to_f32(d_f32_to_bf16_bits(x));
  return x;
}

// Codec encode of docs/semantics.md §8 (clamp to the finite range, round; NaN passes) as the
// fp32 value the decode gives back.
__device__ __forceinline__ float d_codec_encode(int t, float x) {
  if (t == 0 || x != x) return x;
  const float lim = t == 1 ? 65504.0f : d_bf16_bits_to_f32(0x7f7fu);
  return d_round_to(t, x < -lim ? -lim : (x > lim ? lim : x));
}

// Column c of row g of a table's rows (DeviceRows): its dense weights, or the oracle.
__device__ __forceinline__ float d_row_value(const DeviceRows& t, uint64_t g, int64_t c) {
  if (t.dense) return t.dense[static_cast<int64_t>(g) * t.stride + t.col0 + c];
  return oracle_value(t.seed, g, static_cast<uint64_t>(t.col0 + c));
}

// Largest i in [0, n) with a[i] <= x, for a non-decreasing a with a[0] <= x.
__device__ __forceinline__ int64_t d_upper_bound_m1(const int64_t* a, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n;  // invariant: a[lo] <= x, answer in [lo, hi)
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) >> 1;
    if (a[mid] <= x)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace dynemb::cuda
