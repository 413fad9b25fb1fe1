// Launch wrapper of the bit comparison a replay's lookup check runs where the lookup was made
// (Backend::lookup_differences): which tiles of two device tensors differ, so that only those
// tiles need to come back to the host. Plain C++, device pointers, int64 sizes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dynemb::cuda {

// differs[t] = 1 when a[i] and b[i] differ in some bit for some i of tile t = [t*tile,
// min(n, (t+1)*tile)); differs[] ([ceil(n / tile)] bytes) must hold zeros on entry (tiles that
// compare equal are not written). Bits, not values: NaN == NaN of the same payload, -0 != +0.
void launch_differing_tiles(const float* a, const float* b, int64_t n, int64_t tile,
                            uint8_t* differs, cudaStream_t s);

}  // namespace dynemb::cuda
