// The bench library: times each stage of the replay on a backend and reports time, the fewest
// bytes the stage must move, GB/s and % of the device's copy bandwidth. cli/bench.cpp is its
// options and its table; docs/cli.md and bench/README.md say how to read it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "capture/read_floor.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb::bench {

struct Options {
  std::string capture, preset;          // one of the two
  std::string backend = "auto";         // auto | cpu | cuda (auto: cuda when a GPU is present)
  std::string json, export_dir;         // --json FILE, --export DIR (.npy for bench/peer_torch.py)
  std::string dims;                     // sequence: extra unbucketize widths, "4,8,16"
  std::string bucketize_path = "auto";  // auto | one-pass | three-pass | partition
  int iters = 20;
  int64_t queue_ahead = 200000;  // SM cycles spun before each timed repeat (0: off)
  int64_t scale = 1;             // multiplies the preset's local batch
  int64_t tile_ids = 0;          // CUDA partition path: ids of a tile (0: the dispatch's choice)
  uint64_t seed = 1;
  bool diagnostics = false;  // floors, the one-pass trace, the bucketize path taken
  bool sweep = false;        // CUDA: only the bucketize, at B = 512 ... 65536 per rank
  bool read_floor = false;   // only the capture's read floor (capture/read_floor.hpp)
  // The options named on the command line ("--iters", ...), for refusing with --read-floor
  // those it does not take (a default value cannot tell).
  std::vector<std::string> given;
};

// The batch benched: a preset's (generated in memory) or batch 0 of a capture.
struct Workload {
  std::string name;
  Plan plan;
  std::vector<Kjt> kjts;
  int64_t num_ids() const;
};
Workload load_workload(const Options& o);

// One row of the table.
struct Stage {
  std::string name;
  int64_t rows = 0, dim = 0;
  double bytes = 0;  // the fewest bytes the stage must move (each input read once, each output
                     // written once, index bytes included), from the shapes
  double us = 0;     // median over the timed repeats
  std::string note;
  double gbps() const { return us > 0 ? bytes / (us * 1e3) : 0; }
};

struct Result {
  std::string backend, device;
  double copy_gbps = 0;  // D2D copy bandwidth measured in the same run; 0: not measured
  bool launch_latency_excluded = false;
  std::vector<Stage> stages;
  std::vector<std::string> checks;       // "check: ... ok" lines (results against the reference)
  std::vector<std::string> diagnostics;  // with Options::diagnostics
};

// Runs every stage of the workload on o.backend. Throws UsageError for a bad option or a
// backend this build lacks, DeviceError when the GPU disagrees with the CPU reference.
// With --read-floor: throws UsageError for any option given but CAPTURE and --json.
// Throws UsageError for options that cannot run here (--sweep or --export without CUDA, ...);
// returns the backend that will run ("cpu" or "cuda", auto resolved). Call before any work.
std::string check_options(const Options& o);
Result run(const Options& o, const Workload& w);

// The report as JSON: the schema_version/tool header of the other reports, then the run.
nlohmann::json json_report(const Options& o, const Workload& w, const Result& r);

// --read-floor's report as JSON: the same header, then the numbers of read_floor().
nlohmann::json read_floor_json(const Options& o, const ReadFloor& f, const std::string& inflate);

}  // namespace dynemb::bench
