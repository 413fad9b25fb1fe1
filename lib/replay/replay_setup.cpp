// What a replay opens before its first batch (replay_setup.hpp), and the rebasing of each batch
// onto a --plan that shards differently from the capture's.
#include "replay/replay_setup.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/memory.hpp"
#include "common/sha256.hpp"
#include "replay/replan.hpp"

namespace dynemb {

std::vector<int64_t> parse_batch_range(const std::string& text, int64_t num_batches) {
  std::vector<int64_t> out;
  if (text.empty()) {
    for (int64_t k = 0; k < num_batches; ++k) out.push_back(k);
    return out;
  }
  auto number = [&](const std::string& s) -> int64_t {
    if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(
          fmt::format("--batches '{}': '{}' is not a batch number (expected a list "
                      "like 0-3,7)",
                      text, s));
    const int64_t v = std::stoll(s);
    if (v >= num_batches)
      throw UsageError(
          fmt::format("--batches '{}': batch {} does not exist (the capture has {} "
                      "batches, 0..{})",
                      text, v, num_batches, num_batches - 1));
    return v;
  };
  std::set<int64_t> set;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    const size_t dash = part.find('-');
    if (dash == std::string::npos) {
      set.insert(number(part));
      continue;
    }
    const int64_t a = number(part.substr(0, dash)), b = number(part.substr(dash + 1));
    if (b < a)
      throw UsageError(fmt::format("--batches '{}': range '{}' runs backwards", text, part));
    for (int64_t k = a; k <= b; ++k) set.insert(k);
  }
  if (set.empty()) throw UsageError(fmt::format("--batches '{}': no batch selected", text));
  return {set.begin(), set.end()};
}

}  // namespace dynemb

