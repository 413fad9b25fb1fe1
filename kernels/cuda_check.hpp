// CUDA error checking, shared by the kernels, the CUDA and NCCL backends, the bench and the GPU
// tests. Every CUDA runtime call goes through CUDA_CHECK so a failure becomes a
// dynemb::DeviceError carrying file:line and the call text (cli maps it to exit 2).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/error.hpp"

namespace dynemb::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  throw DeviceError(std::string(file) + ":" + std::to_string(line) + ": CUDA error " +
                    cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in `" + call + "`");
}

}  // namespace dynemb::cuda

#define CUDA_CHECK(call)                                                       \
  do {                                                                         \
    cudaError_t dynemb_cuda_err_ = (call);                                     \
    if (dynemb_cuda_err_ != cudaSuccess)                                       \
      ::dynemb::cuda::throw_cuda(dynemb_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next sync.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace dynemb::cuda {

// True when a CUDA device and a working driver are present; never throws.
bool device_available(int device = 0);

}  // namespace dynemb::cuda
