// The CUDA backend's Comparator: the checks of a replay made on the device where the backend
// keeps its tensors (kernels/compare.cu), so that a passing check copies nothing back. A host
// side of a comparison goes up once to the workspace's rows_in (free between dists); two host
// sides are the host comparator's, as a backend that keeps nothing compares them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/backend.hpp"
#include "workspace.hpp"

namespace dynemb::cuda {

// What the comparator asks of its backend.
class DeviceTensors {
 public:
  virtual ~DeviceTensors() = default;
  // The device memory of the kept tensor `k` (null for an empty one), or nullopt when none of n
  // elements is kept under that name (Kept: one per role and rank).
  virtual std::optional<const float*> kept_data(const Kept& k, int64_t n) const = 0;
  // The unsharded reference of `kjt` (reference_output) made into the workspace's rows_out, left
  // queued on the stream; its shape, or nullopt when it is the host's to make.
  virtual std::optional<std::vector<int64_t>> reference_on_device(
      const Plan& plan, const Kjt& kjt, const EmbeddingSource& source) = 0;
  // Rank `rank`'s lookup of `kjt` made into the workspace's rows_out, left queued on the stream;
  // its shape, or nullopt when it is the host's to make.
  virtual std::optional<std::vector<int64_t>> lookup_into_rows_out(
      const Plan& plan, int rank, const LookupKjt& kjt, const EmbeddingSource& source) = 0;
};

// got against want, n device floats each, on s: the tiles' statistics come back, then both
// sides' values of the tiles of the first mismatches (tiles_with_first). Ends with s drained.
std::vector<TileDiff> tile_diffs_on_device(BackendWorkspace& ws, cudaStream_t s, const float* got,
                                           const float* want, int64_t n, const TileCompare& how);

class DeviceComparator final : public Comparator {
 public:
  DeviceComparator(DeviceTensors& tensors, BackendWorkspace& ws, cudaStream_t stream, int device)
      : tensors_(tensors), ws_(ws), stream_(stream), device_(device) {}
  // Two host sides: host_comparator(). Else on the device, the host side (if any) uploaded to
  // rows_in. nullopt also when a kept side is no longer kept with n elements.
  std::optional<std::vector<TileDiff>> compare(const TensorRef& got, const TensorRef& want,
                                               const TileCompare& how) override;
  // The lookup made on the device in rows_out when it can be (else on the host, a kept `got`
  // downloaded for it) and compared there with `got` (host: uploaded to rows_in).
  std::optional<std::vector<TileDiff>> compare_lookup(const TensorRef& got, const Plan& plan,
                                                      int rank, const LookupKjt& kjt,
                                                      const EmbeddingSource& source,
                                                      const TileCompare& how) override;
  // The reference made on the device in rows_out when it can be (else on the host, a kept `got`
  // downloaded for it) and compared there with `got` (host: uploaded to rows_in).
  std::optional<std::vector<TileDiff>> compare_reference(const TensorRef& got, const Plan& plan,
                                                         int rank, const Kjt& kjt,
                                                         const EmbeddingSource& source,
                                                         int64_t batch,
                                                         const TileCompare& how) override;

 private:
  // t on the device: its kept memory, or its host data uploaded to rows_in; nullopt when t is
  // kept and no such tensor of t.n elements is.
  std::optional<const float*> on_device(const TensorRef& t);
  // `got` against what make() leaves in rows_out (its shape; nullopt: the host's to make, then
  // host(got on the host)).
  template <class Make, class Host>
  std::optional<std::vector<TileDiff>> against_rows_out(const TensorRef& got, Make&& make,
                                                        Host&& host, const TileCompare& how);

  DeviceTensors& tensors_;
  BackendWorkspace& ws_;
  cudaStream_t stream_;
  int device_;
};

}  // namespace dynemb::cuda
