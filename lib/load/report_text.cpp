// The load report as text (docs/load.md): a header, a block per plan, the comparison. Every
// name and path from the inputs goes through escape_field.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "common/safe_text.hpp"
#include "load/compute.hpp"

namespace dynemb::load {

namespace {

// A plan's tables are "balanced" at or below this imbalance (max/mean of their ids per rank).
constexpr double kBalanced = 1.10;
// Ranks shown in full; above it the busiest and the least busy kKeep each, the rest elided.
constexpr int64_t kMaxRanksShown = 64;
constexpr int64_t kKeep = 8;

std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.3f} us", s * 1e6);
}

std::string ratio(double v) {
  return v > 0 ? fmt::format("{:.2f}", v) : std::string("-");
}

std::vector<int64_t> ids_of(const std::vector<RankLoad>& v, bool unique) {
  std::vector<int64_t> out;
  for (const RankLoad& r : v) out.push_back(unique ? r.unique_rows : r.ids);
  return out;
}

std::vector<int64_t> table_ids(const PlanLoad& p, size_t t) {
  const auto W = static_cast<std::ptrdiff_t>(p.plan.world_size);
  const auto b = p.table_ids.begin() + static_cast<std::ptrdiff_t>(t) * W;
  return std::vector<int64_t>(b, b + W);
}

struct Imbalances {
  double ids, unique, in_sent, in_recv, out_sent, out_recv;
};
Imbalances imbalances_of(const PlanLoad& p) {
  return {imbalance(ids_of(p.total, false)), imbalance(ids_of(p.total, true)),
          imbalance(p.input_dist.sent()),    imbalance(p.input_dist.received()),
          imbalance(p.output_dist.sent()),   imbalance(p.output_dist.received())};
}

// The ranks of the per-rank table: all, or the kKeep with most ids and the kKeep with fewest
// (-1 marks the elided run).
std::vector<int64_t> ranks_shown(const PlanLoad& p) {
  const int64_t W = p.plan.world_size;
  std::vector<int64_t> order(static_cast<size_t>(W));
  std::iota(order.begin(), order.end(), 0);
  if (W <= kMaxRanksShown) return order;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return p.total[static_cast<size_t>(a)].ids > p.total[static_cast<size_t>(b)].ids;
  });
  std::vector<int64_t> out(order.begin(), order.begin() + kKeep);
  out.push_back(-1);
  out.insert(out.end(), order.end() - kKeep, order.end());
  return out;
}

std::string plan_block(const PlanLoad& p) {
  const Plan& plan = p.plan;
  const int64_t W = plan.world_size;
  std::string s = fmt::format("\n== plan {} (W={}, {}): {}\n", escape_field(p.name), W,
                              to_string(plan.module), escape_field(p.origin));
  const std::vector<int64_t> in_s = p.input_dist.sent(), in_r = p.input_dist.received();
  const std::vector<int64_t> out_s = p.output_dist.sent(), out_r = p.output_dist.received();
  s += fmt::format("  {:>6} {:>14} {:>14} {:>16} {:>16} {:>16} {:>16}\n", "rank", "ids",
                   "unique rows", "input dist in", "input dist out", "output dist in",
                   "output dist out");
  for (int64_t r : ranks_shown(p)) {
    if (r < 0) {
      s += fmt::format(
          "  {:>6} ({} ranks elided: the table shows the {} with most ids and the "
          "{} with fewest)\n",
          "...", W - 2 * kKeep, kKeep, kKeep);
      continue;
    }
    const size_t i = static_cast<size_t>(r);
    s += fmt::format("  {:>6} {:>14} {:>14} {:>16} {:>16} {:>16} {:>16}\n", r, p.total[i].ids,
                     p.total[i].unique_rows, in_r[i], in_s[i], out_r[i], out_s[i]);
  }
  s += "  (bytes summed over batches, off the diagonal: in = received from other ranks, out = "
       "sent to them; unique rows summed over batches)\n";
  const Imbalances im = imbalances_of(p);
  s += fmt::format(
      "  imbalance (max/mean): ids {}, unique rows {}, input dist in {} out {}, output dist in "
      "{} out {}\n",
      ratio(im.ids), ratio(im.unique), ratio(im.in_recv), ratio(im.in_sent), ratio(im.out_recv),
      ratio(im.out_sent));
  const size_t h = static_cast<size_t>(p.hottest_rank);
  const int64_t hot_ids = p.total.empty() ? 0 : p.total[h].ids;
  std::string tables;
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    const int64_t n = p.table_ids[t * static_cast<size_t>(W) + h];
    if (n == 0) continue;
    tables += fmt::format(
        "{}{} {} ({:.1f}%)", tables.empty() ? "" : ", ", escape_field(plan.tables[t].name), n,
        hot_ids ? 100.0 * static_cast<double>(n) / static_cast<double>(hot_ids) : 0.0);
  }
  s += fmt::format("  hottest rank {}: {} ids{}{}\n", p.hottest_rank, hot_ids,
                   tables.empty() ? "" : "; by table: ", tables);
  if (!p.hottest_rows.empty()) {
    s += fmt::format(
        "  hottest rows of rank {} (table[id]: ids; lo..hi where the bounded "
        "summary knows the count only within a range):",
        p.hottest_rank);
    for (const HotRow& r : p.hottest_rows) {
      const std::string n = r.overcount ? fmt::format("{}..{}", r.count - r.overcount, r.count)
                                        : std::to_string(r.count);
      s += fmt::format(" {}[{}]: {}", escape_field(plan.tables[static_cast<size_t>(r.table)].name),
                       r.row, n);
    }
    s += "\n";
  }
  s += fmt::format("  estimate (critical path, all batches): input dist {}, output dist {}\n",
                   seconds_text(p.input_dist_seconds), seconds_text(p.output_dist_seconds));
  return s;
}

