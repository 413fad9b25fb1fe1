// Alternative plans (alternatives.hpp, docs/load.md): every dist_type, other world sizes, uneven
// row splits from observed ids; the row histogram behind the last; a batch re-split over
// another world size; and where each plan routes an id.
#include "load/alternatives.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace dynemb::load {

namespace {

constexpr int64_t kMaxWorldSize = 65536;  // what a plan allows (docs/plan-format.md, Limits)

// Finalized, with `source_text` its own YAML; throws Error when `validate` would refuse it
// (a bug here, never the user's input).
Alternative make_alternative(std::string name, std::string origin, Plan plan) {
  plan.path = "alternative " + name;
  plan.finalize();
  plan.source_text = plan_to_yaml(plan, "");
  const PlanLoadResult r = parse_plan(plan.source_text, plan.path);
  for (const Diagnostic& d : r.findings)
    if (d.severity == Severity::error)
      throw Error("alternative plan '" + name + "' does not validate: " + d.str());
  return Alternative{std::move(name), std::move(origin), std::move(plan)};
}

// "continuous", or "mixed: 2 continuous, 1 roundrobin" (counts of tables).
std::string dist_types_of(const Plan& p) {
  std::map<int, int> n;
  for (const TableConfig& t : p.tables) ++n[static_cast<int>(t.dist_type)];
  if (n.size() == 1) return to_string(static_cast<DistType>(n.begin()->first));
  std::string s = "mixed:";
  for (const auto& [d, c] : n)
    s += (s.back() == ':' ? " " : ", ") + std::to_string(c) + " " +
         to_string(static_cast<DistType>(d));
  return s;
}

Alternative under_dist_type(const Plan& base, DistType d) {
  Plan p = base;
  int dropped = 0;
  for (TableConfig& t : p.tables) {
    // Shards of a continuous table stay valid under continuous; (hash_)roundrobin shards are
    // capacities, which the ceil rule would not match; under (hash_)roundrobin no key range
    // means anything, so every table goes without.
    if (!t.shards.empty() && (d != DistType::continuous || t.dist_type != DistType::continuous)) {
      t.shards.clear();
      ++dropped;
    }
    t.dist_type = d;
  }
  std::string origin =
      std::string("every table under ") + to_string(d) + " (was " + dist_types_of(base) + ")";
  if (dropped > 0)
    origin += "; explicit shards of " + std::to_string(dropped) + " table" +
              (dropped > 1 ? "s" : "") + " dropped";
  return make_alternative(to_string(d), std::move(origin), std::move(p));
}

Alternative at_world_size(const Plan& base, int64_t w) {
  Plan p = base;
  bool dropped = false;
  for (TableConfig& t : p.tables) {
    dropped = dropped || !t.shards.empty();
    t.shards.clear();
  }
  p.world_size = w;
  std::string origin =
      "world_size " + std::to_string(w) +
      (w == base.world_size ? " (as the base)" : " (was " + std::to_string(base.world_size) + ")");
  if (dropped) origin += "; explicit shards dropped: even rows by the ceil rule";
  return make_alternative("w" + std::to_string(w), std::move(origin), std::move(p));
}

// Bucket edges k_1 < ... < k_{W-1} in (0, nb) of a table's counts `c` ([nb] buckets, nb >= W):
// edge r is the one whose prefix count is nearest r * total / W (the lowest on a tie), kept
// within [k_{r-1} + 1, nb - (W - r)] so that every rank gets at least one bucket.
std::vector<int64_t> prefix_cut(const std::vector<int64_t>& c, int64_t W) {
  const int64_t nb = static_cast<int64_t>(c.size());
  std::vector<int64_t> prefix(static_cast<size_t>(nb) + 1, 0);
  for (int64_t k = 0; k < nb; ++k) prefix[size_t(k) + 1] = prefix[size_t(k)] + c[size_t(k)];
  const __int128 total = prefix.back();
  std::vector<int64_t> edges;
  int64_t prev = 0;
  for (int64_t r = 1; r < W; ++r) {
    // |W * prefix[k] - r * total| is W times the distance to the target: exact integers.
    const __int128 target = total * r;
    auto dist = [&](int64_t k) {
      const __int128 d = __int128(prefix[size_t(k)]) * W - target;
      return d < 0 ? -d : d;
    };
    const int64_t lo = prev + 1, hi = nb - (W - r);
    // The first edge at or past the target, then the one before it if nearer.
    int64_t k = std::lower_bound(prefix.begin() + lo, prefix.begin() + hi + 1, int64_t(0),
                                 [&](int64_t p, int64_t) { return __int128(p) * W < target; }) -
                prefix.begin();
    k = std::min(k, hi);
    if (k > lo && dist(k - 1) <= dist(k)) {
      // Nearer (or as near) below: the lowest edge with that same prefix count.
      k = std::lower_bound(prefix.begin() + lo, prefix.begin() + k, prefix[size_t(k) - 1]) -
          prefix.begin();
    }
    edges.push_back(k);
    prev = k;
  }
  return edges;
}

}  // namespace

