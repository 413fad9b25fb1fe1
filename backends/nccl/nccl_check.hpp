// NCCL error checking: every NCCL call goes through NCCL_CHECK so a failure becomes a
// dynemb::DeviceError carrying file:line, the call text, NCCL's error string and its last
// error message (cli maps it to exit 2), as CUDA_CHECK does for the runtime.
#pragma once

#include <nccl.h>

#include <string>

#include "common/error.hpp"

namespace dynemb::nccl {

[[noreturn]] inline void throw_nccl(ncclResult_t r, const char* call, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  throw DeviceError(std::string(file) + ":" + std::to_string(line) + ": NCCL error " +
                    std::to_string(static_cast<int>(r)) + " (" + ncclGetErrorString(r) +
                    (last && *last ? std::string("; ") + last : std::string()) + ") in `" + call +
                    "`");
}

}  // namespace dynemb::nccl

#define NCCL_CHECK(call)                                                       \
  do {                                                                         \
    ncclResult_t dynemb_nccl_res_ = (call);                                    \
    if (dynemb_nccl_res_ != ncclSuccess)                                       \
      ::dynemb::nccl::throw_nccl(dynemb_nccl_res_, #call, __FILE__, __LINE__); \
  } while (0)
