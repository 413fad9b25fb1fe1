// `dynemb-dist inspect CAPTURE.h5 [--plan PLAN.yaml]`: what a capture holds (cli.md): plan,
// batches, ranks, ids per rank and their imbalance, bytes of each part, optional parts.
// Reads one batch at a time and only the KJTs' data; everything else from dataset extents.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "capture/capture.hpp"
#include "commands.hpp"
#include "common/console.hpp"
#include "common/error.hpp"
#include "common/safe_text.hpp"

namespace dynemb::cli {

namespace {

struct InspectArgs {
  std::string capture, plan_path;
};

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, units[u]);
}

// "lengths", "ctx", "local_embs", ... from "/batches/0/rank1/ctx/input_splits".
std::string part_of(const std::string& path) {
  const size_t rank = path.find("/rank");
  const size_t slash = path.find('/', rank + 1);
  std::string rest = path.substr(slash + 1);
  return rest;
}

struct Imbalance {
  int64_t max = 0, sum = 0, n = 0;
  void add(int64_t v) { max = std::max(max, v), sum += v, ++n; }
  double mean() const { return n ? static_cast<double>(sum) / n : 0.0; }
  std::string str() const {
    const double m = mean();
    return fmt::format("max {}, mean {:.1f}, max/mean {}", max, m,
                       m > 0 ? fmt::format("{:.3f}", max / m) : std::string("-"));
  }
};

// The capture's header lines: file, format, plan, tables, oracle, weights. Names, paths and
// attributes come from the capture and the plan: each escaped (one line).
void print_header(const InspectArgs& a, const CaptureReader& reader, const Plan& plan,
                  bool override, const std::vector<DatasetStat>& tstats) {
  const int64_t W = reader.world_size();
  console::outf("# capture      {}\n", escape_field(a.capture));
  console::outf("# format       {} v{}\n", kCaptureFormat, kCaptureFormatVersion);
  console::outf("# plan         {}{}: {}, W={}, F={}, {}={}, data_type {}, comm_precision {}{}\n",
                override ? escape_field(a.plan_path) : "/plan", override ? " (override)" : "",
                to_string(plan.module), W, plan.num_features(),
                plan.module == ModuleKind::sequence ? "D" : "sum_D", plan.sum_dim,
                to_string(plan.data_type()), to_string(plan.comm_precision),
                plan.any_mean ? ", has MEAN" : "");
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    const TableConfig& tc = plan.tables[t];
    // An inference plan's uneven shards route by their offsets: no one block size.
    console::outf(
        "#   table {}: {} rows ({}), D={}, {}, {}{}, features {}\n", escape_field(tc.name),
        tc.num_embeddings,
        routes_by_shards(plan, tc) ? std::string("uneven shards")
                                   : "blk " + std::to_string(rw_block_size(tc.num_embeddings, W)),
        tc.embedding_dim, to_string(tc.data_type), to_string(tc.dist_type),
        plan.module == ModuleKind::pooled ? fmt::format(", {}", to_string(tc.pooling)) : "",
        escape_field(fmt::format("{}", fmt::join(tc.features, ","))));
  }
  if (reader.oracle_seed())
    console::outf("# oracle       hash64, seed {}\n", *reader.oracle_seed());
  else
    console::outf("# oracle       (none)\n");
  for (const DatasetStat& s : tstats)
    console::outf("# weights      {} [{}] {} ({} stored)\n", escape_field(s.path),
                  fmt::join(s.dims, ", "), escape_field(s.dtype), human_bytes(s.stored_bytes));
  if (tstats.empty()) console::outf("# weights      (none)\n");
}

