// `dynemb-dist synth (PLAN.yaml | --preset NAME) -o OUT.h5 ...`: writes a capture with the
// hash64 oracle (cli.md, capture-format.md). The generator lives in lib/synth/synth.cpp.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "commands.hpp"
#include "common/console.hpp"
#include "common/error.hpp"
#include "common/memory.hpp"
#include "common/output_file.hpp"
#include "common/safe_text.hpp"
#include "engine/memory_estimate.hpp"
#include "progress.hpp"
#include "synth/synth.hpp"

namespace dynemb::cli {

namespace {

struct SynthArgs {
  std::string plan_path, preset, out;
  std::optional<int64_t> batches, batch_size, empty_rank;
  std::optional<uint64_t> seed;
  std::string batch_sizes, hotness, ids, store, index_type, plant;
  bool vbe = false, weighted = false, force = false;
  double oob = 0.0;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

// Mean ids per bag of a hotness spec.
double mean_length(const Hotness& h) {
  switch (h.kind) {
    case Hotness::Kind::fixed:
      return double(h.lo);
    case Hotness::Kind::uniform:
      return (double(h.lo) + double(h.hi)) / 2;
    case Hotness::Kind::zipf: {
      double num = 0, den = 0;
      const int64_t n = std::min<int64_t>(h.hi, 1000000);
      for (int64_t k = 1; k <= n; ++k) {
        const double p = std::pow(double(k), -h.alpha);
        num += double(k) * p;
        den += p;
      }
      return den > 0 ? num / den : 0;
    }
  }
  return 0;
}

Plan load_plan(const std::string& path) {
  PlanLoadResult r = load_plan_file(path);
  for (const Diagnostic& d : r.findings)
    if (d.severity == Severity::error)
      throw PlanError(d.loc, d.path.empty() ? d.message : d.path + ": " + d.message);
  return std::move(*r.plan);
}

// The workload of `synth`: the preset's (a plan file gets B = 8, bag lengths U[0,8]) with the
// options given on the command line over it; throws UsageError for a malformed option.
SynthOptions synth_options(const SynthArgs& a) {
  SynthOptions o = preset_workload(a.preset);
  if (a.batches) o.batches = *a.batches;
  if (a.batch_size) o.batch_sizes = {*a.batch_size};
  if (!a.batch_sizes.empty()) {
    if (a.batch_size) throw UsageError("give --batch-size or --batch-sizes, not both");
    o.batch_sizes.clear();
    for (const std::string& s : split(a.batch_sizes, ',')) {
      try {
        size_t pos = 0;
        o.batch_sizes.push_back(std::stoll(s, &pos));
        if (pos != s.size()) throw std::invalid_argument(s);
      } catch (const std::exception&) {
        throw UsageError("--batch-sizes: '" + s + "' is not an integer");
      }
    }
  }
  if (!a.hotness.empty()) {
    o.hotness.clear();
    for (const std::string& s : split(a.hotness, ',')) o.hotness.push_back(parse_hotness(s));
  }
  if (!a.ids.empty()) {
    if (a.ids == "uniform") {
      o.zipf_ids = false;
    } else if (a.ids.rfind("zipf:", 0) == 0) {
      o.zipf_ids = true;
      try {
        size_t pos = 0;
        const std::string v = a.ids.substr(5);
        o.zipf_alpha = std::stod(v, &pos);
        if (pos != v.size()) throw std::invalid_argument(v);
      } catch (const std::exception&) {
        throw UsageError("--ids: want uniform or zipf:ALPHA, got '" + a.ids + "'");
      }
    } else {
      throw UsageError("--ids: want uniform or zipf:ALPHA, got '" + a.ids + "'");
    }
  }
  o.vbe = a.vbe;
  o.oob_fraction = a.oob;
  o.weighted = a.weighted;
  o.empty_rank = a.empty_rank;
  if (a.seed) o.seed = *a.seed;
  if (!a.index_type.empty()) {
    if (a.index_type == "int32")
      o.index_type = IndexType::i32;
    else if (a.index_type == "int64")
      o.index_type = IndexType::i64;
    else
      throw UsageError("--index-type: want int32 or int64, got '" + a.index_type + "'");
  }
  if (!a.store.empty()) {
    o.store_ctx = o.store_local_embs = o.store_output = false;
    if (a.store != "none")
      for (const std::string& s : split(a.store, ',')) {
        if (s == "ctx")
          o.store_ctx = true;
        else if (s == "local_embs")
          o.store_local_embs = true;
        else if (s == "output")
          o.store_output = true;
        else if (s == "module_output")
          o.store_module_output = true;
        else
          throw UsageError("--store: unknown part '" + s +
                           "' (want a list of ctx, local_embs, output, module_output, or none)");
      }
  }
  if (a.plant == "output-after-callback")
    o.plant = SynthOptions::Plant::output_after_callback;
  else if (a.plant == "local-embs-means")
    o.plant = SynthOptions::Plant::local_embs_means;
  else if (!a.plant.empty())
    throw UsageError("--plant: want output-after-callback or local-embs-means, got '" + a.plant +
                     "'");
  return o;
}

// Size up front: one batch's ids and contexts of every rank are in memory at once (W^2 context
// terms), and every rank's lookups too unless the dist runs one destination at a time; throws
// Error when that is more than this machine has.
void check_synth_memory(const Plan& plan, const SynthOptions& o) {
  int64_t b = 0;
  for (int64_t x : o.batch_sizes) b = std::max(b, x);
  double len = 0;
  for (const Hotness& h : o.hotness) len += mean_length(h);
  len /= double(std::max<size_t>(1, o.hotness.size()));
  MemoryEstimate m = estimate_batch_memory(plan, b, len);
  const bool engine = o.store_ctx || o.store_local_embs || o.store_output;
  double need = !engine ? m.ids : m.ids + m.context;
  if (synth_by_destination_planned(plan, o))
    need = m.synth_by_destination -
           (o.store_local_embs ? 0 : std::min(2.0, double(plan.world_size)) * m.synth_one_lookup);
  else if (o.store_local_embs || o.store_output || o.store_module_output)
    need = m.synth;
  const uint64_t have = usable_memory_bytes();
  if (have > 0 && need > double(have))
    throw Error(fmt::format(
        "synth: one batch needs about {}, more than the {} this machine has (physical memory, "
        "cgroup limit or DYNEMB_MEMORY_LIMIT); W = {}: {}. Lower --batch-size, --hotness or "
        "--store",
        human_bytes(need), human_bytes(double(have)), plan.world_size, m.summary()));
}

int run_synth(const SynthArgs& a) {
  if (a.plan_path.empty() == a.preset.empty())
    throw UsageError("synth: give either a PLAN.yaml or --preset NAME (presets: " +
                     fmt::format("{}", fmt::join(preset_names(), ", ")) + ")");
  Plan plan = a.preset.empty() ? load_plan(a.plan_path) : preset_plan(a.preset);
  const SynthOptions o = synth_options(a);
  check_synth_options(plan, o);
  check_synth_memory(plan, o);
  // Before any work: -o is not the plan file (by identity), and its temporary can be made.
  std::vector<NamedPath> inputs;
  if (!a.plan_path.empty()) inputs.push_back({"plan", a.plan_path});
  check_output_clashes(inputs, {{"-o", a.out}});
  auto out = std::make_shared<OutputFile>(a.out, a.force ? Existing::replace : Existing::refuse);

  ProgressLine line("synth", true);  // only when a person is watching: stderr on a terminal
  auto progress = [&](int64_t k) {
    line.update(double(k + 1) / double(std::max<int64_t>(1, o.batches)),
                fmt::format("{}/{} batches", k + 1, o.batches), 0, 0, k + 1 == o.batches);
  };
  synth_capture(plan, o, out, progress);
  // Without --force, a file that appeared at OUT meanwhile is kept (exit 2, nothing replaced).
  commit_outputs({out.get()}, 0);
  line.clear();
  std::vector<std::string> parts;
  if (o.store_ctx) parts.emplace_back("ctx");
  if (o.store_local_embs) parts.emplace_back("local_embs");
  if (o.store_output) parts.emplace_back("output");
  if (o.store_module_output) parts.emplace_back("module_output");
  console::outf("wrote {}: {} plan, W={}, F={}, {} batch(es), seed {}, stored: KJT{}{}\n",
                escape_field(a.out), to_string(plan.module), plan.world_size, plan.num_features(),
                o.batches, o.seed, parts.empty() ? "" : ", ", fmt::join(parts, ", "));
  return 0;
}

}  // namespace

void setup_synth(CLI::App& app, RunFn& run) {
  auto args = std::make_shared<SynthArgs>();
  auto* sub = app.add_subcommand(
      "synth",
      "Write a synthetic capture (capture-format.md) with the hash64 oracle: per-rank KJT "
      "inputs and, as asked by --store, the context, lookup output and output-dist result of "
      "the CPU reference engine. Deterministic for a given --seed; written to a temporary name "
      "and renamed when complete.");
  sub->add_option("plan", args->plan_path, "Plan file (plan-format.md); or use --preset");
  sub->add_option("--preset", args->preset,
                  "Preset plan + workload (plans/README.md): unit-seq-w2, unit-seq-w8, "
                  "unit-pooled-w8, odd-dims, odd-dims-d15, ec-bench-criteo, hstu-e2e, or any "
                  "other shipped plans/<name>.yaml (B=8, lengths U[0,8])");
  sub->add_option("-o,--output", args->out,
                  "Capture file to write (never the plan file; an existing file needs --force; "
                  "a symbolic link is written through)")
      ->required();
  sub->add_flag("--force", args->force, "Replace OUT if it exists");
  sub->add_option("--batches", args->batches, "Number of batches (default 1)");
  sub->add_option("--batch-size", args->batch_size, "Local batch size B of every rank");
  sub->add_option("--batch-sizes", args->batch_sizes,
                  "Per-rank batch sizes, e.g. 8,8,5 (W entries; 0 allowed)");
  sub->add_option("--hotness", args->hotness,
                  "Bag lengths, one entry for all features or one per feature: N (fixed N), "
                  "LO..HI (uniform), zipf:ALPHA:MAX (Zipf over [1,MAX]); 0 = zero-length "
                  "feature. E.g. 0..16,0..8,0..20,0..1");
  sub->add_option("--ids", args->ids,
                  "Id distribution over [0, num_embeddings): uniform (default) or zipf:ALPHA "
                  "(id 0 hottest); (hash_)roundrobin tables draw keys from the same range");
  sub->add_option("--oob-ids", args->oob,
                  "Fraction of ids outside the table: negative or past the last shard for "
                  "continuous tables, raw keys anywhere in int64/int32 for (hash_)roundrobin "
                  "(needs bounds_check warn_zero_row or ignore to be looked up)");
  sub->add_flag("--vbe", args->vbe,
                "Variable batch per feature: B_{r,f} uniform in [1, B_r] on every rank");
  sub->add_option("--empty-rank", args->empty_rank,
                  "This rank keeps its batch size but every bag is empty (no ids)");
  sub->add_option("--seed", args->seed, "Workload and /oracle seed (default 0)");
  sub->add_flag("--weighted", args->weighted,
                "Weighted KJTs: weights k/4, k uniform in [0,8] (exact pooled sums)");
  sub->add_option("--index-type", args->index_type, "int32 or int64 (default) lengths and ids");
  sub->add_option("--store", args->store,
                  "Optional parts to fill with the reference engine: a list of ctx, "
                  "local_embs, output, module_output (pooled: the module's output after mean "
                  "pooling), or none (default ctx, local_embs, output; ctx only for "
                  "ec-bench-criteo and hstu-e2e, whose lookup outputs are gigabytes)");
  sub->add_option("--plant", args->plant,
                  "Plant a MEAN fault to see its diagnosis: output-after-callback (output "
                  "holds the mean-divided result) or local-embs-means (the lookup kept MEAN "
                  "pooling: per-rank means instead of sums)");
  sub->callback([&run, args] { run = [args] { return run_synth(*args); }; });
}

}  // namespace dynemb::cli