// One sentence per table that some plan balances and the first plan does not.
std::string table_sentences(const LoadReport& r) {
  const PlanLoad& base = r.plans.front();
  std::string s;
  for (size_t t = 0; t < base.plan.tables.size(); ++t) {
    const std::vector<int64_t> ids = table_ids(base, t);
    const double b = imbalance(ids);
    if (b <= kBalanced) continue;
    std::vector<std::string> names, values;
    for (size_t i = 1; i < r.plans.size(); ++i) {
      if (r.plans[i].plan.world_size < 2) continue;  // one rank: balanced by definition
      const double v = imbalance(table_ids(r.plans[i], t));
      if (v > 0 && v <= kBalanced) {
        names.push_back(escape_field(r.plans[i].name));
        values.push_back(fmt::format("{:.2f}", v));
      }
    }
    if (names.empty()) continue;
    const int64_t mx = *std::max_element(ids.begin(), ids.end());
    const int64_t sum = std::accumulate(ids.begin(), ids.end(), int64_t{0});
    // "roundrobin balances it (1.01)"; "roundrobin (1.01), w16 (1.05) balance it".
    std::string who;
    if (names.size() == 1) {
      who = fmt::format("{} balances it ({})", names[0], values[0]);
    } else {
      for (size_t i = 0; i < names.size(); ++i)
        who += fmt::format("{}{} ({})", i ? ", " : "", names[i], values[i]);
      who += " balance it";
    }
    s += fmt::format(
        "table {}: {} under {} (imbalance {:.2f}); {}\n", escape_field(base.plan.tables[t].name),
        mx == sum ? "all ids on one rank" : "ids unevenly spread", escape_field(base.name), b, who);
  }
  return s;
}

std::string comparison(const LoadReport& r) {
  std::string s = fmt::format(
      "\n== comparison (imbalance = max/mean over ranks; times are critical-path estimates at "
      "{} Gbit/s, all batches)\n",
      r.link_gbps);
  s += fmt::format("  {:<16} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>14} {:>14}\n", "plan",
                   "W", "ids", "unique", "in-in", "in-out", "out-in", "out-out", "input dist",
                   "output dist");
  for (const PlanLoad& p : r.plans) {
    const Imbalances im = imbalances_of(p);
    s += fmt::format("  {:<16} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>14} {:>14}\n",
                     escape_field(p.name), p.plan.world_size, ratio(im.ids), ratio(im.unique),
                     ratio(im.in_recv), ratio(im.in_sent), ratio(im.out_recv), ratio(im.out_sent),
                     seconds_text(p.input_dist_seconds), seconds_text(p.output_dist_seconds));
  }
  s += "  imbalance of each table's ids:\n";
  s += fmt::format("  {:<16}", "table");
  for (const PlanLoad& p : r.plans) s += fmt::format(" {:>12}", escape_field(p.name));
  s += "\n";
  const PlanLoad& base = r.plans.front();
  for (size_t t = 0; t < base.plan.tables.size(); ++t) {
    s += fmt::format("  {:<16}", escape_field(base.plan.tables[t].name));
    for (const PlanLoad& p : r.plans)
      s += fmt::format(" {:>12}", ratio(imbalance(table_ids(p, t))));
    s += "\n";
  }
  return s + table_sentences(r);
}

}  // namespace

std::string load_report_text(const LoadReport& r) {
  std::string s = "# dynemb-dist load\n";
  s += fmt::format("# capture      {}\n", escape_field(r.capture));
  s += fmt::format("# world size   {}\n", r.capture_world_size);
  s += fmt::format("# batches      {}{}\n", r.num_batches,
                   r.num_batches == 0 ? ": the capture holds no batches, every count is 0" : "");
  s += fmt::format(
      "# link         {} Gbit/s per rank and direction (estimates only: one "
      "full-duplex link per rank, a non-blocking fabric, no latency, no overlap)\n",
      r.link_gbps);
  for (const PlanLoad& p : r.plans) s += plan_block(p);
  if (!r.plans.empty()) s += comparison(r);
  return s;
}

}  // namespace dynemb::load
