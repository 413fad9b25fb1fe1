// Workload loading and the choice of stages to run by backend.
#include <fmt/core.h>

#include "capture/capture.hpp"
#include "common/error.hpp"
#include "engine/input_dist.hpp"
#include "engine/ops.hpp"
#include "registry.hpp"
#include "run.hpp"
#include "stages.hpp"
#include "synth/synth.hpp"

namespace dynemb::bench {

int64_t Workload::num_ids() const {
  int64_t n = 0;
  for (const Kjt& k : kjts) n += k.num_ids();
  return n;
}

Workload load_workload(const Options& o) {
  Workload w;
  if (!o.preset.empty()) {
    w.name = o.preset;
    w.plan = preset_plan(o.preset);
    SynthOptions opt = preset_workload(o.preset);
    for (int64_t& b : opt.batch_sizes) b *= o.scale;
    opt.seed = o.seed;
    check_synth_options(w.plan, opt);
    w.kjts = synth_kjts(w.plan, opt, 0);
    if (o.scale != 1) w.name += fmt::format(" x{}", o.scale);
  } else {
    CaptureReader cap(o.capture);
    w.name = o.capture;
    w.plan = capture_plan(cap);
    if (cap.num_batches() < 1) throw CaptureError(o.capture, "/batches", "no batch to bench");
    ReadParts parts;
    parts.ctx = parts.local_embs = parts.output = false;
    Batch b = cap.read_batch(w.plan, 0, parts);
    for (RankBatch& rb : b.ranks) w.kjts.push_back(std::move(rb.kjt));
  }
  for (size_t r = 0; r < w.kjts.size(); ++r)
    check_kjt(w.plan, w.kjts[r], fmt::format("{}: rank {}", w.name, r));
  return w;
}

std::string check_options(const Options& o) {
  if (o.read_floor) {
    // It reads the file and times nothing else: no stage, backend or workload option applies.
    for (const std::string& name : o.given)
      if (name != "--json" && name != "--read-floor" && name != "capture")
        throw UsageError(fmt::format(
            "bench --read-floor: {} does not apply (the read floor reads every dataset of the "
            "capture on the CPU; it takes CAPTURE.h5 and --json only)",
            name));
    if (o.capture.empty())
      throw UsageError("bench --read-floor: give a CAPTURE.h5 (the file whose datasets it reads)");
    return "cpu";
  }
  if (o.iters < 1) throw UsageError("bench: --iters must be >= 1");
  if (o.scale < 1) throw UsageError("bench: --scale must be >= 1");
  std::string backend = o.backend;
  if (backend == "auto") backend = cuda_backend_usable() ? "cuda" : "cpu";
  if (o.sweep && backend != "cuda") throw UsageError("bench: --sweep needs the CUDA backend");
  // The exported arrays are the CUDA stages' own index data (the batched bucketize's output,
  // the sequence dist's row maps), for bench/peer_torch.py to time torch on the same GPU data:
  // the CPU stages make none of them, and an empty directory with exit 0 would pass for them.
  if (!o.export_dir.empty() && backend != "cuda")
    throw UsageError(
        fmt::format("bench --export {}: it writes the CUDA stages' index data for "
                    "bench/peer_torch.py, and the backend here is {}; run it with --backend cuda "
                    "on a machine with a GPU",
                    o.export_dir, backend));
  return backend;
}

Result run(const Options& o, const Workload& w) {
  const std::string backend = check_options(o);
  if (backend == "cpu") return run_cpu_stages(o, w);
  if (backend == "cuda") {
    // The GPU bucketize takes one block size per feature: an inference plan's uneven shards
    // it cannot route (the host's stages can).
    if (const std::string gap = engine_routing_gap(w.plan); !gap.empty())
      throw PlanError(
          SourceLoc{w.plan.path, 0, 0},
          fmt::format("the cuda backend cannot bench this plan: {}; --backend cpu can", gap));
    return run_cuda_stages(o, w);
  }
  throw UsageError("bench: --backend must be auto, cuda or cpu, got '" + o.backend + "'");
}

namespace {

// What every bench JSON report begins with: its schema, the tool and which report it is.
nlohmann::json report_head(const char* report) {
  nlohmann::json js;
  js["schema_version"] = "1.0.0";
  js["tool"] = {{"name", "dynemb-dist"}, {"version", DYNEMB_VERSION}};
  js["report"] = report;
  return js;
}

}  // namespace

nlohmann::json json_report(const Options& o, const Workload& w, const Result& r) {
  nlohmann::json js = report_head("bench");
  js["workload"] = w.name;
  js["preset"] = o.preset;
  js["scale"] = o.scale;
  js["tile_ids"] = o.tile_ids;
  js["queue_ahead_cycles"] = r.launch_latency_excluded ? o.queue_ahead : 0;
  js["module"] = to_string(w.plan.module);
  js["world_size"] = w.plan.world_size;
  js["num_ids"] = w.num_ids();
  js["backend"] = r.backend;
  js["device"] = r.device;
  js["iters"] = o.iters;
  js["copy_gbps"] = r.copy_gbps > 0 ? nlohmann::json(r.copy_gbps) : nlohmann::json(nullptr);
  js["stages"] = nlohmann::json::array();
  for (const Stage& s : r.stages) {
    nlohmann::json st = {{"name", s.name},  {"rows", s.rows},   {"dim", s.dim},  {"bytes", s.bytes},
                         {"time_us", s.us}, {"gbps", s.gbps()}, {"note", s.note}};
    st["pct_copy"] =
        r.copy_gbps > 0 ? nlohmann::json(100.0 * s.gbps() / r.copy_gbps) : nlohmann::json(nullptr);
    js["stages"].push_back(st);
  }
  js["checks"] = r.checks;
  js["diagnostics"] = r.diagnostics;
  return js;
}

nlohmann::json read_floor_json(const Options& o, const ReadFloor& f, const std::string& inflate) {
  nlohmann::json js = report_head("bench-read-floor");
  js["capture"] = o.capture;
  js["datasets"] = f.datasets;
  js["logical_bytes"] = f.logical_bytes;
  js["stored_bytes"] = f.stored_bytes;
  js["largest_dataset_bytes"] = f.largest_bytes;
  js["seconds"] = f.seconds;
  js["logical_gbps"] = f.seconds > 0 ? nlohmann::json(double(f.logical_bytes) / 1e9 / f.seconds)
                                     : nlohmann::json(nullptr);
  js["inflate"] = inflate;
  js["threads"] = f.threads;
  return js;
}

}  // namespace dynemb::bench
