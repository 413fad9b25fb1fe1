// Row resolution of a rank's lookup (resolve.hpp): one thread per id, its feature found by a
// binary search over the F + 1 id offsets (a lookup's bags are feature-major).
#include <algorithm>

#include "cuda_check.hpp"
#include "device_math.cuh"
#include "resolve.hpp"

namespace dynemb::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) resolve_rows_kernel(ResolveArgs a) {
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; p < a.n;
       p += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t f = d_upper_bound_m1(a.feat_id_off, a.num_features, p);
    const RowRule r = a.rules[f];
    // lookup_row: a hashed feature's id is its row; a continuous one's local id is a row of the
    // rank's shard, or out of bounds (a negative id is a huge one): then local row 0 of the
    // shard, none when the shard is empty.
    const uint64_t u = static_cast<uint64_t>(a.values[p]);
    uint64_t g = u;
    bool valid = true, refuse = false;
    if (r.continuous) {
      if (u < r.rows) {
        g = r.first + u;
      } else {
        g = r.first;
        valid = r.rows > 0;
        refuse = a.bounds_error != 0;
      }
    }
    if (valid && r.has_limit && g >= r.limit) refuse = true;
    if (refuse) *a.refused = 1;  // a benign race: every writer stores 1
    a.g[p] = g;
    if (a.feat) a.feat[p] = valid ? static_cast<int32_t>(f) : -1;
    if (a.valid) a.valid[p] = valid ? 1 : 0;
  }
}

}  // namespace

void launch_resolve_rows(const ResolveArgs& a, cudaStream_t s) {
  if (a.n <= 0) return;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((a.n + kThreads - 1) / kThreads, 132 * 16));
  resolve_rows_kernel<<<blocks, kThreads, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dynemb::cuda
