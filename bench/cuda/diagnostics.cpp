#include "cuda/diagnostics.hpp"

#include <fmt/core.h>

#include <algorithm>

namespace dynemb::bench {

std::string bucketize_floors(cuda::BatchedBucketize& bb, bool one_pass, CudaTimer& timer,
                             double copy_gbps, cudaStream_t s) {
  // No kernel of this grid that writes the stage's outputs can beat the streaming floor.
  const int64_t N = bb.args.total_ids, L = bb.args.total_bags;
  const int64_t blocks = one_pass ? L : std::max<int64_t>(1, (N + 2047) / 2048);
  cuda::DeviceBuffer<int64_t> values(N), perm(N);
  const double t_empty = timer([&] { cuda::launch_empty(blocks, 256, s); });
  const double t_stream = timer([&] {
    cuda::launch_stream_floor(bb.d_ids.data(), N, values.data(), perm.data(), blocks, s);
  });
  const double bytes = 24.0 * static_cast<double>(N);
  return fmt::format(
      "bucketize floors, {} blocks x 256: empty kernel {:.2f} us; streaming its {:.1f} MB "
      "(ids in, values and perm out, no routing) {:.2f} us = {:.1f} % of copy",
      blocks, t_empty, 1e-6 * bytes, t_stream,
      copy_gbps > 0 ? 100.0 * bytes / (t_stream * 1e3) / copy_gbps : 0.0);
}

std::vector<std::string> step_trace(cuda::BatchedBucketize& bb, const cuda::BucketizeChoice& c,
                                    cudaStream_t s) {
  constexpr int P = cuda::kBucketizeTracePoints;
  const bool one_pass = c.path == cuda::BucketizePath::one_pass;
  const char* what = one_pass ? "one-pass" : "one-launch partition";
  const int64_t L = c.grid;  // blocks: bags (one pass) or tiles (partition)
  if (L <= 0) return {};
  cuda::DeviceBuffer<unsigned long long> d_trace(P * L);
  CUDA_CHECK(cudaMemsetAsync(d_trace.data(), 0, sizeof(unsigned long long) * P * L, s));
  cuda::launch_bucketize_traced(bb.args, bb.d_lengths.data(), bb.one_pass, d_trace.data(), s);
  const std::vector<unsigned long long> tr = d_trace.download(s);
  if (std::all_of(tr.begin(), tr.end(), [](unsigned long long x) { return x == 0; }))
    return {fmt::format("{} steps: not recorded (the traced launch took another path)", what)};
  unsigned long long t0 = ~0ull;
  for (int64_t g = 0; g < L; ++g) t0 = std::min(t0, tr[g * P]);
  const auto us = [&](int64_t g, int pt) {  // block g's stamp pt, us after the first start
    return 1e-3 * static_cast<double>(tr[g * P + pt] - t0);
  };
  const char* const op_names[] = {"start", "bag offsets", "counts published", "rank's counts seen",
                                  "bases", "placed"};
  const char* const part_names[] = {
      "start", "bag offsets", "counts published", "first chunk ranked", "rank's counts seen",
      "placed"};
  const char* const* names = one_pass ? op_names : part_names;
  std::string line = fmt::format(
      "{} steps over {} blocks, us after the first block started (median / max):", what, L);
  std::string steps = fmt::format("{} step durations per block, us (median / max):", what);
  for (int pt = 0; pt < P; ++pt) {
    std::vector<double> v, dv;
    for (int64_t g = 0; g < L; ++g) {
      v.push_back(us(g, pt));
      if (pt > 0) dv.push_back(us(g, pt) - us(g, pt - 1));
    }
    std::sort(v.begin(), v.end());
    std::sort(dv.begin(), dv.end());
    line += fmt::format(" {} {:.1f}/{:.1f}{}", names[pt], v[v.size() / 2], v.back(),
                        pt + 1 < P ? "," : "");
    if (pt > 0)
      steps += fmt::format(" {} {:.2f}/{:.2f}{}", names[pt], dv[dv.size() / 2], dv.back(),
                           pt + 1 < P ? "," : "");
  }
  // Blocks are dispatched in index order, so quarter k (blocks g with g*4/L = k) holds
  // roughly the k-th block of each SM; the quarter whose slowest block is latest sets the end.
  std::string by_quarter = fmt::format(
      "{} slowest block per quarter of the grid (blocks g*4/{} = k), us: counts "
      "published / {} / placed:",
      what, L, names[one_pass ? 3 : 4]);
  double pub[4] = {}, seen[4] = {}, placed[4] = {};
  bool any[4] = {};
  for (int64_t g = 0; g < L; ++g) {
    const int64_t k = g * 4 / L;
    any[k] = true;
    pub[k] = std::max(pub[k], us(g, 2));
    seen[k] = std::max(seen[k], us(g, one_pass ? 3 : 4));
    placed[k] = std::max(placed[k], us(g, 5));
  }
  for (int k = 0; k < 4; ++k)
    by_quarter += any[k] ? fmt::format(" q{} {:.1f}/{:.1f}/{:.1f}", k, pub[k], seen[k], placed[k])
                         : fmt::format(" q{} -", k);
  return {line, steps, by_quarter};
}

}  // namespace dynemb::bench
