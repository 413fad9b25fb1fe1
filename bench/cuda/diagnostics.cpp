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

std::vector<std::string> one_pass_trace(cuda::BatchedBucketize& bb, cudaStream_t s) {
  constexpr int P = cuda::kBucketizeTracePoints;
  const int64_t L = bb.args.total_bags;
  cuda::DeviceBuffer<unsigned long long> d_trace(P * L);
  CUDA_CHECK(cudaMemsetAsync(d_trace.data(), 0, sizeof(unsigned long long) * P * L, s));
  cuda::launch_bucketize_traced(bb.args, bb.d_lengths.data(), bb.one_pass, d_trace.data(), s);
  const std::vector<unsigned long long> tr = d_trace.download(s);
  if (std::all_of(tr.begin(), tr.end(), [](unsigned long long x) { return x == 0; }))
    return {"one-pass steps: not recorded (the traced launch took the three passes)"};
  unsigned long long t0 = ~0ull;
  for (int64_t g = 0; g < L; ++g) t0 = std::min(t0, tr[g * P]);
  const auto us = [&](int64_t g, int pt) {  // block g's stamp pt, us after the first start
    return 1e-3 * static_cast<double>(tr[g * P + pt] - t0);
  };
  std::string line = fmt::format(
      "one-pass steps over {} bags, us after the first block started (median / max):", L);
  const char* const names[] = {"start", "bag offsets", "counts published", "rank's counts seen",
                               "bases", "placed"};
  for (int pt = 0; pt < P; ++pt) {
    std::vector<double> v;
    for (int64_t g = 0; g < L; ++g) v.push_back(us(g, pt));
    std::sort(v.begin(), v.end());
    line += fmt::format(" {} {:.1f}/{:.1f}{}", names[pt], v[v.size() / 2], v.back(),
                        pt + 1 < P ? "," : "");
  }
  // Blocks are dispatched in index order, so quarter k (blocks g with g*4/L = k) holds
  // roughly the k-th block of each SM; the quarter whose slowest block is latest sets the end.
  std::string by_quarter = fmt::format(
      "one-pass slowest block per quarter of the grid (blocks g*4/{} = k), us: counts "
      "published / rank's counts seen / placed:",
      L);
  double pub[4] = {}, seen[4] = {}, placed[4] = {};
  bool any[4] = {};
  for (int64_t g = 0; g < L; ++g) {
    const int64_t k = g * 4 / L;
    any[k] = true;
    pub[k] = std::max(pub[k], us(g, 2));
    seen[k] = std::max(seen[k], us(g, 3));
    placed[k] = std::max(placed[k], us(g, 5));
  }
  for (int k = 0; k < 4; ++k)
    by_quarter += any[k] ? fmt::format(" q{} {:.1f}/{:.1f}/{:.1f}", k, pub[k], seen[k], placed[k])
                         : fmt::format(" q{} -", k);
  return {line, by_quarter};
}

}  // namespace dynemb::bench
