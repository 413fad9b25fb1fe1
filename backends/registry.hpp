// The one place that knows which backends this build has. Everything above backends/ (the
// bench library, cli/) asks here by name and never sees a CUDA or NCCL type.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/backend.hpp"

namespace dynemb {

// The backends compiled into this build, e.g. "cpu, cuda, nccl".
const char* compiled_backends();

// True when this build has the CUDA backend and a CUDA device and driver are present; never
// throws.
bool cuda_backend_usable();

// The backend called `name`:
//   auto  the CUDA backend when cuda_backend_usable(), else the CPU reference;
//   cpu   the CPU reference (lib/engine/cpu_backend.cpp);
//   cuda  all W ranks on CUDA device 0 (backends/cuda/);
//   nccl  W ranks on the GPUs listed in `devices` ("0,1,2,3"; empty: every visible GPU),
//         exchanges through NCCL (backends/nccl/).
// Throws UsageError for an unknown name, a backend this build lacks (naming the compiled ones)
// or `devices` with a backend other than nccl; DeviceError when the device cannot be used.
std::unique_ptr<Backend> make_backend(const std::string& name, const std::string& devices = "");

// make_backend, with the CUDA backend (cuda, or auto on a machine with a GPU) made on another
// thread while the caller goes on: creating its context and workspace takes a sizeable part of
// a second, which a replay spends opening the capture and reading its first batch instead.
// What make_backend refuses (usage, no usable device) it refuses here, at once and alike (it
// throws); the BackendStartup's name() is known at once, its get() waits until the backend is
// made and rethrows what making it threw. Every other backend comes made already.
BackendStartup start_backend(const std::string& name, const std::string& devices = "");

// The processes of one backend spread over a launcher's processes (process `index` of `size`),
// and process 0's bytes to every process (the same length everywhere).
struct BackendProcesses {
  int index = 0, size = 1;
  std::function<void(std::string&)> broadcast;
};
// Whether `name` spans the processes when made with start_backend(name, devices, processes):
// nccl, in a build that has it; its output dists are then collective (every process calls each
// with the same batch) and hand each process only its own ranks' outputs.
bool backend_spans_processes(const std::string& name);
// start_backend under a launcher: a backend that spans the processes (nccl: one communicator
// over every process's GPUs, made collectively: every process calls this at the same time) or,
// for any other, start_backend(name, devices) in each process. On any exception from the
// spanning backend the peers may be left waiting in its bootstrap: the caller ends the job.
BackendStartup start_backend(const std::string& name, const std::string& devices,
                             const BackendProcesses& processes);

}  // namespace dynemb
