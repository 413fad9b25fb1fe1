// The stages on the CUDA backend's kernels: the bucketize of all W ranks in one launch, then
// the sequence dist's steps (and the fused dist) or the pooled reduce; every result is checked
// against the CPU reference or the unfused steps before it is reported.
#include <fmt/core.h>

#include <cstring>
#include <sstream>

#include "common/error.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/diagnostics.hpp"
#include "cuda/timer.hpp"
#include "engine/input_dist.hpp"
#include "engine/ops.hpp"
#include "export.hpp"
#include "registry.hpp"
#include "stages.hpp"
#include "synth/synth.hpp"

namespace dynemb::bench {
namespace {

using cuda::DeviceBuffer;

// A stage to time: its table row (bytes from the shapes) and its launch.
struct StageRow {
  Stage stage;
  std::function<void()> launch;
};

// The bucketize path a batch takes, with the partition's tiling (and, in one launch, the
// kernel's resident blocks).
std::string path_note(const cuda::BucketizeChoice& c) {
  switch (c.path) {
    case cuda::BucketizePath::partition:
      return fmt::format("{} ({} tiles of <= {} bags)", cuda::to_string(c.path), c.grid,
                         c.tile_bags);
    case cuda::BucketizePath::partition_resident:
      return fmt::format("{} ({} tiles of <= {} bags, of {} resident)", cuda::to_string(c.path),
                         c.grid, c.tile_bags, c.capacity);
    default:
      return cuda::to_string(c.path);
  }
}

std::vector<int64_t> parse_dims(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ','))
    if (!tok.empty()) {
      try {
        v.push_back(std::stoll(tok));
      } catch (const std::exception&) {
        throw UsageError("--dims: '" + tok + "' is not an integer");
      }
      if (v.back() < 1) throw UsageError("--dims: dims must be >= 1");
    }
  return v;
}

