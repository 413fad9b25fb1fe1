// What the kernels that read table rows share: where a feature's rows come from on the device
// (DeviceRows) and the precision of a rounding or codec (Precision). Plain C++ so host code
// (backends/, bench/, tests) can fill them.
#pragma once

#include <cstdint>

namespace dynemb::cuda {

// Precision of a kernel's rounding or codec: the values of lib/common's DType (f32 = no
// rounding, no codec).
enum class Precision : int32_t { f32 = 0, f16 = 1, bf16 = 2 };

// Where the rows of a feature's table come from on the device (EmbeddingSource::TableRows,
// resolved by the backend): column c of row g is dense[g * stride + col0 + c] when `dense` is set
// (the table's weights, uploaded; the host has checked g against their rows), else column
// col0 + c of the hash64 oracle row of `seed` (oracle_table_seed of the source's table). col0 > 0
// for a column slice of the table.
struct DeviceRows {
  const float* dense = nullptr;
  uint64_t seed = 0;
  int64_t stride = 0;
  int64_t col0 = 0;
};

}  // namespace dynemb::cuda
