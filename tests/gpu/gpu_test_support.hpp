// What the GPU tests share: the skip when there is no device, the CPU reference they compare
// with, bitwise float comparison, and the output dist of one batch on a backend.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "engine/backend.hpp"
#include "engine/input_dist.hpp"

namespace dynemb::test {

// Exits with CTest's skip code (77) when the machine has no usable device.
inline void skip_unless(bool device_available) {
  if (device_available) return;
  std::printf("SKIP: no CUDA device or driver on this machine (GPU tests need one)\n");
  std::fflush(stdout);
  std::exit(77);
}

// The CPU reference every GPU result is compared with (two threads: the test machine's
// cores go to the GPU backend's host work).
inline Backend& cpu() {
  static std::unique_ptr<Backend> b = make_cpu_backend(2);
  return *b;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

// The first element whose bits differ (the shorter length when one is a prefix), -1: none.
inline int64_t first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) return static_cast<int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<int64_t>(std::min(a.size(), b.size()));
}

// The output dist of one batch on `backend`, from every rank's lookup output (on the host or
// kept by `backend`) and the derived contexts: each rank's output, in rank order, where `place`
// asks (a backend that keeps nothing hands back host tensors).
inline std::vector<Tensor> run_output_dist(Backend& backend, const Plan& plan,
                                           const DerivedBatch& derived,
                                           const std::vector<TensorRef>& local, Place place) {
  const size_t W = local.size();
  std::vector<const ShardingContext*> cp;
  for (size_t r = 0; r < W; ++r) cp.push_back(&derived.ranks[r].ctx);
  std::vector<Tensor> out(W);
  auto sink = [&out](int r, Tensor&& t) { out[static_cast<size_t>(r)] = std::move(t); };
  if (plan.module == ModuleKind::sequence)
    backend.sequence_output_dist(plan, local, cp, place, sink);
  else
    backend.pooled_output_dist(plan, derived.variable_batch, local, cp, place, sink);
  return out;
}

// The same from host tensors, to host tensors.
inline std::vector<EmbTensor> run_output_dist(Backend& backend, const Plan& plan,
                                              const DerivedBatch& derived,
                                              const std::vector<EmbTensor>& local) {
  const std::vector<TensorRef> refs(local.begin(), local.end());
  std::vector<EmbTensor> out;
  for (Tensor& t : run_output_dist(backend, plan, derived, refs, Place::host))
    out.push_back(std::move(t.t));
  return out;
}

// Rank r's TensorRef of each tensor (host data, or kept: its name).
inline std::vector<TensorRef> refs_of(const std::vector<Tensor>& v) {
  return std::vector<TensorRef>(v.begin(), v.end());
}

}  // namespace dynemb::test
