// The CUDA backend (issue 7): all W ranks of a batch live on one GPU; the exchange is
// device memory traffic and the bucketize, lookups, permutes and reductions are our kernels
// (kernels/*.cu). Results are bit-identical to the CPU reference (cpu_backend.cpp).
#pragma once

#include <memory>

#include "engine/backend.hpp"

namespace dynemb {

// Throws DeviceError when the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
// True when a CUDA device and driver are present; never throws.
bool cuda_device_available();

}  // namespace dynemb
