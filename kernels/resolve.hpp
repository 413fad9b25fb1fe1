// Launch wrapper of the row resolution (resolve.cu): which table row each id of one rank's
// lookup reads, on the device, by the rule lib/engine/ops.cpp's lookup_row applies on the host
// (docs/semantics.md §5: a continuous feature's shard, TBE's bounds check; a hashed feature's
// raw key). Plain C++ so host code can fill it; every pointer is a device pointer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dynemb::cuda {

// The rule of one feature on the rank that looks it up.
struct RowRule {
  uint64_t first = 0;  // continuous: the rank's first row of the table
  uint64_t rows = 0;   // continuous: the rank's rows (a local id at or past it is out of bounds)
  uint64_t limit = 0;  // with has_limit: rows the device holds (dense weights); g past it refuses
  int32_t continuous = 0;  // 0: the id is the row (roundrobin, hash_roundrobin)
  int32_t has_limit = 0;   // the oracle makes every row: no limit
};

struct ResolveArgs {
  int64_t n = 0;                         // ids
  const int64_t* values = nullptr;       // [n] local ids, bags in (f, s, b) order
  int64_t num_features = 0;              // F
  const int64_t* feat_id_off = nullptr;  // [F+1] ids of feature f: [feat_id_off[f], [f+1])
  const RowRule* rules = nullptr;        // [F]
  int32_t bounds_error = 0;              // bounds_check=error: an out-of-bounds id refuses
  uint64_t* g = nullptr;                 // [n] out: the unsharded row
  int32_t* feat = nullptr;               // [n] out, or null: the feature, -1 when no row
  uint8_t* valid = nullptr;              // [n] out, or null: 1 when the row is read
  int32_t* refused = nullptr;            // [1] set to 1 when some id refuses (never cleared)
};
// A refused lookup (an id out of bounds under bounds_check=error, a row past dense weights) is
// left to the host, whose error words are the ones to give: the caller reads `refused` before
// it uses g.
void launch_resolve_rows(const ResolveArgs& a, cudaStream_t s);

}  // namespace dynemb::cuda
