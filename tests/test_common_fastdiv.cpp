// FastDivU64 (lib/common/fastdiv.hpp), the division the GPU bucketize routes ids with, must
// equal `/` and `%` for every divisor and dividend: exhaustively near the edges, at random
// elsewhere.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "common/fastdiv.hpp"

using dynemb::FastDivU64;

namespace {
void check_divisor(uint64_t d, std::mt19937_64& rng, int randoms) {
  const FastDivU64 f = FastDivU64::make(d);
  std::vector<uint64_t> xs{0,
                           1,
                           d - 1,
                           d,
                           d + 1,
                           ~uint64_t{0},
                           ~uint64_t{0} - 1,
                           uint64_t{1} << 63,
                           (uint64_t{1} << 63) - 1,
                           uint64_t{1} << 32,
                           (uint64_t{1} << 32) - 1};
  for (uint64_t k : {uint64_t{2}, uint64_t{3}, uint64_t{1000}, ~uint64_t{0} / d}) {
    xs.push_back(k * d);
    xs.push_back(k * d - 1);
    xs.push_back(k * d + 1);
  }
  for (int i = 0; i < randoms; ++i) xs.push_back(rng() >> (rng() % 64));
  for (uint64_t x : xs) {
    if (f.div(x) != x / d || f.mod(x) != x % d) {
      INFO("d=" << d << " x=" << x << " magic=" << f.magic << " shift=" << f.shift
                << " add=" << f.add);
      CHECK(f.div(x) == x / d);
      CHECK(f.mod(x) == x % d);
      return;
    }
  }
}
}  // namespace

TEST_CASE("FastDivU64 == / and % for small, power-of-two, large and random divisors") {
  std::mt19937_64 rng(11);
  for (uint64_t d = 1; d <= 4096; ++d) check_divisor(d, rng, 64);  // every W a plan can have
  for (int s = 0; s < 64; ++s) {
    const uint64_t p = uint64_t{1} << s;
    for (uint64_t d : {p, p - 1, p + 1, p + 3}) check_divisor(d == 0 ? 1 : d, rng, 64);
  }
  for (uint64_t d : {~uint64_t{0}, ~uint64_t{0} - 1, (uint64_t{1} << 63) + 12345,
                     uint64_t{177944275}, uint64_t{22243035}, uint64_t{6700417}})
    check_divisor(d, rng, 4096);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t d = rng() >> (rng() % 64);
    check_divisor(d == 0 ? 7 : d, rng, 32);
  }
}

TEST_CASE("FastDivU64 picks the 65-bit variant where the 64-bit magic is not exact") {
  // d = 7: 2^66/7 rounded up does not fit the error bound, libdivide's classic add case.
  CHECK(FastDivU64::make(7).add);
  CHECK_FALSE(FastDivU64::make(3).add);
  CHECK(FastDivU64::make(1).magic == 0);
  CHECK(FastDivU64::make(1024).shift == 10);
  CHECK(FastDivU64::make(7).div(~uint64_t{0}) == ~uint64_t{0} / 7);
}
