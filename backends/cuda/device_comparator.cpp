// The CUDA backend's checks on the device (device_comparator.hpp).
#include "device_comparator.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "common/trace.hpp"
#include "compare.hpp"
#include "cuda_check.hpp"

namespace dynemb::cuda {

std::vector<TileDiff> tile_diffs_on_device(BackendWorkspace& ws, cudaStream_t s, const float* got,
                                           const float* want, int64_t n, const TileCompare& how) {
  const int64_t tile = std::max<int64_t>(1, how.tile);
  ToleranceArgs tol;
  tol.kind = how.tol.kind == Tolerance::Kind::ulp   ? ToleranceArgs::ulp
             : how.tol.kind == Tolerance::Kind::rel ? ToleranceArgs::rel
                                                    : ToleranceArgs::exact;
  tol.ulps = how.tol.ulps;
  tol.rtol = how.tol.rtol;
  tol.atol = how.tol.atol;
  ws.tile_stats.resize((n + tile - 1) / tile);
  launch_tile_stats(got, want, n, tile, tol, ws.tile_stats.data(), s);
  const std::vector<TileStatsOut> out = ws.staging.download(ws.tile_stats, s);
  std::vector<TileStats> stats(out.size());
  for (size_t t = 0; t < out.size(); ++t)
    stats[t] = {out[t].mismatches, out[t].max_abs_err, out[t].max_rel_err, out[t].max_ulp};
  std::vector<TileDiff> tiles = tiles_from_stats(stats, n, how);
  std::vector<PinnedStaging::ToHost> parts;
  for (TileDiff& d : tiles)  // the values of the tiles of the first mismatches
    if (!d.got.empty()) {
      const size_t bytes = sizeof(float) * d.got.size();
      parts.push_back({d.got.data(), got + d.begin, bytes});
      parts.push_back({d.want.data(), want + d.begin, bytes});
    }
  if (!parts.empty()) ws.staging.download(parts, s);
  return tiles;
}

std::optional<const float*> DeviceComparator::on_device(const TensorRef& t) {
  if (t.kept) return tensors_.kept_data(*t.kept, t.n);
  const TraceSpan span("upload", t.n);
  ws_.rows_in.resize(t.n);
  ws_.staging.upload(ws_.rows_in.data(), t.host, sizeof(float) * size_t(t.n), stream_);
  return ws_.rows_in.data();
}

std::optional<std::vector<TileDiff>> DeviceComparator::compare(const TensorRef& got,
                                                               const TensorRef& want,
                                                               const TileCompare& how) {
  if (got.n != want.n) return std::nullopt;
  if (!got.kept && !want.kept) return host_comparator().compare(got, want, how);
  CUDA_CHECK(cudaSetDevice(device_));
  // At most one side is on the host, so rows_in holds at most one upload.
  const std::optional<const float*> g = on_device(got);
  const std::optional<const float*> w = g ? on_device(want) : std::nullopt;
  if (!g || !w) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // every call ends with its stream drained
    return std::nullopt;
  }
  const TraceSpan span("compare", got.n);
  return tile_diffs_on_device(ws_, stream_, *g, *w, got.n, how);
}

template <class Make, class Host>
std::optional<std::vector<TileDiff>> DeviceComparator::against_rows_out(const TensorRef& got,
                                                                        Make&& make, Host&& host,
                                                                        const TileCompare& how) {
  CUDA_CHECK(cudaSetDevice(device_));
  std::optional<const float*> kept;
  if (got.kept) {
    kept = tensors_.kept_data(*got.kept, got.n);
    if (!kept) return std::nullopt;
  }
  const std::optional<std::vector<int64_t>> shape = make();
  if (!shape) {  // the host makes it: a kept `got` goes there
    if (!kept) return host(got);
    std::vector<float> on_host(static_cast<size_t>(got.n));
    ws_.staging.download({{on_host.data(), *kept, sizeof(float) * on_host.size()}}, stream_);
    TensorRef h = TensorRef::span(on_host.data(), got.n, got.dtype);
    h.shape = got.shape;
    return host(h);
  }
  if (shape_numel(*shape) != got.n) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // every call ends with its stream drained
    return std::nullopt;
  }
  const float* g = kept ? *kept : *on_device(got);  // a host `got` is always on the device
  const TraceSpan span("compare", got.n);
  return tile_diffs_on_device(ws_, stream_, g, ws_.rows_out.data(), got.n, how);
}

std::optional<std::vector<TileDiff>> DeviceComparator::compare_lookup(const TensorRef& got,
                                                                      const Plan& plan, int rank,
                                                                      const LookupKjt& kjt,
                                                                      const EmbeddingSource& source,
                                                                      const TileCompare& how) {
  return against_rows_out(
      got, [&] { return tensors_.lookup_into_rows_out(plan, rank, kjt, source); },
      [&](const TensorRef& h) {
        return host_comparator().compare_lookup(h, plan, rank, kjt, source, how);
      },
      how);
}

std::optional<std::vector<TileDiff>> DeviceComparator::compare_reference(
    const TensorRef& got, const Plan& plan, int rank, const Kjt& kjt, const EmbeddingSource& source,
    int64_t batch, const TileCompare& how) {
  return against_rows_out(
      got, [&] { return tensors_.reference_on_device(plan, kjt, source); },
      [&](const TensorRef& h) {
        return host_comparator().compare_reference(h, plan, rank, kjt, source, batch, how);
      },
      how);
}

}  // namespace dynemb::cuda