int run_inspect(const InspectArgs& a) {
  CaptureReader reader(a.capture);
  std::optional<Plan> override_plan;
  if (!a.plan_path.empty()) {
    PlanLoadResult r = load_plan_file(a.plan_path);
    for (const Diagnostic& d : r.findings)
      if (d.severity == Severity::error)
        throw PlanError(d.loc, d.path.empty() ? d.message : d.path + ": " + d.message);
    override_plan = std::move(*r.plan);
  }
  const Plan plan = capture_plan(reader, override_plan ? &*override_plan : nullptr);
  const int64_t W = reader.world_size(), nb = reader.num_batches();

  const auto tstats = reader.table_stats();
  print_header(a, reader, plan, override_plan.has_value(), tstats);
  if (nb == 0) {  // said plainly: a replay of it checks nothing, and refuses it
    console::outf("# batches      0: the capture holds no batches; replay refuses it (exit 2)\n");
    return 0;
  }
  console::outf("# batches      {}\n", nb);

  // Bytes per part, summed over batches and ranks; presence counted per (batch, rank).
  std::map<std::string, std::pair<int64_t, int64_t>> bytes;  // part -> (logical, stored)
  std::map<std::string, int64_t> present;                    // "ctx"/... -> rank-batches
  ReadParts kjt_only;
  kjt_only.ctx = kjt_only.local_embs = kjt_only.output = false;
  Imbalance in_all, routed_all;
  console::outf("\n#{:>6} {:>5} {:>8} {:>10} {:>10} {:>6} {:>9} {:>6}  {}\n", "batch", "rank", "B",
                "ids", "looked_up", "vbe", "weighted", "index", "optional parts");
  for (int64_t k = 0; k < nb; ++k) {
    const Batch batch = reader.read_batch(plan, k, kjt_only);
    std::vector<int64_t> routed(static_cast<size_t>(W), 0);
    for (const RankBatch& rb : batch.ranks) {
      auto c = routed_id_counts(plan, rb.kjt);
      for (int64_t d = 0; d < W; ++d) routed[d] += c[d];
    }
    std::map<int64_t, std::vector<std::string>> parts_of_rank;
    for (const DatasetStat& s : reader.dataset_stats(k)) {
      const std::string part = part_of(s.path);
      bytes[part].first += s.logical_bytes;
      bytes[part].second += s.stored_bytes;
      const size_t rp = s.path.find("/rank") + 5;
      const int64_t r = std::stoll(s.path.substr(rp, s.path.find('/', rp) - rp));
      std::string top = part.substr(0, part.find('/'));
      if (top == "ctx" || top == "local_embs" || top == "output") {
        auto& v = parts_of_rank[r];
        if (std::find(v.begin(), v.end(), top) == v.end()) v.push_back(top);
      }
    }
    Imbalance in_b, routed_b;
    for (int64_t r = 0; r < W; ++r) {
      const Kjt& kjt = batch.ranks[r].kjt;
      const int64_t F = plan.num_features();
      std::string b;
      if (kjt.is_vbe()) {
        b = fmt::format(
            "{}..{}",
            *std::min_element(kjt.stride_per_feature.begin(), kjt.stride_per_feature.end()),
            *std::max_element(kjt.stride_per_feature.begin(), kjt.stride_per_feature.end()));
      } else {
        b = std::to_string(F ? kjt.num_bags() / F : 0);
      }
      const auto& pr = parts_of_rank[r];
      for (const std::string& p : pr) ++present[p];
      console::outf(" {:>6} {:>5} {:>8} {:>10} {:>10} {:>6} {:>9} {:>6}  {}\n", k, r, b,
                    kjt.num_ids(), routed[r], kjt.is_vbe() ? "yes" : "no",
                    kjt.weighted ? "yes" : "no", to_string(kjt.values_type),
                    pr.empty() ? "-" : fmt::format("{}", fmt::join(pr, ",")));
      in_b.add(kjt.num_ids());
      routed_b.add(routed[r]);
      in_all.add(kjt.num_ids());
      routed_all.add(routed[r]);
    }
    console::outf("# batch {}: ids per rank {}; looked up per rank {}\n", k, in_b.str(),
                  routed_b.str());
  }

  console::outf("\n# ids per rank (input KJT, all batches):      {}\n", in_all.str());
  console::outf("# ids per rank (looked up after routing):     {}\n", routed_all.str());
  const int64_t rb = W * nb;
  for (const char* p : {"ctx", "local_embs", "output"})
    console::outf("# optional part {:<11} {}\n", p,
                  present[p] == 0 ? std::string("absent")
                                  : fmt::format("present in {}/{} rank-batches", present[p], rb));

  console::outf("\n#{:>40} {:>14} {:>14}\n", "part", "bytes", "stored");
  int64_t tl = 0, ts = 0;
  for (const auto& [part, b] : bytes) {
    console::outf(" {:>40} {:>14} {:>14}\n", escape_field(part), b.first, b.second);
    tl += b.first;
    ts += b.second;
  }
  for (const DatasetStat& s : tstats) {
    console::outf(" {:>40} {:>14} {:>14}\n", escape_field(s.path), s.logical_bytes, s.stored_bytes);
    tl += s.logical_bytes;
    ts += s.stored_bytes;
  }
  console::outf("# total: {} ({} bytes) of data, {} stored\n", human_bytes(tl), tl,
                human_bytes(ts));
  return 0;
}

}  // namespace

void setup_inspect(CLI::App& app, RunFn& run) {
  auto args = std::make_shared<InspectArgs>();
  auto* sub = app.add_subcommand(
      "inspect",
      "Summarize a capture: plan, batches, ranks, ids per rank and imbalance (max/mean), bytes "
      "of each part, which optional parts (ctx, local_embs, output) are present. Checks every "
      "KJT against the plan on the way (exit 2 with the HDF5 path on a malformed capture).");
  sub->add_option("capture", args->capture, "Capture file (capture-format.md)")->required();
  sub->add_option("--plan", args->plan_path,
                  "Read the capture with this plan instead of its /plan");
  sub->callback([&run, args] { run = [args] { return run_inspect(*args); }; });
}

}  // namespace dynemb::cli
