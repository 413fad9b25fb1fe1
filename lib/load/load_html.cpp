#include "load/load_html.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "html/page.hpp"

namespace dynemb::load {

namespace {

// What a rank takes in from the others in one dist: the matrix's column sums without the
// diagonal (a rank's share with itself is a local copy). [W], W from the matrix.
std::vector<int64_t> bytes_received(const TrafficMatrix& m) {
  const int64_t w = m.world_size;
  std::vector<int64_t> in(size_t(std::max<int64_t>(0, w)), 0);
  if (w <= 0 || m.bytes.size() != size_t(w * w)) return in;
  for (int64_t s = 0; s < w; ++s)
    for (int64_t d = 0; d < w; ++d)
      if (s != d) in[size_t(d)] += m.at(s, d);
  return in;
}

// max / mean of per-rank values; 0 when all are 0 (as load.hpp's imbalance()).
double max_over_mean(const std::vector<int64_t>& v) {
  if (v.empty()) return 0;
  double sum = 0, mx = 0;
  for (const int64_t x : v) {
    sum += double(x);
    mx = std::max(mx, double(x));
  }
  return sum > 0 ? mx / (sum / double(v.size())) : 0;
}

std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.3g} s", s);
  if (s >= 1e-3) return fmt::format("{:.3g} ms", s * 1e3);
  if (s >= 1e-6 || s == 0) return fmt::format("{:.3g} \u00b5s", s * 1e6);
  return fmt::format("{:.3g} ns", s * 1e9);
}

// ids of table t on every rank of plan p ([W]; zeros where table_ids is short).
std::vector<int64_t> table_ranks(const PlanLoad& p, size_t t) {
  const int64_t w = p.plan.world_size;
  std::vector<int64_t> v(size_t(std::max<int64_t>(0, w)), 0);
  for (int64_t r = 0; r < w; ++r) {
    const size_t i = t * size_t(w) + size_t(r);
    if (i < p.table_ids.size()) v[size_t(r)] = p.table_ids[i];
  }
  return v;
}

std::vector<int64_t> total_ids(const PlanLoad& p) {
  std::vector<int64_t> v;
  for (const RankLoad& r : p.total) v.push_back(r.ids);
  return v;
}

std::vector<int64_t> total_unique(const PlanLoad& p) {
  std::vector<int64_t> v;
  for (const RankLoad& r : p.total) v.push_back(r.unique_rows);
  return v;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (const int64_t x : v) s += x;
  return s;
}

// One bar chart of a per-rank quantity, one series per plan. Plans of other world sizes
// have bars only for their own ranks; past 64 ranks a bar is the largest of its block.
void rank_bars(html::Page& page, const LoadReport& rep, const std::string& title,
               const std::string& value_name,
               const std::function<std::vector<int64_t>(const PlanLoad&)>& per_rank,
               std::function<std::string(double)> format) {
  int64_t w = 0;
  for (const PlanLoad& p : rep.plans) w = std::max(w, p.plan.world_size);
  const html::Blocks b(w, 64);
  html::BarChart c;
  c.title = title;
  c.category_name = b.size == 1 ? "rank" : "ranks";
  c.value_name = b.size == 1 ? value_name : value_name + " (largest of the block)";
  c.bytes = value_name == "bytes";
  c.format = std::move(format);
  for (int64_t k = 0; k < b.count; ++k) c.categories.push_back(b.label(k, "rank"));
  for (const PlanLoad& p : rep.plans) {
    const std::vector<int64_t> v = per_rank(p);
    html::Series s{p.name, std::vector<double>(size_t(b.count), 0)};
    for (size_t r = 0; r < v.size() && int64_t(r) < w; ++r) {
      double& x = s.values[size_t(int64_t(r) / b.size)];
      x = std::max(x, double(v[r]));
    }
    c.series.push_back(std::move(s));
  }
  page.bar_chart(c);
}

void overview(html::Page& page, const LoadReport& rep) {
  page.facts({{"capture", rep.capture},
              {"world size (capture)", std::to_string(rep.capture_world_size)},
              {"batches", std::to_string(rep.num_batches)},
              {"link for the estimates", fmt::format("{} Gbit/s per direction", rep.link_gbps)}});
  html::Table t;
  t.caption = "The plans";
  t.headers = {"plan",         "what it is",       "world size",        "ids (max rank / mean)",
               "hottest rank", "input dist bytes", "output dist bytes", "estimated dist time"};
  t.numeric = {false, false, true, true, true, true, true, true};
  for (const PlanLoad& p : rep.plans) {
    const std::vector<int64_t> ids = total_ids(p);
    t.rows.push_back({p.name, p.origin, std::to_string(p.plan.world_size),
                      html::ratio_text(max_over_mean(ids)), std::to_string(p.hottest_rank),
                      html::bytes_text(double(sum(bytes_received(p.input_dist)))),
                      html::bytes_text(double(sum(bytes_received(p.output_dist)))),
                      seconds_text(p.input_dist_seconds + p.output_dist_seconds)});
  }
  t.note =
      "Bytes are those that cross between ranks (the diagonal, a rank's share with itself, "
      "left out), summed over every batch; the time is an estimate (see below).";
  page.table(t);
}