// Device buffers compared in chunks on the host: true when bit-identical.
bool device_equal(const float* x, const float* y, int64_t n) {
  const int64_t chunk = int64_t{1} << 26;
  std::vector<float> a(static_cast<size_t>(std::min(n, chunk))), b(a.size());
  for (int64_t o = 0; o < n; o += chunk) {
    const int64_t m = std::min(chunk, n - o);
    CUDA_CHECK(cudaMemcpy(a.data(), x + o, 4 * m, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(b.data(), y + o, 4 * m, cudaMemcpyDeviceToHost));
    if (std::memcmp(a.data(), b.data(), 4 * m) != 0) return false;
  }
  return true;
}

// Fills [rows, D] with oracle rows (row r = oracle row r of table 0): real, distinct data.
void fill_rows(float* dst, int64_t rows, int64_t D, cudaStream_t s) {
  const int64_t chunk = int64_t{1} << 24;
  std::vector<uint64_t> g(static_cast<size_t>(std::min(rows, chunk)));
  DeviceBuffer<uint64_t> d_g;
  DeviceBuffer<cuda::DeviceRows> d_rows;
  DeviceBuffer<int32_t> d_t;
  cuda::DeviceRows oracle;
  oracle.seed = 0x1234567ULL;
  d_rows.upload(std::vector<cuda::DeviceRows>{oracle}, s);
  d_t.upload(std::vector<int32_t>(g.size(), 0), s);
  for (int64_t o = 0; o < rows; o += chunk) {
    const int64_t m = std::min(chunk, rows - o);
    for (int64_t i = 0; i < m; ++i) g[i] = static_cast<uint64_t>(o + i);
    d_g.upload(g.data(), m, s);
    cuda::launch_lookup_rows(d_g.data(), d_t.data(), d_rows.data(), m, D, dst + o * D, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

// The ceiling: a D2D memcpy of 1 GiB (2 GiB moved), GB/s.
double copy_bandwidth(CudaTimer& timer, cudaStream_t s) {
  const int64_t n = int64_t{1} << 28;
  DeviceBuffer<float> x(n), y(n);
  CUDA_CHECK(cudaMemsetAsync(x.data(), 0x3c, 4 * n, s));
  const double us = timer(
      [&] { CUDA_CHECK(cudaMemcpyAsync(y.data(), x.data(), 4 * n, cudaMemcpyDeviceToDevice, s)); });
  return 8.0 * n / (us * 1e3);
}

class CudaStages {
 public:
  CudaStages(const Options& o, const Workload& w)
      : o_(o),
        w_(w),
        p_(w.plan),
        W_(p_.world_size),
        timer_(stream_, o.iters, o.queue_ahead),
        cpu_(make_backend("cpu")) {
    for (const Kjt& k : w.kjts) kp_.push_back(&k);
    // CPU reference contexts (--sweep makes its own batches and checks none).
    if (!o.sweep) derived_ = derive_input_dist(p_, kp_);
  }

  Result run() {
    r_.backend = "cuda";
    r_.device = make_backend("cuda")->device();
    r_.launch_latency_excluded = o_.queue_ahead > 0;
    r_.copy_gbps = copy_bandwidth(timer_, stream_);
    if (o_.sweep) {
      sweep();
      return r_;
    }
    bucketize();
    if (p_.module == ModuleKind::sequence)
      sequence();
    else
      pooled();
    if (!o_.export_dir.empty()) {
      meta_["world_size"] = W_;
      meta_["module"] = to_string(p_.module);
      meta_["workload"] = w_.name;
      write_meta_json(o_, meta_);
    }
    return r_;
  }

 private:
  void time_rows(std::vector<StageRow>& rows) {
    for (StageRow& row : rows) {
      row.stage.us = timer_(row.launch);
      r_.stages.push_back(row.stage);
    }
  }
  void check(const std::string& what, bool ok, const char* failure) {
    r_.checks.push_back(fmt::format("check: {}: {}", what, ok ? "ok" : "MISMATCH"));
    if (!ok) throw DeviceError(std::string("bench: ") + failure);
  }
  void write_i64(const std::string& name, const std::vector<int64_t>& v) const {
    write_npy_i64(o_, name, v);
  }

  // --bucketize-kernel: auto and one-pass give the workspace of the cooperative launches (the
  // one-pass kernel, the partition's one launch: each taken where the batch fits it);
  // three-pass takes the three passes as auto chose them before the partition existed (a block
  // per bag for long bags, else a warp per bag); partition forces the partition's two kernels.
  // A forced path the batch does not fit falls back as auto would. The tiles are planned last,
  // for the path taken.
  void force_path(cuda::BatchedBucketize& bb) const {
    using P = cuda::BucketizeArgs::BagPath;
    cuda::BucketizeArgs& a = bb.args;
    if (o_.bucketize_path == "three-pass") {
      a.bag_path = a.total_ids >= cuda::kBlockPerBagMinAvg * a.total_bags ? P::block : P::warp;
    } else if (o_.bucketize_path == "partition") {
      a.bag_path = P::partition;
      a.partition_one_launch = false;
      bb.plan_tiles(0, stream_);
    } else {
      bb.enable_one_pass(stream_);
    }
    if (o_.tile_ids > 0) bb.plan_tiles(o_.tile_ids, stream_);
  }

  // All W ranks in one launch (bags concatenated rank-major).
  void bucketize() {
    cuda::BatchedBucketize bb(p_, kp_, /*with_dest_rank=*/false, stream_);
    const cuda::BucketizeArgs& ba = bb.args;
    const int64_t N = ba.total_ids, L = ba.total_bags;
    force_path(bb);
    const cuda::BucketizeChoice choice = cuda::bucketize_choice(ba, bb.one_pass);
    const bool one_pass = choice.path == cuda::BucketizePath::one_pass;
    // ids in; new_values + unbucketize_permute out; lengths in; new_lengths out (+ weights).
    std::vector<StageRow> rows{{{"bucketize (all ranks)", N, 0,
                                 8.0 * (3 * N + L + W_ * L) + (ba.weights ? 8.0 * N : 0.0), 0, ""},
                                [&] { bb.launch(stream_); }}};
    time_rows(rows);
    bucketize_us_ = rows[0].stage.us;
    bucketize_bytes_ = rows[0].stage.bytes;
    if (o_.diagnostics) {
      r_.diagnostics.push_back(
          one_pass ? fmt::format("bucketize path: one pass (1 kernel, a block per bag), {} blocks "
                                 "(of {} resident){}",
                                 choice.grid, choice.capacity,
                                 choice.ids_cached ? ", ids read once" : "")
                   : "bucketize path: " + path_note(choice));
      r_.diagnostics.push_back(bucketize_floors(bb, one_pass, timer_, r_.copy_gbps, stream_));
      if (one_pass || choice.path == cuda::BucketizePath::partition_resident)
        for (std::string& line : step_trace(bb, choice, stream_)) r_.diagnostics.push_back(line);
    }
    // Against the CPU reference (derive_input_dist's bucketize).
    const std::vector<int64_t> perm = bb.d_perm.download(stream_),
                               nv = bb.d_new_values.download(stream_),
                               nl = bb.d_new_lengths.download(stream_);
    bool ok = true;
    int64_t o = 0, ol = 0;
    for (int64_t r = 0; r < W_ && ok; ++r) {
      const BucketizedKjt& ref = derived_.ranks[r].bucketized;
      for (size_t i = 0; i < ref.unbucketize_permute.size(); ++i, ++o)
        ok = ok && perm[o] == ref.unbucketize_permute[i] && nv[o] == ref.new_values[i];
      for (size_t i = 0; i < ref.new_lengths.size(); ++i, ++ol)
        ok = ok && nl[ol] == ref.new_lengths[i];
    }
    check("batched bucketize == CPU reference", ok,
          "the GPU bucketize disagrees with the CPU reference");
    if (!o_.export_dir.empty()) {
      std::vector<int64_t> bag_blk;  // each bag's block size (the peer's continuous rule)
      for (const Kjt& k : w_.kjts)
        for (int64_t f = 0; f < p_.num_features(); ++f)
          bag_blk.insert(bag_blk.end(), static_cast<size_t>(k.batch_size(f)),
                         p_.features[f].block_size);
      std::vector<int64_t> ids;  // the batch's ids, rank after rank (on the device only)
      for (const Kjt& k : w_.kjts) ids.insert(ids.end(), k.values.begin(), k.values.end());
      write_i64("bk_ids", ids);
      write_i64("bk_lengths", bb.lengths);
      write_i64("bk_bag_blk", bag_blk);
      write_i64("bk_rank_bag_off", bb.rank_bag_off);
      write_i64("bk_perm", perm);
      meta_["dist_type"] = p_.features.empty() ? 0 : static_cast<int>(p_.features[0].dist_type);
      bool uniform = true;
      for (const FeatureInfo& fi : p_.features)
        uniform = uniform && fi.dist_type == p_.features[0].dist_type;
      meta_["dist_type_uniform"] = uniform;
    }
  }

  // --sweep: the bucketize alone at B = 512 ... 65536 per rank (the preset's plan and
  // hotness), each row naming the path taken, so that no batch size falls off a cliff unseen.
  // Timing only: the GPU tests check every path against the CPU reference.
  void sweep() {
    if (o_.preset.empty()) throw UsageError("bench --sweep needs --preset");
    for (int64_t B = 512; B <= 65536; B *= 2) {
      SynthOptions opt = preset_workload(o_.preset);
      for (int64_t& b : opt.batch_sizes) b = B;
      opt.seed = o_.seed;
      check_synth_options(p_, opt);
      const std::vector<Kjt> kjts = synth_kjts(p_, opt, 0);
      std::vector<const Kjt*> kp;
      for (const Kjt& k : kjts) kp.push_back(&k);
      cuda::BatchedBucketize bb(p_, kp, /*with_dest_rank=*/false, stream_);
      force_path(bb);
      const cuda::BucketizeArgs& ba = bb.args;
      const int64_t N = ba.total_ids, L = ba.total_bags;
      const cuda::BucketizeChoice c = cuda::bucketize_choice(ba, bb.one_pass);
      const bool one_pass = c.path == cuda::BucketizePath::one_pass;
      std::vector<StageRow> rows{
          {{fmt::format("bucketize B={} per rank", B), N, 0,
            8.0 * (3 * N + L + W_ * L) + (ba.weights ? 8.0 * N : 0.0), 0, path_note(c)},
           [&] { bb.launch(stream_); }}};
      time_rows(rows);
      if (o_.diagnostics) {
        r_.diagnostics.push_back(fmt::format(
            "B={}: {}", B, bucketize_floors(bb, one_pass, timer_, r_.copy_gbps, stream_)));
        if (c.path == cuda::BucketizePath::partition_resident)
          for (std::string& line : step_trace(bb, c, stream_))
            r_.diagnostics.push_back(fmt::format("B={}: {}", B, line));
      }
    }
  }

  // The three steps TorchRec runs (recat, exchange, unbucketize), their sum, the fused dist;
  // then the unbucketize gather at the --dims widths on the same permutation.
  void sequence() {
    const int64_t D = p_.seq_dim();
    std::vector<EmbTensor> shapes(W_);
    std::vector<const EmbTensor*> lp;
    std::vector<const ShardingContext*> cp;
    for (int64_t r = 0; r < W_; ++r) {
      int64_t rows = 0;
      for (int64_t x : *derived_.ranks[r].ctx.output_splits) rows += x;
      shapes[r].shape = {rows, D};
      lp.push_back(&shapes[r]);
      cp.push_back(&derived_.ranks[r].ctx);
    }
    const cuda::SeqDistTables t = cuda::build_seq_dist_tables(p_, lp, cp);
    cuda::SeqDistDevice dev(t, stream_);
    const int64_t Rl = t.local_row_off.back(), Ro = t.out_row_off.back();
    DeviceBuffer<float> local(Rl * D), send(Rl * D), recv(Ro * D), out(Ro * D), out2(Ro * D);
    fill_rows(local.data(), Rl, D, stream_);
    std::vector<int64_t> gperm(static_cast<size_t>(Ro));
    for (int64_t r = 0; r < W_; ++r)
      for (int64_t i = t.out_row_off[r]; i < t.out_row_off[r + 1]; ++i)
        gperm[i] = t.perm[i] + t.out_row_off[r];  // recv rows of rank r = out rows of rank r
    DeviceBuffer<int64_t> d_gperm;
    d_gperm.upload(gperm, stream_);
    const cuda::SeqDistArgs sa = dev.args(p_, local.data());
    const double row = 4.0 * D, out_bytes = 2 * row * Ro + 8.0 * Ro;
    const cudaStream_t s = stream_;
    std::vector<StageRow> steps{
        {{"recat permute", Rl, D, 2 * row * Rl, 0, ""},
         [&] { cuda::launch_seq_recat(sa, send.data(), s); }},
        {{"exchange", Ro, D, 2 * row * Ro, 0, ""},
         [&] { cuda::launch_seq_exchange(sa, send.data(), recv.data(), s); }},
        {{"unbucketize", Ro, D, out_bytes, 0, ""},
         [&] { cuda::launch_gather_rows(recv.data(), d_gperm.data(), Ro, D, out.data(), s); }}};
    time_rows(steps);
    const double three = steps[0].stage.us + steps[1].stage.us + steps[2].stage.us;
    r_.stages.push_back(
        {"sequence dist (3 steps, ours)", Ro, D, out_bytes, three, "sum of the 3 rows above"});
    std::vector<StageRow> fused{{{"sequence dist (fused)", Ro, D, out_bytes, 0, ""},
                                 [&] { cuda::launch_seq_fused(sa, out2.data(), s); }}};
    time_rows(fused);
    // The whole GPU side of the sequence input -> output dist: the stage above plus the fused
    // dist (bench/peer_torch.py times torch's composition of the same steps).
    r_.stages.push_back({"pipeline (bucketize + fused)", Ro, D, bucketize_bytes_ + out_bytes,
                         bucketize_us_ + fused[0].stage.us, "sum of the two rows"});
    check("fused == recat+exchange+unbucketize (bitwise)",
          device_equal(out.data(), out2.data(), Ro * D),
          "the fused sequence dist disagrees with the 3 steps");
    r_.checks.push_back(fmt::format("fused sequence dist: {:.2f}x faster than our own 3 steps",
                                    three / fused[0].stage.us));
    const std::vector<int64_t> dims = parse_dims(o_.dims);
    send = DeviceBuffer<float>();
    out2 = DeviceBuffer<float>();
    for (const int64_t Dx : dims) {
      DeviceBuffer<float> src(Ro * Dx), dst(Ro * Dx);
      fill_rows(src.data(), Ro, Dx, s);
      std::vector<StageRow> gather{
          {{fmt::format("unbucketize D={} ({} B rows)", Dx, 4 * Dx), Ro, Dx,
            2.0 * 4 * Dx * Ro + 8.0 * Ro, 0, ""},
           [&] { cuda::launch_gather_rows(src.data(), d_gperm.data(), Ro, Dx, dst.data(), s); }}};
      time_rows(gather);
    }
    if (!o_.export_dir.empty()) export_sequence(t, gperm, Rl, Ro, D, dims);
  }

  void export_sequence(const cuda::SeqDistTables& t, const std::vector<int64_t>& gperm, int64_t Rl,
                       int64_t Ro, int64_t D, const std::vector<int64_t>& dims) {
    write_i64("seq_perm_global", gperm);
    // Recat as a row map (send row -> local row), the exchange as W*W slices (dest-major).
    std::vector<int64_t> recat_rows(static_cast<size_t>(Rl));
    for (int64_t r = 0; r < W_; ++r) {
      const int64_t b0 = t.seg_base[r], b1 = t.seg_base[r + 1];
      const int64_t n = t.local_row_off[r + 1] - t.local_row_off[r];
      for (int64_t k = b0; k < b1; ++k) {
        const int64_t end = k + 1 < b1 ? t.seg_out[k + 1] : n;
        for (int64_t q = t.seg_out[k]; q < end; ++q)
          recat_rows[t.local_row_off[r] + q] = t.local_row_off[r] + t.seg_src[k] + q - t.seg_out[k];
      }
    }
    write_i64("seq_recat_rows", recat_rows);
    std::vector<int64_t> slices;  // (start, count) of send rows for (dest s, source r)
    for (int64_t d = 0; d < W_; ++d)
      for (int64_t r = 0; r < W_; ++r) {
        const int64_t* so = &t.send_off[r * (W_ + 1)];
        slices.push_back(t.local_row_off[r] + so[d]);
        slices.push_back(so[d + 1] - so[d]);
      }
    write_i64("seq_slices", slices);
    meta_["seq_rows_local"] = Rl;
    meta_["seq_rows_out"] = Ro;
    meta_["seq_dim"] = D;
    meta_["dims"] = dims;
  }

  // The reduce of W partial buffers (equal, unequal and VBE batches are one elementwise sum).
  void pooled() {
    const int64_t F = p_.num_features();
    int64_t numel = 0, rows = 0;
    // Partial-buffer size from the contexts: [sum_s B_s, sum_D] or the 1-D VBE layout.
    const ShardingContext& c = derived_.ranks[0].ctx;
    if (derived_.variable_batch) {
      for (int64_t r = 0; r < W_; ++r)
        for (int64_t f = 0; f < F; ++f)
          numel += (*c.batch_size_per_rank_per_feature)[r][f] * p_.features[f].dim;
    } else {
      for (int64_t x : *c.batch_size_per_rank) rows += x;
      numel = rows * p_.sum_dim;
    }
    DeviceBuffer<float> parts(W_ * numel), out(numel);
    fill_rows(parts.data(), W_ * (numel / std::max<int64_t>(1, p_.sum_dim)), p_.sum_dim, stream_);
    const cuda::Precision rd = cuda::precision(pooled_reduce_dtype(p_));
    const cudaStream_t s = stream_;
    std::vector<StageRow> reduce{
        {{"pooled reduce", rows, p_.sum_dim, 4.0 * numel * (W_ + 1), 0,
          derived_.variable_batch ? "VBE" : ""},
         [&] { cuda::launch_reduce(parts.data(), W_, numel, numel, rd, out.data(), s); }}};
    time_rows(reduce);
    if (!o_.export_dir.empty()) meta_["pool_numel"] = numel;
  }

  const Options& o_;
  const Workload& w_;
  const Plan& p_;
  const int64_t W_;
  Stream stream_;
  CudaTimer timer_;
  std::unique_ptr<Backend> cpu_;
  std::vector<const Kjt*> kp_;
  DerivedBatch derived_;
  double bucketize_us_ = 0, bucketize_bytes_ = 0;  // the bucketize row, for the pipeline row
  Result r_;
  nlohmann::json meta_;
};

}  // namespace

Result run_cuda_stages(const Options& o, const Workload& w) {
  if (!cuda_backend_usable())
    throw DeviceError("bench --backend cuda: no CUDA device or driver on this machine");
  return CudaStages(o, w).run();
}

}  // namespace dynemb::bench
