// Backend selection by name. The #if's on the build's backends live here and nowhere above.
#include "registry.hpp"

#include <fmt/core.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/test_hooks.hpp"
#include "common/trace.hpp"
#if defined(DYNEMB_HAVE_CUDA)
#include "cuda/cuda_backend.hpp"
#endif
#if defined(DYNEMB_HAVE_NCCL)
#include "nccl/nccl_backend.hpp"
#endif

namespace dynemb {

const char* compiled_backends() {
#if defined(DYNEMB_HAVE_NCCL)
  return "cpu, cuda, nccl";
#elif defined(DYNEMB_HAVE_CUDA)
  return "cpu, cuda";
#else
  return "cpu";
#endif
}

bool cuda_backend_usable() {
#if defined(DYNEMB_HAVE_CUDA)
  return cuda_device_available();
#else
  return false;
#endif
}

namespace {

[[maybe_unused]] std::vector<int> parse_devices(const std::string& devices) {
  std::vector<int> list;  // "0,1,3" -> {0, 1, 3}
  for (size_t p = 0; p < devices.size();) {
    size_t q = devices.find(',', p);
    if (q == std::string::npos) q = devices.size();
    const std::string item = devices.substr(p, q - p);
    if (item.empty() || item.size() > 4 ||
        item.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(fmt::format(
          "--devices {}: '{}' is not a CUDA device number (want e.g. 0,1,2,3)", devices, item));
    list.push_back(std::stoi(item));
    p = q + 1;
  }
  return list;
}

// Whether a GPU may be there, told without starting the CUDA driver (which takes a sizeable
// part of a second: the starting backend's thread spends it instead): the NVIDIA kernel
// driver's first device node, unless CUDA_VISIBLE_DEVICES hides every device. A machine that
// has the node but no usable device learns so from the starting backend: its first call
// throws the backend's DeviceError, which the replay reports as its trouble (exit 2). A test
// build may name another file to look for (test_hooks::gpu_node).
[[maybe_unused]] bool gpu_node_present() {
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && (*v == '\0' || *v == '-'))
    return false;
  const char* node = test_hooks::gpu_node();
  return ::access(node ? node : "/dev/nvidia0", F_OK) == 0;
}

}  // namespace

BackendStartup start_backend(const std::string& name, const std::string& devices) {
#if defined(DYNEMB_HAVE_CUDA)
  // --backend cuda: refused here and now where no GPU can be there (as make_backend refuses
  // it); else the driver's start, the device check and the backend's making all wait on
  // another thread. auto must choose now: it asks the driver first.
  if (devices.empty() && name == "cuda" && gpu_node_present())
    return BackendStartup("cuda", [] { return make_cuda_backend(0); });
  if (devices.empty() && name == "auto" && [] {
        const TraceSpan span("cuda probe");
        return cuda_device_available();
      }())
    return BackendStartup("cuda", [] { return make_cuda_backend(0); });
#endif
  std::unique_ptr<Backend> made = make_backend(name, devices);
  // The test hook DYNEMB_BACKEND_START_MS: this backend, made (and refused) now, is handed over
  // only after the delay, from another thread, as a GPU backend's start is.
  if (const std::optional<int64_t> ms = test_hooks::backend_start_ms()) {
    const std::string named = made->name();
    auto box = std::make_shared<std::unique_ptr<Backend>>(std::move(made));  // made once
    return BackendStartup(named, [ms = *ms, box] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      return std::move(*box);
    });
  }
  return BackendStartup(std::move(made));
}

bool backend_spans_processes(const std::string& name) {
#if defined(DYNEMB_HAVE_NCCL)
  return name == "nccl";
#else
  (void)name;
  return false;
#endif
}

BackendStartup start_backend(const std::string& name, const std::string& devices,
                             const BackendProcesses& processes) {
  if (processes.size <= 1 || !backend_spans_processes(name)) return start_backend(name, devices);
#if defined(DYNEMB_HAVE_NCCL)
  NcclProcessGroup pg;
  pg.index = processes.index;
  pg.size = processes.size;
  pg.broadcast = processes.broadcast;
  return BackendStartup(make_nccl_backend(parse_devices(devices), NcclOptions{}, pg));
#else
  return start_backend(name, devices);
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name, const std::string& devices) {
  if (!devices.empty() && name != "nccl")
    throw UsageError("--devices applies to --backend nccl only");
  if (name == "cpu") {
    // Test hook: the CPU reference keeping what a step may keep, as a device backend does, so
    // that the replay's kept paths run without a GPU.
    return make_cpu_backend(0, /*keeps=*/test_hooks::hold_outputs_on_host());
  }
  if (name == "auto") {
    // docs/cli.md: auto picks cuda when a GPU is present, else cpu. The CUDA backend matches
    // the CPU reference bit for bit (tests/gpu/test_cuda_backend.cpp).
#if defined(DYNEMB_HAVE_CUDA)
    if (cuda_device_available()) return make_cuda_backend(0);
#endif
    return make_cpu_backend();
  }
  if (name == "cuda") {
#if defined(DYNEMB_HAVE_CUDA)
    return make_cuda_backend(0);
#else
    throw UsageError(
        fmt::format("--backend cuda: this build has no CUDA backend (compiled "
                    "backends: {}); rebuild with -DDYNEMB_CUDA=ON on a machine with "
                    "nvcc, or use --backend cpu",
                    compiled_backends()));
#endif
  }
  if (name == "nccl") {
#if defined(DYNEMB_HAVE_NCCL)
    return make_nccl_backend(parse_devices(devices));  // DeviceError (exit 2) without a GPU
#else
    throw UsageError(
        fmt::format("--backend nccl: this build has no NCCL backend (compiled backends: {}); "
                    "rebuild with -DDYNEMB_CUDA=ON where nccl.h and libnccl are found, or use "
                    "--backend cpu",
                    compiled_backends()));
#endif
  }
  throw UsageError(fmt::format("--backend {}: unknown backend (auto, cpu, cuda, nccl)", name));
}

}  // namespace dynemb
