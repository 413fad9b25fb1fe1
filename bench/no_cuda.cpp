// A build without the CUDA backend: `bench --backend cuda` says so. (CMake compiles this file
// instead of bench/cuda/ then.)
#include <fmt/core.h>

#include "common/error.hpp"
#include "registry.hpp"
#include "stages.hpp"

namespace dynemb::bench {

Result run_cuda_stages(const Options&, const Workload&) {
  throw UsageError(
      fmt::format("bench --backend cuda: this build has no CUDA backend (compiled backends: {})",
                  compiled_backends()));
}

}  // namespace dynemb::bench
