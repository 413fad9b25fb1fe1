// `dynemb-dist bench (CAPTURE.h5 | --preset NAME) [--backend cuda|cpu] [--iters N]
//  [--json FILE]` (cli.md): times each stage of the replay and reports time, the fewest bytes
// the stage must move (each input read once, each output written once, plus index bytes),
// GB/s and % of the device copy bandwidth measured in the same run (a D2D cudaMemcpy,
// bytes read + written). CUDA: device events around each repeat after warm-up, median.
// CPU: the reference backend through the Backend interface, host clock, median.
//
// Extra options: --scale K multiplies the preset's local batch (e.g. unit-pooled-w8 x64 for
// a >= 1 GB reduce); --dims LIST sweeps the unbucketize gather over row widths (fp32 D) on
// the same permutation; --export DIR writes the index data (.npy) bench/peer_torch.py runs
// the torch ops on, so the peer times the same work on the same data.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "capture/capture.hpp"
#include "capture/synth.hpp"
#include "commands.hpp"
#include "common/error.hpp"
#include "common/output_file.hpp"
#include "engine/engine.hpp"
#include "engine/ops.hpp"
#ifdef DYNEMB_HAVE_CUDA
#include "cuda_backend.hpp"
#endif

namespace dynemb::cli {
namespace {

struct BenchArgs {
  std::string capture, preset, backend = "cuda", json, export_dir, dims;
  int iters = 20;
  int64_t queue_ahead = 200000;           // SM cycles spun before each timed repeat (0: off)
  std::string bucketize_kernel = "auto";  // auto | one-pass | three-pass
  int64_t scale = 1;
  uint64_t seed = 1;
};

struct Workload {
  std::string name;
  Plan plan;
  std::vector<Kjt> kjts;
};

struct Stage {
  std::string name;
  int64_t rows = 0, dim = 0;
  double bytes = 0, us = 0;
  std::string note;
};

Workload load_workload(const BenchArgs& a) {
  Workload w;
  if (!a.preset.empty()) {
    w.name = a.preset;
    w.plan = preset_plan(a.preset);
    SynthOptions opt = preset_workload(a.preset);
    for (int64_t& b : opt.batch_sizes) b *= a.scale;
    opt.seed = a.seed;
    check_synth_options(w.plan, opt);
    w.kjts = synth_kjts(w.plan, opt, 0);
    if (a.scale != 1) w.name += fmt::format(" x{}", a.scale);
  } else {
    CaptureReader cap(a.capture);
    w.name = a.capture;
    w.plan = capture_plan(cap);
    if (cap.num_batches() < 1) throw CaptureError(a.capture, "/batches", "no batch to bench");
    ReadParts parts;
    parts.ctx = parts.local_embs = parts.output = false;
    Batch b = cap.read_batch(w.plan, 0, parts);
    for (RankBatch& rb : b.ranks) w.kjts.push_back(std::move(rb.kjt));
  }
  for (size_t r = 0; r < w.kjts.size(); ++r)
    check_kjt(w.plan, w.kjts[r], fmt::format("{}: rank {}", w.name, r));
  return w;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Minimal .npy (v1.0) writer for the peer: little-endian int64 / float32, C order.
void write_npy(const std::string& path, const void* data, const char* descr, size_t elem,
               const std::vector<int64_t>& shape) {
  std::string sh = "(";
  size_t n = 1;
  for (int64_t s : shape) {
    sh += std::to_string(s) + ",";
    n *= static_cast<size_t>(s);
  }
  sh += ")";
  std::string hdr =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, sh);
  while ((10 + hdr.size() + 1) % 64 != 0) hdr += ' ';
  hdr += '\n';
  std::ofstream f(path + ".tmp", std::ios::binary);
  const char magic[] = "\x93NUMPY\x01\x00";
  f.write(magic, 8);
  const uint16_t len = static_cast<uint16_t>(hdr.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(hdr.data(), static_cast<std::streamsize>(hdr.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n * elem));
  if (!f) throw Error("bench --export: cannot write " + path);
  f.close();
  std::filesystem::rename(path + ".tmp", path);
}
[[maybe_unused]] void write_i64(const std::string& dir, const std::string& name,
                                const std::vector<int64_t>& v) {
  write_npy(dir + "/" + name + ".npy", v.data(), "<i8", 8, {static_cast<int64_t>(v.size())});
}

// --json's file, created (its temporary) before any work (common/output_file.hpp).
std::unique_ptr<OutputFile> g_json_out;

void report(const BenchArgs& a, const Workload& w, const std::string& device, double copy_gbps,
            const std::vector<Stage>& stages, const std::vector<std::string>& notes) {
  const Plan& p = w.plan;
  int64_t ids = 0;
  for (const Kjt& k : w.kjts) ids += k.num_ids();
  fmt::print("# dynemb-dist bench: {} ({}, W={}, F={}, {} ids), backend {}, device {}\n", w.name,
             to_string(p.module), p.world_size, p.num_features(), ids, a.backend, device);
  if (copy_gbps > 0)
    fmt::print("# copy bandwidth (D2D cudaMemcpy, bytes read + written): {:.1f} GB/s\n", copy_gbps);
  fmt::print("# iters {} after warm-up; time = median; bytes = fewest bytes the stage must move\n",
             a.iters);
  if (a.backend == "cuda")
    fmt::print("# launch latency {} (--queue-ahead {})\n",
               a.queue_ahead > 0 ? "excluded: stage queued behind a spin kernel" : "included",
               a.queue_ahead);
  fmt::print("#{:>34} {:>12} {:>6} {:>12} {:>11} {:>9} {:>7}\n", "stage", "rows", "dim", "bytes",
             "time(us)", "GB/s", "%copy");
  nlohmann::json js;
  js["format"] = "dynemb-dist-bench";
  js["version"] = 1;
  js["workload"] = w.name;
  js["preset"] = a.preset;
  js["scale"] = a.scale;
  js["queue_ahead_cycles"] = a.backend == "cuda" ? a.queue_ahead : 0;
  js["module"] = to_string(p.module);
  js["world_size"] = p.world_size;
  js["num_ids"] = ids;
  js["backend"] = a.backend;
  js["device"] = device;
  js["iters"] = a.iters;
  js["copy_gbps"] = copy_gbps;
  js["stages"] = nlohmann::json::array();
  for (const Stage& s : stages) {
    const double gbps = s.us > 0 ? s.bytes / (s.us * 1e3) : 0;
    const double pct = copy_gbps > 0 ? 100.0 * gbps / copy_gbps : 0;
    fmt::print(" {:>34} {:>12} {:>6} {:>12.0f} {:>11.2f} {:>9.1f} {:>7.1f}{}\n", s.name, s.rows,
               s.dim, s.bytes, s.us, gbps, pct, s.note.empty() ? "" : "  " + s.note);
    js["stages"].push_back({{"name", s.name},
                            {"rows", s.rows},
                            {"dim", s.dim},
                            {"bytes", s.bytes},
                            {"time_us", s.us},
                            {"gbps", gbps},
                            {"pct_copy", pct},
                            {"note", s.note}});
  }
  for (const std::string& n : notes) fmt::print("# {}\n", n);
  js["notes"] = notes;
  if (g_json_out) {  // created up front by run_bench
    g_json_out->write(js.dump(2) + "\n");
    g_json_out->commit();
  }
}

// ---------------------------------------------------------------- CPU backend
int run_cpu(const BenchArgs& a, const Workload& w) {
  auto be = make_cpu_backend();
  const Plan& p = w.plan;
  std::vector<const Kjt*> kp;
  for (const Kjt& k : w.kjts) kp.push_back(&k);
  auto time_host = [&](const std::function<void()>& f) {
    f();  // warm-up
    std::vector<double> t;
    for (int i = 0; i < a.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      t.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(t);
  };
  std::vector<Stage> st;
  int64_t N = 0, L = 0;
  for (const Kjt& k : w.kjts) {
    N += k.num_ids();
    L += k.num_bags();
  }
  Stage b{"bucketize", N, 0, 8.0 * (3 * N + L + p.world_size * L), 0, ""};
  b.us = time_host([&] {
    for (const Kjt& k : w.kjts) (void)be->bucketize(p, k);
  });
  st.push_back(b);
  const DerivedBatch d = derive_input_dist(p, kp, *be);
  const OracleSource src(a.seed, p);
  const std::vector<EmbTensor> local = derive_local_embs(p, d, src, *be, 0);
  std::vector<const EmbTensor*> lp;
  std::vector<const ShardingContext*> cp;
  for (size_t r = 0; r < local.size(); ++r) {
    lp.push_back(&local[r]);
    cp.push_back(&d.ranks[r].ctx);
  }
  if (p.module == ModuleKind::sequence) {
    const int64_t D = p.seq_dim();
    Stage s{"sequence dist (cpu reference)", N, D, 8.0 * D * N + 8.0 * N, 0, ""};
    s.us = time_host([&] { be->sequence_output_dist(p, lp, cp, [](int, EmbTensor&&) {}); });
    st.push_back(s);
  } else {
    const double n = static_cast<double>(local[0].numel());
    Stage s{"pooled reduce (cpu reference)",
            local[0].rows(),
            p.sum_dim,
            4.0 * n * (p.world_size + 1),
            0,
            ""};
    s.us = time_host(
        [&] { be->pooled_output_dist(p, d.variable_batch, lp, cp, [](int, EmbTensor&&) {}); });
    st.push_back(s);
  }
  report(a, w, be->device(), 0, st, {});
  return 0;
}

#ifdef DYNEMB_HAVE_CUDA
// ---------------------------------------------------------------- CUDA backend
using cuda::DeviceBuffer;

struct Timer {
  cudaStream_t s;
  int iters;
  int64_t queue_ahead;
  cudaEvent_t e0, e1;
  Timer(cudaStream_t s_, int it, int64_t qa) : s(s_), iters(it), queue_ahead(qa) {
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
  }
  ~Timer() {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  double operator()(const std::function<void()>& f) {
    for (int i = 0; i < 3; ++i) f();  // warm-up: module load, first-touch
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) {
      // The spin keeps the GPU busy while the host enqueues e0, the stage and e1, so the
      // events bracket GPU execution, not launch latency (--queue-ahead 0 includes it).
      cuda::launch_spin(queue_ahead, s);
      CUDA_CHECK(cudaEventRecord(e0, s));
      f();
      CUDA_CHECK(cudaEventRecord(e1, s));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms * 1e3);
    }
    return median(t);
  }
};

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
  DeviceBuffer<uint64_t> d_g, d_seed;
  DeviceBuffer<int32_t> d_t;
  d_seed.upload(std::vector<uint64_t>{0x1234567ULL}, s);
  d_t.upload(std::vector<int32_t>(g.size(), 0), s);
  for (int64_t o = 0; o < rows; o += chunk) {
    const int64_t m = std::min(chunk, rows - o);
    for (int64_t i = 0; i < m; ++i) g[i] = static_cast<uint64_t>(o + i);
    d_g.upload(g.data(), m, s);
    cuda::launch_oracle_rows(d_g.data(), d_t.data(), d_seed.data(), m, D, dst + o * D, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
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

int run_cuda(const BenchArgs& a, const Workload& w) {
  if (!cuda_device_available())
    throw DeviceError("bench --backend cuda: no CUDA device or driver on this machine");
  auto be = make_cuda_backend(0);
  auto cpu = make_cpu_backend();
  const Plan& p = w.plan;
  const int64_t W = p.world_size, F = p.num_features();
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Timer timer(s, a.iters, a.queue_ahead);
  std::vector<Stage> st;
  std::vector<std::string> notes;
  const std::string ex = a.export_dir;
  if (!ex.empty()) std::filesystem::create_directories(ex);
  nlohmann::json meta;

  // Copy bandwidth ceiling: D2D memcpy of 1 GiB (2 GiB moved).
  double copy_gbps = 0;
  {
    const int64_t n = int64_t{1} << 28;
    DeviceBuffer<float> x(n), y(n);
    CUDA_CHECK(cudaMemsetAsync(x.data(), 0x3c, 4 * n, s));
    const double us = timer([&] {
      CUDA_CHECK(cudaMemcpyAsync(y.data(), x.data(), 4 * n, cudaMemcpyDeviceToDevice, s));
    });
    copy_gbps = 8.0 * n / (us * 1e3);
  }

  // ---- bucketize: all W ranks in one pass (bags concatenated rank-major).
  std::vector<const Kjt*> kp;
  for (const Kjt& k : w.kjts) kp.push_back(&k);
  const DerivedBatch derived = derive_input_dist(p, kp, *cpu);  // CPU reference contexts
  {
    cuda::BatchedBucketize bb(p, kp, /*with_dest_rank=*/false, s);
    const cuda::BucketizeArgs& ba = bb.args;
    const int64_t N = ba.total_ids, L = ba.total_bags;
    const bool weighted = ba.weights != nullptr;
    // auto: the one-pass kernel where the batch fits it, else three passes; the others force
    // a path (when the batch fits it) for A/B.
    const std::string& bk = a.bucketize_kernel;
    if (bk != "three-pass") bb.enable_one_pass(s);  // one kernel (kernels/bucketize.cu)
    cuda::BucketizeFused& fused = bb.fused;
    const bool one_kernel = cuda::bucketize_fused_eligible(ba, fused);
    const cuda::BucketizeFusedShape shape = cuda::bucketize_fused_shape(ba, fused);
    const double us = timer([&] { bb.launch(s); });
    // ids in; new_values + unbucketize_permute out; lengths in; new_lengths out (+ weights).
    const double bytes = 8.0 * (3 * N + L + W * L) + (weighted ? 8.0 * N : 0.0);
    st.push_back(
        {"bucketize (all ranks)", N, 0, bytes, us,
         one_kernel
             ? fmt::format("one pass: 1 kernel, a block per bag, {} blocks (of {}){}", shape.grid,
                           shape.capacity, shape.ids_cached ? ", ids read once" : "")
         : cuda::bucketize_block_per_bag(ba) ? "3 passes, block per bag"
         : W > 256                           ? "3 passes, thread per bag"
                                             : "3 passes, warp per bag"});
    // Floors of the stage, timed right after it (same clocks): an empty kernel of the one-pass
    // grid (what a launch of that shape costs), and that grid streaming the stage's main bytes
    // (ids in, values and perm out) with no routing, counting or exchange. No kernel of this
    // grid that writes these outputs can be faster than the second.
    {
      const int64_t blocks = one_kernel ? L : std::max<int64_t>(1, (N + 2047) / 2048);
      DeviceBuffer<int64_t> f_nv(N), f_perm(N);
      const double t_empty = timer([&] { cuda::launch_empty(blocks, 256, s); });
      const double t_stream = timer([&] {
        cuda::launch_stream_floor(bb.d_ids.data(), N, f_nv.data(), f_perm.data(), blocks, s);
      });
      notes.push_back(fmt::format(
          "bucketize floors, {} blocks x 256: empty kernel {:.2f} us; streaming its {:.1f} MB "
          "(ids in, values and perm out, no routing) {:.2f} us = {:.1f} % of copy",
          blocks, t_empty, 24e-6 * static_cast<double>(N), t_stream,
          copy_gbps > 0 ? 100.0 * 24.0 * static_cast<double>(N) / (t_stream * 1e3) / copy_gbps
                        : 0.0));
    }
    if (one_kernel) {
      // Where the one-pass kernel's time goes: one more launch recording %globaltimer at the
      // end of each step of every block (bucketize.cu), as us after the first block started.
      DeviceBuffer<unsigned long long> d_trace(cuda::kBucketizeTracePoints * L);
      fused.trace = d_trace.data();
      bb.launch(s);
      fused.trace = nullptr;
      const std::vector<unsigned long long> tr = d_trace.download(s);
      unsigned long long t0 = ~0ull;
      for (int64_t g = 0; g < L; ++g) t0 = std::min(t0, tr[g * cuda::kBucketizeTracePoints]);
      const auto us = [&](int64_t g, int pt) {  // block g's trace point pt
        return 1e-3 * static_cast<double>(tr[g * cuda::kBucketizeTracePoints + pt] - t0);
      };
      std::string line = fmt::format(
          "one-pass steps over {} bags, us after the first block "
          "started (median / max):",
          L);
      const char* names[] = {"start", "bag offsets", "counts published", "rank's counts seen",
                             "bases", "placed"};
      for (int pt = 0; pt < cuda::kBucketizeTracePoints; ++pt) {
        std::vector<double> v;
        for (int64_t g = 0; g < L; ++g) v.push_back(us(g, pt));
        std::sort(v.begin(), v.end());
        line += fmt::format(" {} {:.1f}/{:.1f}{}", names[pt], v[v.size() / 2], v.back(),
                            pt + 1 < cuda::kBucketizeTracePoints ? "," : "");
      }
      notes.push_back(line);
      // The same trace by quarter of the grid in launch order (blocks g with g * 4 / L = k):
      // blocks are dispatched in index order, so quarter k holds roughly the k-th block of
      // each SM, and the quarter whose slowest block is latest sets the kernel's end.
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
        by_quarter += any[k]
                          ? fmt::format(" q{} {:.1f}/{:.1f}/{:.1f}", k, pub[k], seen[k], placed[k])
                          : fmt::format(" q{} -", k);
      notes.push_back(by_quarter);
    }
    // Check against the CPU reference (derive_input_dist's bucketize).
    const std::vector<int64_t> perm = bb.d_perm.download(s), nv = bb.d_new_values.download(s),
                               nl = bb.d_new_lengths.download(s);
    bool ok = true;
    int64_t o = 0, ol = 0;
    for (int64_t r = 0; r < W && ok; ++r) {
      const BucketizedKjt& ref = derived.ranks[r].bucketized;
      for (size_t i = 0; i < ref.unbucketize_permute.size(); ++i, ++o)
        ok = ok && perm[o] == ref.unbucketize_permute[i] && nv[o] == ref.new_values[i];
      for (size_t i = 0; i < ref.new_lengths.size(); ++i, ++ol)
        ok = ok && nl[ol] == ref.new_lengths[i];
    }
    notes.push_back(std::string("check: batched bucketize == CPU reference: ") +
                    (ok ? "ok" : "MISMATCH"));
    if (!ok) throw DeviceError("bench: the GPU bucketize disagrees with the CPU reference");
    if (!ex.empty()) {
      std::vector<int64_t> bag_blk;  // each bag's block size (the peer's continuous rule)
      for (const Kjt& k : w.kjts)
        for (int64_t f = 0; f < F; ++f)
          bag_blk.insert(bag_blk.end(), static_cast<size_t>(k.batch_size(f)),
                         p.features[f].block_size);
      write_i64(ex, "bk_ids", bb.ids);
      write_i64(ex, "bk_lengths", bb.lengths);
      write_i64(ex, "bk_bag_blk", bag_blk);
      write_i64(ex, "bk_rank_bag_off", bb.rank_bag_off);
      write_i64(ex, "bk_perm", perm);
      meta["dist_type"] = p.features.empty() ? 0 : static_cast<int>(p.features[0].dist_type);
      bool uniform = true;
      for (const FeatureInfo& fi : p.features)
        uniform = uniform && fi.dist_type == p.features[0].dist_type;
      meta["dist_type_uniform"] = uniform;
    }
  }

  if (p.module == ModuleKind::sequence) {
    const int64_t D = p.seq_dim();
    std::vector<EmbTensor> shapes(W);
    std::vector<const EmbTensor*> lp;
    std::vector<const ShardingContext*> cp;
    for (int64_t r = 0; r < W; ++r) {
      int64_t rows = 0;
      for (int64_t x : *derived.ranks[r].ctx.output_splits) rows += x;
      shapes[r].shape = {rows, D};
      lp.push_back(&shapes[r]);
      cp.push_back(&derived.ranks[r].ctx);
    }
    const cuda::SeqDistTables t = cuda::build_seq_dist_tables(p, lp, cp);
    cuda::SeqDistDevice dev(t, s);
    const int64_t Rl = t.local_row_off.back(), Ro = t.out_row_off.back();
    DeviceBuffer<float> local(Rl * D), send(Rl * D), recv(Ro * D), out(Ro * D), out2(Ro * D);
    fill_rows(local.data(), Rl, D, s);
    std::vector<int64_t> gperm(static_cast<size_t>(Ro));
    for (int64_t r = 0; r < W; ++r)
      for (int64_t i = t.out_row_off[r]; i < t.out_row_off[r + 1]; ++i)
        gperm[i] = t.perm[i] + t.out_row_off[r];  // recv rows of rank r = out rows of rank r
    DeviceBuffer<int64_t> d_gperm;
    d_gperm.upload(gperm, s);
    const cuda::SeqDistArgs sa = dev.args(p, local.data());
    const double row = 4.0 * D;
    const double t_recat = timer([&] { cuda::launch_seq_recat(sa, send.data(), s); });
    const double t_exch =
        timer([&] { cuda::launch_seq_exchange(sa, send.data(), recv.data(), s); });
    const double t_unb =
        timer([&] { cuda::launch_gather_rows(recv.data(), d_gperm.data(), Ro, D, out.data(), s); });
    const double t_fused = timer([&] { cuda::launch_seq_fused(sa, out2.data(), s); });
    st.push_back({"recat permute", Rl, D, 2 * row * Rl, t_recat, ""});
    st.push_back({"exchange", Ro, D, 2 * row * Ro, t_exch, ""});
    st.push_back({"unbucketize", Ro, D, 2 * row * Ro + 8.0 * Ro, t_unb, ""});
    const double fused_bytes = 2 * row * Ro + 8.0 * Ro;
    st.push_back({"sequence dist (3 steps, ours)", Ro, D, fused_bytes, t_recat + t_exch + t_unb,
                  "sum of the 3 rows above"});
    st.push_back({"sequence dist (fused)", Ro, D, fused_bytes, t_fused, ""});
    const bool same = device_equal(out.data(), out2.data(), Ro * D);
    notes.push_back(std::string("check: fused == recat+exchange+unbucketize (bitwise): ") +
                    (same ? "ok" : "MISMATCH"));
    if (!same) throw DeviceError("bench: the fused sequence dist disagrees with the 3 steps");
    notes.push_back(fmt::format("fused sequence dist: {:.2f}x faster than our own 3 steps",
                                (t_recat + t_exch + t_unb) / t_fused));
    // Unbucketize gather over row widths, on this permutation (real bucketize of the batch).
    std::vector<int64_t> dims = parse_dims(a.dims);
    send = DeviceBuffer<float>();
    out2 = DeviceBuffer<float>();
    for (int64_t Dx : dims) {
      DeviceBuffer<float> src(Ro * Dx), dst(Ro * Dx);
      fill_rows(src.data(), Ro, Dx, s);
      const double us = timer(
          [&] { cuda::launch_gather_rows(src.data(), d_gperm.data(), Ro, Dx, dst.data(), s); });
      st.push_back({fmt::format("unbucketize D={} ({} B rows)", Dx, 4 * Dx), Ro, Dx,
                    2.0 * 4 * Dx * Ro + 8.0 * Ro, us, ""});
    }
    if (!ex.empty()) {
      write_i64(ex, "seq_perm_global", gperm);
      // Recat as a row map (send row -> local row), the exchange as W*W slices (dest-major).
      std::vector<int64_t> recat_rows(static_cast<size_t>(Rl));
      for (int64_t r = 0; r < W; ++r) {
        const int64_t b0 = t.seg_base[r], b1 = t.seg_base[r + 1];
        const int64_t n = t.local_row_off[r + 1] - t.local_row_off[r];
        for (int64_t k = b0; k < b1; ++k) {
          const int64_t end = k + 1 < b1 ? t.seg_out[k + 1] : n;
          for (int64_t q = t.seg_out[k]; q < end; ++q)
            recat_rows[t.local_row_off[r] + q] =
                t.local_row_off[r] + t.seg_src[k] + q - t.seg_out[k];
        }
      }
      write_i64(ex, "seq_recat_rows", recat_rows);
      std::vector<int64_t> slices;  // (start, count) of send rows for (dest s, source r)
      for (int64_t d = 0; d < W; ++d)
        for (int64_t r = 0; r < W; ++r) {
          const int64_t* so = &t.send_off[r * (W + 1)];
          slices.push_back(t.local_row_off[r] + so[d]);
          slices.push_back(so[d + 1] - so[d]);
        }
      write_i64(ex, "seq_slices", slices);
      meta["seq_rows_local"] = Rl;
      meta["seq_rows_out"] = Ro;
      meta["seq_dim"] = D;
      meta["dims"] = dims;
    }
  } else {
    // Pooled reduce of W partial buffers (equal / unequal / VBE are one elementwise sum).
    int64_t numel = 0, rows = 0;
    {
      // Partial-buffer size from the contexts: [sum_s B_s, sum_D] or the 1-D VBE layout.
      const ShardingContext& c = derived.ranks[0].ctx;
      if (derived.variable_batch) {
        for (int64_t r = 0; r < W; ++r)
          for (int64_t f = 0; f < F; ++f)
            numel += (*c.batch_size_per_rank_per_feature)[r][f] * p.features[f].dim;
      } else {
        for (int64_t x : *c.batch_size_per_rank) rows += x;
        numel = rows * p.sum_dim;
      }
    }
    DeviceBuffer<float> parts(W * numel), out(numel);
    fill_rows(parts.data(), W * (numel / std::max<int64_t>(1, p.sum_dim)), p.sum_dim, s);
    const int rd = static_cast<int>(pooled_reduce_dtype(p));
    const double us =
        timer([&] { cuda::launch_reduce(parts.data(), W, numel, numel, rd, out.data(), s); });
    st.push_back({"pooled reduce", rows, p.sum_dim, 4.0 * numel * (W + 1), us,
                  derived.variable_batch ? "VBE" : ""});
    if (!ex.empty()) meta["pool_numel"] = numel;
  }
  if (!ex.empty()) {
    meta["world_size"] = W;
    meta["module"] = to_string(p.module);
    meta["workload"] = w.name;
    std::ofstream f(ex + "/meta.json");
    f << meta.dump(2) << "\n";
  }
  report(a, w, be->device(), copy_gbps, st, notes);
  CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
#endif

int run_bench(const BenchArgs& a) {
  if (a.capture.empty() == a.preset.empty())
    throw UsageError("bench: give either a CAPTURE.h5 or --preset NAME");
  if (a.iters < 1) throw UsageError("bench: --iters must be >= 1");
  if (a.scale < 1) throw UsageError("bench: --scale must be >= 1");
  if (!a.json.empty()) {  // never the capture, whatever the spelling; writable up front
    std::vector<NamedPath> inputs;
    if (!a.capture.empty()) inputs.push_back({"capture", a.capture});
    check_output_clashes(inputs, {{"--json", a.json}});
    g_json_out = std::make_unique<OutputFile>(a.json);
  }
  const Workload w = load_workload(a);
  if (a.backend == "cpu") return run_cpu(a, w);
  if (a.backend == "cuda") {
#ifdef DYNEMB_HAVE_CUDA
    return run_cuda(a, w);
#else
    throw UsageError(
        fmt::format("bench --backend cuda: this build has no CUDA backend (compiled "
                    "backends: {})",
                    compiled_backends()));
#endif
  }
  throw UsageError("bench: --backend must be cuda or cpu, got '" + a.backend + "'");
}

}  // namespace

void setup_bench(CLI::App& app, RunFn& run) {
  auto args = std::make_shared<BenchArgs>();
  auto* sub = app.add_subcommand(
      "bench", "Time each stage of the replay (device events) against the device copy bandwidth");
  sub->add_option("capture", args->capture, "Capture file (batch 0 is benched)");
  sub->add_option("--preset", args->preset, "Generate a preset's batch in memory instead");
  sub->add_option("--backend", args->backend, "cuda (default) or cpu");
  sub->add_option("--iters", args->iters, "Timed repeats per stage after warm-up (median)");
  sub->add_option("--queue-ahead", args->queue_ahead,
                  "CUDA: SM cycles a one-thread kernel spins before each timed repeat so the "
                  "stage is queued before the GPU reaches it (times exclude launch latency); "
                  "0 times launch latency too")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--bucketize-kernel", args->bucketize_kernel,
                  "CUDA: the bucketize path to time: auto (the fastest that fits the batch), "
                  "one-pass (a block per bag, cooperative launch), three-pass (counts, a scan, "
                  "placement); a forced path the batch does not fit falls back as auto would")
      ->check(CLI::IsMember({"auto", "one-pass", "three-pass"}))
      ->capture_default_str();
  sub->add_option("--json", args->json, "Write the results as JSON (format_version 1)");
  sub->add_option("--scale", args->scale, "Multiply the preset's local batch size");
  sub->add_option("--seed", args->seed, "Workload seed for --preset");
  sub->add_option("--dims", args->dims,
                  "Sequence: also time the unbucketize gather at these fp32 row widths, e.g. "
                  "4,8,16,32,64,128 (same permutation)");
  sub->add_option("--export", args->export_dir,
                  "Write the index data as .npy files for bench/peer_torch.py");
  sub->callback([&run, args] { run = [args] { return run_bench(*args); }; });
}

}  // namespace dynemb::cli