std::vector<Alternative> generate_alternatives(const Plan& base, const AlternativeRequest& req) {
  for (int64_t w : req.world_sizes)
    if (w < 1 || w > kMaxWorldSize)
      throw UsageError("world size " + std::to_string(w) + ": a plan's world_size is 1.." +
                       std::to_string(kMaxWorldSize));
  std::vector<Alternative> out;
  if (req.dist_types) {
    for (DistType d : {DistType::continuous, DistType::roundrobin, DistType::hash_roundrobin}) {
      const bool all = std::all_of(base.tables.begin(), base.tables.end(),
                                   [&](const TableConfig& t) { return t.dist_type == d; });
      if (!all) out.push_back(under_dist_type(base, d));
    }
  }
  std::set<int64_t> seen;
  for (int64_t w : req.world_sizes)
    if (seen.insert(w).second) out.push_back(at_world_size(base, w));
  return out;
}

// ------------------------------------------------------------------ RowHistogram

RowHistogram::RowHistogram(const Plan& plan, int64_t buckets_per_table) : plan_(plan) {
  plan_.finalize();  // the feature -> table map, whether or not the caller finalized it
  if (buckets_per_table < 1)
    throw UsageError("buckets per table must be >= 1, got " + std::to_string(buckets_per_table));
  for (const TableConfig& t : plan_.tables) {
    const int64_t n = std::max<int64_t>(t.num_embeddings, 1);
    const int64_t width = (n - 1) / buckets_per_table + 1;  // ceil without overflow
    widths_.push_back(width);
    counts_.emplace_back(static_cast<size_t>((n - 1) / width + 1), 0);
  }
  outside_.assign(plan_.tables.size(), 0);
}

void RowHistogram::add(const Kjt& kjt) {
  const int64_t F = plan_.num_features();
  if (kjt.num_features != F)
    throw Error("row histogram: a KJT of " + std::to_string(kjt.num_features) +
                " features under a plan of " + std::to_string(F));
  for (int64_t n : kjt.lengths)
    if (n < 0)
      throw Error("row histogram: the KJT has a negative length (" + std::to_string(n) + ")");
  if (kjt.is_vbe() && int64_t(kjt.stride_per_feature.size()) != F)
    throw Error("row histogram: the KJT has " + std::to_string(kjt.stride_per_feature.size()) +
                " VBE batch sizes for " + std::to_string(F) + " features");
  int64_t bags = 0;
  for (int64_t f = 0; f < F; ++f) bags += kjt.batch_size(f);
  if (bags != kjt.num_bags())
    throw Error("row histogram: the KJT has " + std::to_string(kjt.num_bags()) + " lengths for " +
                std::to_string(bags) + " bags");
  const std::vector<int64_t> per_key = kjt.length_per_key();
  int64_t sum = 0;
  for (int64_t n : per_key) sum += n;
  if (sum != kjt.num_ids())
    throw Error("row histogram: the KJT's lengths sum to " + std::to_string(sum) + ", it holds " +
                std::to_string(kjt.num_ids()) + " ids");
  size_t i = 0;
  for (int64_t f = 0; f < F; ++f) {
    const FeatureInfo& fi = plan_.features[size_t(f)];
    const size_t t = static_cast<size_t>(fi.table);
    const int64_t rows = plan_.tables[t].num_embeddings, width = widths_[t];
    std::vector<int64_t>& c = counts_[t];
    for (int64_t k = 0; k < per_key[size_t(f)]; ++k, ++i) {
      const int64_t id = kjt.values[i];
      if (id >= 0 && id < rows)
        ++c[static_cast<size_t>(id / width)];
      else
        ++outside_[t];
    }
  }
}

