// Helpers shared by the capture reader (capture_reader.cpp) and writer (capture_writer.cpp).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.hpp"

namespace dynemb::capture_detail {

inline std::string shape_str(const std::vector<int64_t>& dims) {
  return "[" + fmt::format("{}", fmt::join(dims, ", ")) + "]";
}

// The element type's name as h5py users know it (numpy names; bfloat16 is uint16 + attribute).
inline const char* dtype_h5_name(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
  }
  return "?";
}

}  // namespace dynemb::capture_detail