void traffic_maps(html::Page& page, const LoadReport& rep) {
  page.heading("Traffic between ranks");
  page.paragraph(
      "Bytes rank s sends to rank d in each dist, summed over every batch: the input dist is "
      "the KJT all-to-all (lengths, values, strides, weights), the output dist the embeddings "
      "back (sequence: all-to-all of rows; pooled: reduce-scatter). The diagonal, a rank's "
      "share with itself, is a local copy and drawn as zero. When there are many ranks, the "
      "alternatives' maps are drawn in coarser blocks than the first plan's.",
      true);
  // The page's size is mostly the maps' cells (about 120 bytes each with its tooltip and
  // table entry): the first plan's two maps get up to 64 x 64 cells each, the alternatives'
  // maps share another 4096, so a page stays under 2 MB whatever the number of plans.
  const size_t alt_maps = rep.plans.size() > 1 ? 2 * (rep.plans.size() - 1) : 1;
  const int64_t alt_side =
      std::clamp<int64_t>(int64_t(std::sqrt(4096.0 / double(alt_maps))), 8, 64);
  for (const PlanLoad& p : rep.plans) {
    const int64_t side = &p == &rep.plans.front() ? 64 : alt_side;
    page.heading("Plan " + p.name, 3);
    for (const auto& [m, what] :
         {std::pair<const TrafficMatrix*, const char*>{&p.input_dist, "input dist"},
          {&p.output_dist, "output dist"}}) {
      const int64_t w = m->world_size;
      if (w <= 0 || m->bytes.size() != size_t(w * w)) {
        page.paragraph(fmt::format("{}: no traffic matrix.", what), true);
        continue;
      }
      html::HeatMap h;
      h.title = fmt::format("{}, {}: bytes sent, {} to {}", p.name, what, "sender", "receiver");
      h.n = w;
      h.cells.resize(m->bytes.size());
      for (int64_t s = 0; s < w; ++s)
        for (int64_t d = 0; d < w; ++d)
          h.cells[size_t(s * w + d)] = s == d ? 0 : double(m->at(s, d));
      h.format = [](double v) { return html::bytes_text(v); };
      h.max_side = side;
      page.heat_map(h);
    }
  }
}

void imbalance_section(html::Page& page, const LoadReport& rep) {
  page.heading("Imbalance per table");
  page.paragraph(
      "max / mean over the ranks of the ids each table routes to them, all batches: "
      "1 is perfectly even, W is one rank taking them all.",
      true);
  std::vector<std::string> names;
  for (const PlanLoad& p : rep.plans)
    for (const TableConfig& t : p.plan.tables)
      if (std::find(names.begin(), names.end(), t.name) == names.end()) names.push_back(t.name);
  html::BarChart c;
  c.title = "Imbalance (max / mean ids per rank) of each table under each plan";
  c.category_name = "table";
  c.value_name = "max / mean";
  c.format = [](double v) { return html::ratio_text(v); };
  for (const std::string& n : names) c.categories.push_back(n);
  c.categories.push_back("all tables");
  for (const PlanLoad& p : rep.plans) {
    html::Series s{p.name, {}};
    for (const std::string& n : names) {
      const auto& ts = p.plan.tables;
      const auto it =
          std::find_if(ts.begin(), ts.end(), [&](const TableConfig& t) { return t.name == n; });
      s.values.push_back(it == ts.end() ? 0
                                        : max_over_mean(table_ranks(p, size_t(it - ts.begin()))));
    }
    s.values.push_back(max_over_mean(total_ids(p)));
    c.series.push_back(std::move(s));
  }
  page.bar_chart(c);
}

