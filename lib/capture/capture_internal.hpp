// Helpers shared by the capture reader (capture_reader.cpp) and writer (capture_writer.cpp).
#pragma once

#include <fmt/format.h>
#include <hdf5.h>

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

// The header damage of a dataset that would have libhdf5 1.10 read out of bounds, or have a
// reader allocate what the file does not hold: an implausible extent, data or chunks past the
// end of the file, compact or unfiltered chunk sizes that disagree with the extent, a claim
// far beyond what the file stores, a filter that cannot be undone, a bad chunk record. "" when
// none; else what is wrong, for the caller to name with the dataset's path. `dcpl`: the
// dataset's creation property list, or -1 (fetched where needed).
std::string header_trouble(hid_t fid, hid_t dset, hid_t type, hid_t dcpl,
                           const std::vector<int64_t>& dims);

}  // namespace dynemb::capture_detail
