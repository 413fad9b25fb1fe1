// Division by a run-time invariant uint64 divisor as a multiply-high and shifts
// (Granlund & Montgomery 1994, with the 65-bit "add" variant as in libdivide): exact for every
// x and every d >= 1. The GPU bucketize routes each id by `% W` (and `/ W`, `/ blk`); the
// plain 64-bit `/` and `%` are ~100-instruction subroutine calls there, this is ~6
// instructions. Host and device (the header compiles in .cpp and .cu files alike).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DYNEMB_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DYNEMB_HOST_DEVICE inline
#endif

namespace dynemb {

DYNEMB_HOST_DEVICE uint64_t mulhi_u64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

struct FastDivU64 {
  uint64_t d = 1;
  uint64_t magic = 0;  // 0: d is a power of two (incl. 1), q = x >> shift
  uint32_t shift = 0;
  bool add = false;  // 65-bit magic: q = (((x - hi) >> 1) + hi) >> shift, hi = mulhi(x, magic)

  // Host only (128-bit division). d >= 1.
  static FastDivU64 make(uint64_t d) {
    FastDivU64 f;
    f.d = d;
    uint32_t lg = 0;  // floor(log2(d))
    while (lg < 63 && (d >> (lg + 1)) != 0) ++lg;
    f.shift = lg;
    if ((d & (d - 1)) == 0) return f;
    // m = floor(2^(64+lg) / d) < 2^64 because d > 2^lg.
    const unsigned __int128 num = static_cast<unsigned __int128>(1) << (64 + lg);
    uint64_t m = static_cast<uint64_t>(num / d);
    const uint64_t rem = static_cast<uint64_t>(num % d);
    if (d - rem < (uint64_t{1} << lg)) {
      f.magic = m + 1;  // ceil(2^(64+lg) / d) fits: the 64-bit magic is exact
    } else {
      // ceil(2^(65+lg) / d) - 2^64, from the doubled quotient and remainder.
      const uint64_t twice = rem + rem;
      m += m;
      if (twice >= d || twice < rem) m += 1;
      f.magic = m + 1;
      f.add = true;
    }
    return f;
  }

  DYNEMB_HOST_DEVICE uint64_t div(uint64_t x) const {
    if (magic == 0) return x >> shift;
    const uint64_t hi = mulhi_u64(x, magic);
    return add ? (((x - hi) >> 1) + hi) >> shift : hi >> shift;
  }
  DYNEMB_HOST_DEVICE uint64_t mod(uint64_t x) const {
    return magic == 0 ? x & (d - 1) : x - div(x) * d;  // d a power of two: a mask
  }
};

}  // namespace dynemb
