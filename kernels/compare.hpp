// Launch wrapper of the comparison a replay's checks run where the tensors were made
// (the CUDA backend's Comparator, backends/cuda/device_comparator.hpp): what each tile of two
// device tensors adds to a diff under a tolerance, so that only those statistics, and the values of
// the few tiles holding the first mismatches, need to come back to the host. Plain C++, device
// pointers, int64 sizes; the engine's types (engine/tile_diff.hpp) are mirrored here as plain
// structs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dynemb::cuda {

// engine/tolerance.hpp's Tolerance as numbers.
struct ToleranceArgs {
  enum Kind : int { exact = 0, ulp = 1, rel = 2 };
  int kind = exact;
  long long ulps = 0;
  double rtol = 0, atol = 0;
};

// engine/tile_diff.hpp's TileStats of one tile.
struct TileStatsOut {
  long long mismatches;
  double max_abs_err, max_rel_err;
  long long max_ulp;
};

// out[t] = what the pairs (got[i], want[i]) of tile t = [t*tile, min(n, (t+1)*tile)) add to a
// diff under `tol`, computed exactly as engine/tile_diff.hpp's add_pair does on the host (the
// same double operations, none contracted): bit-identical statistics. out: [ceil(n / tile)].
void launch_tile_stats(const float* got, const float* want, int64_t n, int64_t tile,
                       const ToleranceArgs& tol, TileStatsOut* out, cudaStream_t s);

}  // namespace dynemb::cuda
