// Element types. Embeddings are held as float32 whose values are exactly representable in
// the tensor's DType (fp16/bf16 values widen to fp32 exactly), so one code path serves all
// three; rounding to the low precision happens where the real op rounds (TBE output cast,
// codec encode, low-precision reduce).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace dynemb {

enum class DType : uint8_t { f32, f16, bf16 };
enum class IndexType : uint8_t { i32, i64 };

inline const char* to_string(DType t) {
  switch (t) {
    case DType::f32:
      return "fp32";
    case DType::f16:
      return "fp16";
    case DType::bf16:
      return "bf16";
  }
  return "?";
}
inline const char* to_string(IndexType t) {
  return t == IndexType::i32 ? "int32" : "int64";
}
inline int dtype_bytes(DType t) {
  return t == DType::f32 ? 4 : 2;
}

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float32 -> IEEE binary16 bits, round to nearest even (what torch's .half() does).
uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(uint16_t h);
// float32 -> bfloat16 bits, round to nearest even; NaN stays NaN.
uint16_t f32_to_bf16_bits(float f);
inline float bf16_bits_to_f32(uint16_t b) {
  return bits_f32(static_cast<uint32_t>(b) << 16);
}

// Round a float32 to the nearest value representable in `t` (no clamping: overflow -> inf).
inline float round_to(DType t, float x) {
  switch (t) {
    case DType::f32:
      return x;
    case DType::f16:
      return f16_bits_to_f32(f32_to_f16_bits(x));
    case DType::bf16:
      return bf16_bits_to_f32(f32_to_bf16_bits(x));
  }
  return x;
}

// Codec encode of docs/semantics.md §8: clamp to the finite range, then round (NaN passes).
float codec_encode(DType t, float x);

}  // namespace dynemb
