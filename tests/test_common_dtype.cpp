// fp16 / bf16 rounding and the codec clamp (docs/semantics.md §8).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "common/dtype.hpp"
#include "common/hash.hpp"

using namespace dynemb;

TEST_CASE("fp16 round to nearest even") {
  CHECK(f32_to_f16_bits(1.0f) == 0x3c00);
  CHECK(f32_to_f16_bits(-2.0f) == 0xc000);
  CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);  // halfway to 65536 rounds to inf
  CHECK(f32_to_f16_bits(65519.0f) == 0x7bff);
  // 1 + 2^-11 is halfway between 1 and 1+2^-10: ties to even -> 1.
  CHECK(f32_to_f16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 and 1+2^-9: ties to even -> 1+2^-9 (0x3c02).
  CHECK(f32_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie -> even (0)
  CHECK(f32_to_f16_bits(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  CHECK(std::isnan(f16_bits_to_f32(f32_to_f16_bits(std::nanf("")))));
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half round-trips
    const float f = f16_bits_to_f32(static_cast<uint16_t>(h));
    REQUIRE(f32_to_f16_bits(f) == h);
  }
}

TEST_CASE("bf16 round to nearest even") {
  CHECK(f32_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(f32_to_bf16_bits(bits_f32(0x3f808000u)) == 0x3f80);  // tie -> even
  CHECK(f32_to_bf16_bits(bits_f32(0x3f818000u)) == 0x3f82);  // tie -> even (up)
  CHECK(f32_to_bf16_bits(bits_f32(0x3f808001u)) == 0x3f81);
  CHECK(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::nanf("")))));
}

TEST_CASE("codec encode clamps to the finite range") {
  CHECK(codec_encode(DType::f16, 1e6f) == 65504.0f);
  CHECK(codec_encode(DType::f16, -1e6f) == -65504.0f);
  CHECK(codec_encode(DType::bf16, std::numeric_limits<float>::infinity()) ==
        bf16_bits_to_f32(0x7f7f));
  CHECK(codec_encode(DType::f32, 1e30f) == 1e30f);
}

TEST_CASE("fmix64 reference values of docs/semantics.md §10.2") {
  struct Row {
    int64_t key;
    int w2, w3, w4;
  };
  const Row rows[] = {{0, 0, 0, 0}, {1, 0, 2, 0},     {2, 1, 0, 3}, {3, 0, 2, 2},
                      {7, 1, 1, 1}, {12345, 1, 0, 1}, {-1, 1, 1, 1}};
  CHECK(fmix64(0) == 0);
  for (const Row& r : rows) {
    const uint64_t h = fmix64(static_cast<uint64_t>(r.key));
    CHECK_MESSAGE(h % 2 == static_cast<uint64_t>(r.w2), "key " << r.key);
    CHECK_MESSAGE(h % 3 == static_cast<uint64_t>(r.w3), "key " << r.key);
    CHECK_MESSAGE(h % 4 == static_cast<uint64_t>(r.w4), "key " << r.key);
  }
}

TEST_CASE("oracle values are multiples of 1/64 in [-2, 1.984375]") {
  const uint64_t ts = oracle_table_seed(42, 0);
  for (uint64_t g = 0; g < 1000; ++g) {
    for (uint64_t c = 0; c < 4; ++c) {
      const float v = oracle_value(ts, g, c);
      REQUIRE(v >= -2.0f);
      REQUIRE(v <= 1.984375f);
      REQUIRE(v * 64.0f == std::floor(v * 64.0f));
    }
  }
}