// ------------------------------------------------------------------ balanced_rows_plan

Alternative balanced_rows_plan(const Plan& base, const RowHistogram& hist) {
  const Plan& hp = hist.plan();
  if (hp.tables.size() != base.tables.size())
    throw Error("balanced rows: the histogram was counted under a plan of " +
                std::to_string(hp.tables.size()) + " tables, the base has " +
                std::to_string(base.tables.size()));
  Plan p = base;
  const int64_t W = p.world_size;
  int cut = 0, kept = 0;
  for (size_t ti = 0; ti < p.tables.size(); ++ti) {
    TableConfig& t = p.tables[ti];
    if (t.dist_type != DistType::continuous) continue;  // rows are not ranges there
    if (hp.tables[ti].num_embeddings != t.num_embeddings)
      throw Error("balanced rows: table '" + t.name + "' has " + std::to_string(t.num_embeddings) +
                  " rows, " + std::to_string(hp.tables[ti].num_embeddings) +
                  " in the histogram's plan");
    const std::vector<int64_t>& c = hist.counts(static_cast<int>(ti));
    int64_t total = 0;
    for (int64_t x : c) total += x;
    // Every rank keeps a bucket: impossible with fewer buckets than ranks; nothing to even out
    // without ids. Such tables stay as they were.
    if (W == 1 || int64_t(c.size()) < W || total == 0) {
      ++kept;
      continue;
    }
    const int64_t width = hist.width(static_cast<int>(ti));
    std::vector<int64_t> offset = {0};
    for (int64_t k : prefix_cut(c, W)) offset.push_back(std::min(k * width, t.num_embeddings));
    offset.push_back(t.num_embeddings);
    t.shards.clear();
    for (int64_t r = 0; r < W; ++r) {
      ShardSpec s;
      s.rank = r;
      s.row_offset = offset[size_t(r)];
      s.rows = offset[size_t(r) + 1] - offset[size_t(r)];
      t.shards.push_back(s);
    }
    ++cut;
  }
  if (cut == 0)
    return make_alternative(
        "balanced",
        "as the base: no continuous table to split (none, no ids observed, or fewer buckets "
        "than ranks)",
        std::move(p));
  p.input_dist = InputDist::inference;
  std::string origin =
      "inference only: " + std::to_string(cut) + " continuous table" + (cut == 1 ? "" : "s") +
      " split into uneven row ranges that even out the ids observed (TorchRec takes uneven row "
      "splits for inference; training routes by the ceil rule)";
  if (kept > 0)
    origin += "; " + std::to_string(kept) + " continuous table" + (kept == 1 ? "" : "s") +
              " left as before (no ids observed, or fewer buckets than ranks)";
  return make_alternative("balanced", std::move(origin), std::move(p));
}

// ------------------------------------------------------------------ PlanRouter

PlanRouter::PlanRouter(const Plan& plan) : world_size_(plan.world_size), features_(plan.features) {}

// ------------------------------------------------------------------ resplit_batch