namespace dynemb::replay_detail {

namespace {

std::string read_text_file(const std::string& path) {
  return read_input_text(path, "plan file");  // errno's reason; a FIFO times out
}

void setup_replan(RunContext& rc, const CaptureReader& reader, PlanChoice& pc);

}  // namespace

// The plan (the capture's, or --plan's with what differs), the tolerance and the batches.
PlanChoice open_plan(RunContext& rc, const CaptureReader& reader, ReportInfo& info) {
  const ReplayOptions& opt_ = rc.opt;
  Plan& plan_ = rc.plan;
  PlanChoice pc;
  if (!opt_.plan_path.empty()) {
    std::string text;
    Plan override_plan;
    try {  // what goes wrong here is the plan's, not the capture's
      text = read_text_file(opt_.plan_path);
      override_plan = load_plan_or_throw(text, opt_.plan_path);
    } catch (const std::bad_alloc&) {
      throw Error(fmt::format("{}: {} while reading this plan (--plan)", opt_.plan_path,
                              out_of_memory_text()));
    }
    plan_ = capture_plan(reader, &override_plan);
    info.plan = {opt_.plan_path, sha256_hex(text), false};
    setup_replan(rc, reader, pc);
  } else {
    plan_ = capture_plan(reader);
    info.plan = {opt_.capture_path + ":/plan", sha256_hex(reader.plan_text()), true};
  }
  // The host engine routes an inference plan's uneven shards by their offsets; the GPU
  // bucketize takes one block size per feature and would replay the even split.
  if (const std::string gap = engine_routing_gap(plan_); !gap.empty() && rc.backend.name() != "cpu")
    throw PlanError(SourceLoc{plan_.path, 0, 0},
                    fmt::format("the {} backend cannot replay this plan: {}; --backend cpu does",
                                rc.backend.name(), gap));
  info.module = to_string(plan_.module);
  info.world_size = plan_.world_size;
  info.num_batches = reader.num_batches();
  rc.tol = opt_.tolerance ? *opt_.tolerance : default_tolerance(plan_);
  info.tolerance = rc.tol.str();
  info.batches = parse_batch_range(opt_.batches, reader.num_batches());
  return pc;
}

// The embedding source (oracle or weights) and the output dist, built once and latched across
// batches like the real module.
void open_source_and_dists(RunContext& rc, const CaptureReader& reader) {
  rc.source = open_embedding_source(reader, rc.plan);
  if (!rc.source)
    rc.log.warn(
        "the capture has no /oracle and no /tables weights: the lookup check and the unsharded "
        "reference are skipped; the output dist runs on the captured local_embs (add /oracle or "
        "/tables/<name>/weight for them)");
  if (rc.plan.module == ModuleKind::sequence)
    rc.seq_dist.emplace(rc.plan);
  else
    rc.pooled_dist.emplace(rc.plan);
}

// --write-output: the copy of the capture (its table weights first) whose outputs are replaced.
std::unique_ptr<CaptureWriter> open_writer(const RunContext& rc, const CaptureReader& reader) {
  const ReplayOptions& opt_ = rc.opt;
  const Plan& plan_ = rc.plan;
  if (!opt_.write_output_file && opt_.write_output.empty()) return nullptr;
  std::shared_ptr<OutputFile> out = opt_.write_output_file
                                        ? opt_.write_output_file
                                        : std::make_shared<OutputFile>(opt_.write_output);
  auto writer_ = std::make_unique<CaptureWriter>(out, plan_, reader.oracle_seed());
  for (const std::string& name : reader.weight_tables()) {
    const auto t = std::find_if(plan_.tables.begin(), plan_.tables.end(),
                                [&](const TableConfig& tc) { return tc.name == name; });
    if (t == plan_.tables.end()) continue;  // a table the plan does not use: not copied
    writer_->write_table_weight(name, t->data_type, t->num_embeddings, t->embedding_dim,
                                reader.read_table_weight(*t));
  }
  return writer_;
}

namespace {

void setup_replan(RunContext& rc, const CaptureReader& reader, PlanChoice& pc) {
  const Plan& plan_ = rc.plan;
  const PlanLoadResult embedded = parse_plan(reader.plan_text(), reader.path() + ":/plan");
  if (!embedded.ok() || !embedded.plan) return;  // nothing to compare with: --plan is used as is
  const std::vector<std::string> diffs = plan_differences(*embedded.plan, plan_);
  if (diffs.empty()) return;
  pc.cap_plan = *embedded.plan;
  pc.replan = true;
  for (const std::string& d : diffs) rc.log.warn("--plan differs from the capture's plan: " + d);
  rc.log.warn(
      "--plan: the captured ctx/ was made under the capture's plan; it is not compared, the "
      "context is derived under --plan");
  if (plan_.module == ModuleKind::sequence)
    rc.log.warn(
        "--plan: sequence local_embs (one row per id) are re-sharded to --plan and checked there");
  else
    rc.log.warn(
        rc.source || open_embedding_source(reader, plan_)
            ? "--plan: pooled local_embs are partial sums over the capture's shards and cannot "
              "be re-sharded; the output dist runs on lookups from /oracle or /tables"
            : "--plan: pooled local_embs are partial sums over the capture's shards and cannot "
              "be re-sharded, and the capture has no /oracle or /tables: the output checks are "
              "skipped");
}

}  // namespace

bool rebase_batch(RunContext& rc, const PlanChoice& pc, int64_t k, Batch& batch, bool selected) {
  const Plan& plan_ = rc.plan;
  const int64_t W = plan_.world_size;
  bool all_local = true;
  for (RankBatch& rb : batch.ranks) {
    rb.ctx.reset();
    all_local &= rb.local_embs.has_value();
  }
  if (plan_.module == ModuleKind::sequence) {
    if (!all_local) {
      for (RankBatch& rb : batch.ranks) rb.local_embs.reset();
      return true;
    }
    std::vector<const Kjt*> kjts(static_cast<size_t>(W));
    std::vector<const EmbTensor*> local(static_cast<size_t>(W));
    for (int64_t r = 0; r < W; ++r) {
      kjts[size_t(r)] = &batch.ranks[size_t(r)].kjt;
      local[size_t(r)] = &*batch.ranks[size_t(r)].local_embs;
    }
    int64_t unknown = 0;
    std::vector<EmbTensor> moved;
    try {
      moved = reshard_sequence_local_embs(pc.cap_plan, plan_, kjts, local, rc.backend.get(), k,
                                          unknown);
    } catch (const Error& e) {
      for (RankBatch& rb : batch.ranks) rb.local_embs.reset();
      if (selected)
        rc.log.trouble(k, -1, "replay",
                       fmt::format("{}:/batches/{}: re-sharding local_embs to --plan: {}",
                                   rc.opt.capture_path, k, e.what()));
      return true;
    }
    for (int64_t r = 0; r < W; ++r) batch.ranks[size_t(r)].local_embs = std::move(moved[size_t(r)]);
    if (unknown > 0 && selected)
      rc.log.warn(
          fmt::format("--plan: batch {}: {} lookups under --plan read rows the capture does not "
                      "hold (ids outside a table of the capture's plan): zeros in the re-sharded "
                      "local_embs",
                      k, unknown));
    return true;
  }
  for (RankBatch& rb : batch.ranks) rb.local_embs.reset();
  if (rc.source) return true;
  if (selected)
    for (int64_t r = 0; r < W; ++r)
      if (batch.ranks[size_t(r)].output)
        rc.log.record(
            skipped(k, int(r), "output", "golden",
                    "--plan: pooled local_embs cannot be re-sharded to another plan, and the "
                    "capture has no /oracle or /tables to look the rows up"));
  return false;
}

}  // namespace dynemb::replay_detail
