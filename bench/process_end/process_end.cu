// What a CUDA process pays to start its context and to end, by the way it ends. Standalone
// (bench/process_end.sh builds and times it): the whole process's wall time, less what main
// measured, is what exit costs.
//
//   process_end MODE [DEVICE_MIB [REGISTERED_MIB]]
//   MODE: return  main returns (the CUDA runtime's exit-time teardown runs)
//         _exit   _exit at once (no teardown in the process)
//         free    every allocation freed and unregistered, then _exit
//         reset   the primary context destroyed (cudaDeviceReset), then _exit
// Prints "init S work S main_end EPOCH_S" (and "free S" or "reset S") on stdout.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

namespace {

double now() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "process_end: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "return";
  if (std::strcmp(mode, "return") != 0 && std::strcmp(mode, "_exit") != 0 &&
      std::strcmp(mode, "free") != 0 && std::strcmp(mode, "reset") != 0) {
    std::fprintf(stderr,
                 "usage: process_end return|_exit|free|reset [DEVICE_MIB [REGISTERED_MIB]]\n");
    return 2;
  }
  const size_t dev_bytes = size_t(argc > 2 ? std::atol(argv[2]) : 2048) << 20;
  const size_t reg_bytes = size_t(argc > 3 ? std::atol(argv[3]) : 256) << 20;
  const double t0 = now();
  check(cudaFree(nullptr), "starting the CUDA context");
  const double t1 = now();
  // A replay's footprint in small: device memory, a pinned staging buffer, registered host
  // memory copied up.
  void* d = nullptr;
  void* staging = nullptr;
  check(cudaMalloc(&d, dev_bytes), "cudaMalloc");
  check(cudaMemset(d, 0, dev_bytes), "cudaMemset");
  check(cudaMallocHost(&staging, size_t(64) << 20), "cudaMallocHost");
  std::vector<char> host(reg_bytes, 1);
  if (reg_bytes > 0) check(cudaHostRegister(host.data(), reg_bytes, 0), "cudaHostRegister");
  check(cudaMemcpy(d, host.data(), reg_bytes < dev_bytes ? reg_bytes : dev_bytes,
                   cudaMemcpyHostToDevice),
        "cudaMemcpy");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const double t2 = now();
  std::printf("init %.3f work %.3f main_end %.6f\n", t1 - t0, t2 - t1, t2);
  std::fflush(stdout);
  if (std::strcmp(mode, "_exit") == 0) _exit(0);
  if (std::strcmp(mode, "free") == 0) {
    if (reg_bytes > 0) cudaHostUnregister(host.data());
    cudaFreeHost(staging);
    cudaFree(d);
    std::printf("free %.3f\n", now() - t2);
    std::fflush(stdout);
    _exit(0);
  }
  if (std::strcmp(mode, "reset") == 0) {
    // Whether the driver's work at the end goes with the context (then a replay could destroy
    // it early, beside its last host work) or with the device files' close.
    check(cudaDeviceReset(), "cudaDeviceReset");
    std::printf("reset %.3f\n", now() - t2);
    std::fflush(stdout);
    _exit(0);
  }
  return 0;
}
