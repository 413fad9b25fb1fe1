// The stages on the CPU reference backend (through the Backend interface), host clock.
#include "common/error.hpp"
#include "engine/input_dist.hpp"
#include "registry.hpp"
#include "stages.hpp"

namespace dynemb::bench {

Result run_cpu_stages(const Options& o, const Workload& w) {
  auto be = make_backend("cpu");
  const Plan& p = w.plan;
  const HostTimer timer(o.iters);
  Result r;
  r.backend = "cpu";
  r.device = be->device();
  std::vector<const Kjt*> kp;
  int64_t N = 0, L = 0;
  for (const Kjt& k : w.kjts) {
    kp.push_back(&k);
    N += k.num_ids();
    L += k.num_bags();
  }
  // ids in; new_values + unbucketize_permute out; lengths in; new_lengths out.
  Stage b{"bucketize", N, 0, 8.0 * (3 * N + L + p.world_size * L), 0, ""};
  b.us = timer([&] {
    for (const Kjt& k : w.kjts) (void)be->bucketize(p, k);
  });
  r.stages.push_back(b);
  const DerivedBatch d = derive_input_dist(p, kp);
  const OracleSource src(o.seed, p);
  const std::vector<EmbTensor> local = derive_local_embs(p, d, src, *be, 0);
  std::vector<TensorRef> lp;
  std::vector<const ShardingContext*> cp;
  for (size_t i = 0; i < local.size(); ++i) {
    lp.emplace_back(local[i]);
    cp.push_back(&d.ranks[i].ctx);
  }
  if (p.module == ModuleKind::sequence) {
    const int64_t D = p.seq_dim();
    Stage s{"sequence dist (cpu reference)", N, D, 8.0 * D * N + 8.0 * N, 0, ""};
    s.us = timer([&] { be->sequence_output_dist(p, lp, cp, Place::host, [](int, Tensor&&) {}); });
    r.stages.push_back(s);
  } else {
    const double n = static_cast<double>(local[0].numel());
    Stage s{"pooled reduce (cpu reference)",
            local[0].rows(),
            p.sum_dim,
            4.0 * n * (p.world_size + 1),
            0,
            ""};
    s.us = timer([&] {
      be->pooled_output_dist(p, d.variable_batch, lp, cp, Place::host, [](int, Tensor&&) {});
    });
    r.stages.push_back(s);
  }
  return r;
}

}  // namespace dynemb::bench