void hottest_section(html::Page& page, const LoadReport& rep) {
  page.heading("The hottest rank");
  for (const PlanLoad& p : rep.plans) {
    const int64_t hot = p.hottest_rank, w = p.plan.world_size;
    const std::vector<int64_t> ids = total_ids(p);
    const int64_t hot_ids = hot >= 0 && size_t(hot) < ids.size() ? ids[size_t(hot)] : 0;
    const int64_t all = sum(ids);
    page.heading(fmt::format("Plan {}: rank {}", p.name, hot), 3);
    page.paragraph(fmt::format(
        "{} ids of {} ({:.1f}% where an even share is {:.1f}%), {} unique "
        "rows, over every batch.",
        html::int_text(hot_ids), html::int_text(all),
        all > 0 ? 100.0 * double(hot_ids) / double(all) : 0.0, w > 0 ? 100.0 / double(w) : 0.0,
        html::int_text(hot >= 0 && size_t(hot) < p.total.size() ? p.total[size_t(hot)].unique_rows
                                                                : 0)));
    html::Table t;
    t.caption = fmt::format("{}: the tables on rank {}", p.name, hot);
    t.headers = {"table", "ids on the rank", "share of the table's ids"};
    t.numeric = {false, true, true};
    std::vector<std::pair<int64_t, size_t>> by;
    for (size_t k = 0; k < p.plan.tables.size(); ++k) {
      const std::vector<int64_t> v = table_ranks(p, k);
      by.push_back({hot >= 0 && size_t(hot) < v.size() ? v[size_t(hot)] : 0, k});
    }
    std::stable_sort(by.begin(), by.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [n, k] : by) {
      const int64_t tot = sum(table_ranks(p, k));
      t.rows.push_back({p.plan.tables[k].name, html::int_text(n),
                        tot > 0 ? fmt::format("{:.1f}%", 100.0 * double(n) / double(tot)) : "-"});
    }
    page.table(t);
    html::Table rows;
    rows.caption = fmt::format("{}: the hottest rows of rank {}", p.name, hot);
    rows.headers = {"table", "row", "ids", "count is"};
    rows.numeric = {false, true, true, false};
    for (const HotRow& h : p.hottest_rows) {
      const std::string table = h.table >= 0 && size_t(h.table) < p.plan.tables.size()
                                    ? p.plan.tables[size_t(h.table)].name
                                    : fmt::format("table {}", h.table);
      rows.rows.push_back({table, std::to_string(h.row), html::int_text(h.count),
                           h.overcount == 0
                               ? "exact"
                               : fmt::format("at most {} over", html::int_text(h.overcount))});
    }
    if (!rows.rows.empty()) page.table(rows);
  }
}

void estimate_section(html::Page& page, const LoadReport& rep) {
  page.heading("Critical-path estimates of the dists");
  page.paragraph(
      fmt::format("Estimates, not measurements: each batch's dist takes as long as its busiest "
                  "rank needs to send or receive its bytes over a {} Gbit/s link (per "
                  "direction), summed over the batches. They compare plans; they do not "
                  "predict a run.",
                  rep.link_gbps),
      true);
  html::BarChart c;
  c.title = "Estimated dist time over all batches (estimate)";
  c.category_name = "plan";
  c.value_name = "seconds (estimate)";
  c.format = seconds_text;
  c.series = {{"input dist", {}}, {"output dist", {}}};
  html::Table t;
  t.caption = "Estimated dist time per plan (estimates)";
  t.headers = {"plan", "input dist, all batches", "output dist, all batches",
               "input, slowest batch", "output, slowest batch"};
  t.numeric = {false, true, true, true, true};
  for (const PlanLoad& p : rep.plans) {
    c.categories.push_back(p.name);
    c.series[0].values.push_back(p.input_dist_seconds);
    c.series[1].values.push_back(p.output_dist_seconds);
    double in = 0, out = 0;
    for (const BatchLoad& b : p.batches) {
      in = std::max(in, b.input_dist_seconds);
      out = std::max(out, b.output_dist_seconds);
    }
    t.rows.push_back({p.name, seconds_text(p.input_dist_seconds),
                      seconds_text(p.output_dist_seconds), seconds_text(in), seconds_text(out)});
  }
  page.bar_chart(c);
  page.table(t);
}

}  // namespace

std::string load_html(const LoadReport& rep) {
  html::Page page("dynemb-dist load: " + rep.capture);
  overview(page, rep);
  page.heading("Load per rank");
  page.paragraph(
      "Summed over every batch; one bar per plan. A plan of another world size has "
      "bars for its own ranks only.",
      true);
  const auto ints = [](double v) { return html::int_text(int64_t(std::llround(v))); };
  const auto bytes = [](double v) { return html::bytes_text(v); };
  rank_bars(page, rep, "ids routed to each rank (the lookup's input)", "ids", total_ids, ints);
  rank_bars(page, rep, "unique rows each rank touches", "unique rows", total_unique, ints);
  rank_bars(
      page, rep, "input dist bytes each rank receives", "bytes",
      [](const PlanLoad& p) { return bytes_received(p.input_dist); }, bytes);
  rank_bars(
      page, rep, "output dist bytes each rank receives", "bytes",
      [](const PlanLoad& p) { return bytes_received(p.output_dist); }, bytes);
  imbalance_section(page, rep);
  hottest_section(page, rep);
  estimate_section(page, rep);
  traffic_maps(page, rep);
  return page.str();
}

void write_load_html(const LoadReport& report, const std::string& path) {
  html::write_page(load_html(report), path);
}

}  // namespace dynemb::load