namespace {

// The ranks' KJTs must agree on everything but their bags.
void check_ranks_agree(const std::vector<const Kjt*>& kjts) {
  const Kjt& a = *kjts[0];
  for (size_t s = 0; s < kjts.size(); ++s) {
    const Kjt& k = *kjts[s];
    const std::string who = "re-split: rank " + std::to_string(s) + "'s KJT ";
    if (k.num_features != a.num_features || k.weighted != a.weighted ||
        k.lengths_type != a.lengths_type || k.values_type != a.values_type ||
        k.mean_divisor != a.mean_divisor)
      throw Error(who + "differs from rank 0's in features, weights, dtypes or mean divisor");
    if (k.is_vbe() && int64_t(k.stride_per_feature.size()) != k.num_features)
      throw Error(who + "has " + std::to_string(k.stride_per_feature.size()) +
                  " VBE batch sizes for " + std::to_string(k.num_features) + " features");
    int64_t bags = 0;
    for (int64_t f = 0; f < k.num_features; ++f) bags += k.batch_size(f);
    if (bags != k.num_bags() ||
        (!k.is_vbe() && k.num_features > 0 && k.num_bags() % k.num_features != 0))
      throw Error(who + "has " + std::to_string(k.num_bags()) + " lengths for its batch sizes");
    int64_t ids = 0;
    for (int64_t n : k.lengths) {
      if (n < 0) throw Error(who + "has a negative length");
      ids += n;
    }
    if (ids != k.num_ids() || (k.weighted && k.weights.size() != k.values.size()))
      throw Error(who + "holds " + std::to_string(k.num_ids()) + " ids (and " +
                  std::to_string(k.weights.size()) + " weights) for lengths summing to " +
                  std::to_string(ids));
  }
}

}  // namespace

std::vector<Kjt> resplit_batch(const std::vector<const Kjt*>& kjts, int64_t world_size) {
  if (world_size < 1)
    throw UsageError("re-split: world size must be >= 1, got " + std::to_string(world_size));
  if (kjts.empty()) throw UsageError("re-split: no rank's KJT to re-split");
  check_ranks_agree(kjts);
  const Kjt& k0 = *kjts[0];
  const int64_t F = k0.num_features, W = world_size;
  const bool vbe = std::any_of(kjts.begin(), kjts.end(), [](const Kjt* k) { return k->is_vbe(); });

  // n[r][f]: bags of feature f that rank r gets.
  std::vector<std::vector<int64_t>> n(size_t(W), std::vector<int64_t>(size_t(F), 0));
  if (!vbe) {
    int64_t B = 0;
    for (const Kjt* k : kjts) B += F > 0 ? k->stride() : 0;
    if (B % W != 0)
      throw UsageError("re-split: the global batch of " + std::to_string(B) +
                       " samples does not divide by world size " + std::to_string(W));
    for (auto& row : n) std::fill(row.begin(), row.end(), B / W);
  } else {
    for (int64_t f = 0; f < F; ++f) {
      int64_t Bf = 0;
      for (const Kjt* k : kjts) Bf += k->batch_size(f);
      for (int64_t r = 0; r < W; ++r) n[size_t(r)][size_t(f)] = Bf / W + (r < Bf % W ? 1 : 0);
    }
  }

  std::vector<Kjt> out(static_cast<size_t>(W));
  for (int64_t r = 0; r < W; ++r) {
    Kjt& o = out[size_t(r)];
    o.num_features = F;
    o.weighted = k0.weighted;
    o.mean_divisor = k0.mean_divisor;
    o.lengths_type = k0.lengths_type;
    o.values_type = k0.values_type;
    if (vbe) o.stride_per_feature = n[size_t(r)];
  }
  std::vector<std::vector<int64_t>> offsets;
  for (const Kjt* k : kjts) offsets.push_back(k->offsets());
  // Feature by feature, the bags of every rank in rank order, dealt out in runs.
  for (int64_t f = 0; f < F; ++f) {
    size_t s = 0;
    int64_t j = 0;  // bag of feature f within rank s
    for (int64_t r = 0; r < W; ++r) {
      Kjt& o = out[size_t(r)];
      for (int64_t b = 0; b < n[size_t(r)][size_t(f)]; ++b) {
        while (j == kjts[s]->batch_size(f)) ++s, j = 0;  // runs exactly as many as there are
        const Kjt& k = *kjts[s];
        const int64_t bag = k.bag_begin(f) + j++;
        const int64_t lo = offsets[s][size_t(bag)], len = k.lengths[size_t(bag)];
        o.lengths.push_back(len);
        o.values.insert(o.values.end(), k.values.begin() + lo, k.values.begin() + lo + len);
        if (k.weighted)
          o.weights.insert(o.weights.end(), k.weights.begin() + lo, k.weights.begin() + lo + len);
      }
    }
  }
  return out;
}

}  // namespace dynemb::load
