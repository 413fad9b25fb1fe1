// The HTML report (report.hpp, `replay --html`): the verdict and summary, a rank x batch grid
// of verdicts with each non-passing cell's first mismatch, the mismatches per feature, and the
// plan's differences under --plan. Everything comes from the Report as the JSON report holds
// it (checks, warnings, trouble), so the page says nothing the JSON does not.
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>

#include "html/page.hpp"
#include "replay/report.hpp"

namespace dynemb {

namespace {

// Grid statuses, least to most severe (html::StatusGrid::kinds).
enum Verdict : int { kPass = 0, kSkipped = 1, kMismatch = 2, kError = 3 };

struct Cell {
  int64_t pass = 0, skipped = 0, fail = 0, error = 0;
  int64_t first = -1;  // index in Report::checks of the first failing or error check
  int status() const {
    if (error > 0) return kError;
    if (fail > 0) return kMismatch;
    if (pass > 0) return kPass;
    if (skipped > 0) return kSkipped;
    return -1;
  }
};

// The rank x batch cells: batches replayed (and any other a check names) in order; a check of
// a whole batch (rank -1) counts in every rank of it; checks of no batch are left out.
struct Grid {
  int64_t ranks = 0;
  std::vector<int64_t> batches;
  std::map<int64_t, size_t> column;
  std::vector<Cell> cells;  // [ranks * batches]

  Cell& at(int64_t rank, size_t col) { return cells[size_t(rank) * batches.size() + col]; }
  const Cell& at(int64_t rank, size_t col) const {
    return cells[size_t(rank) * batches.size() + col];
  }

  void add(const CheckResult& c, int64_t index) {
    const auto col = column.find(c.batch);
    if (col == column.end()) return;
    const int64_t r0 = c.rank >= 0 ? c.rank : 0, r1 = c.rank >= 0 ? c.rank + 1 : ranks;
    for (int64_t r = r0; r < std::min(r1, ranks); ++r) {
      Cell& cell = at(r, col->second);
      cell.pass += c.status == CheckStatus::pass;
      cell.skipped += c.status == CheckStatus::skipped;
      cell.fail += c.status == CheckStatus::fail;
      cell.error += c.status == CheckStatus::error;
      if (cell.first < 0 && index >= 0 &&
          (c.status == CheckStatus::fail || c.status == CheckStatus::error))
        cell.first = index;
    }
  }
};

Grid make_grid(const Report& r) {
  Grid g;
  g.ranks = std::max<int64_t>(0, r.info.world_size);
  std::set<int64_t> batches(r.info.batches.begin(), r.info.batches.end());
  for (const CheckResult& c : r.listed_checks())
    if (c.batch >= 0) batches.insert(c.batch);
  g.batches.assign(batches.begin(), batches.end());
  for (size_t i = 0; i < g.batches.size(); ++i) g.column[g.batches[i]] = i;
  g.cells.resize(size_t(g.ranks) * g.batches.size());
  for (size_t i = 0; i < r.checks.size(); ++i) g.add(r.checks[i], int64_t(i));
  for (size_t i = 0; i < r.pass_log.size(); ++i) g.add(r.pass_log.at(i), -1);
  return g;
}

std::string feature_of(const Detail& d) {
  for (const Coord& c : d.where)
    if (c.key == "feature") return c.label.empty() ? std::to_string(c.value) : c.label;
  return "";
}

// "output golden at feature f1, sample 3, ...: replayed 1.5, golden 1.25" (or the message).
std::string first_mismatch(const CheckResult& c) {
  std::string s = c.stage + " " + c.check;
  if (c.details.empty()) return s + ": " + c.message;
  const Detail& d = c.details[0];
  return fmt::format("{} at {}: {} {}, {} {}", s, to_string(d.where), c.got_label, d.got,
                     c.want_label, d.want);
}

const char* kVerdictNames[] = {"pass", "skipped", "mismatch", "error"};

void summary_section(html::Page& p, const Report& r, const Summary& sum) {
  const ReportInfo& i = r.info;
  const int64_t ran = sum.checks - sum.skipped;
  const std::string line = fmt::format(
      "exit {}: {} context, {} lookup, {} output ({} data), {} module mismatches, {} errors; {} "
      "{} ran{}",
      sum.exit_code, sum.context_mismatches, sum.lookup_mismatches, sum.output_mismatches,
      sum.data_mismatches, sum.module_mismatches, sum.errors, ran, ran == 1 ? "check" : "checks",
      sum.skipped > 0 ? fmt::format(", {} skipped", sum.skipped) : "");
  p.banner(sum.exit_code == 0   ? "PASS"
           : sum.exit_code == 1 ? "FAIL"
                                : "ERROR",
           line, sum.exit_code == 0 ? html::Tone::good : html::Tone::bad);
  if (!r.trouble.empty()) p.banner("trouble", r.trouble, html::Tone::bad);
  p.facts(
      {{"capture",
        i.capture.path + (i.capture.sha256.empty() ? "" : "  sha256 " + i.capture.sha256)},
       {"plan", i.plan.path + (i.plan.embedded ? " (embedded in the capture)" : "")},
       {"module", fmt::format("{}, world size {}", i.module, i.world_size)},
       {"batches", fmt::format("{} in the capture, {} replayed", i.num_batches, i.batches.size())},
       {"backend", i.backend + " (" + i.device + ")"},
       {"ctx", i.ctx_mode},
       {"tolerance", i.tolerance},
       {"tool", "dynemb-dist " + i.tool_version}});
  // Checks per stage, as the text summary counts them (a pass kept in pass_log is counted in
  // pass_counts too).
  std::map<std::string, std::array<int64_t, 5>> rows;
  for (const CheckResult& c : r.checks) {
    auto& row = rows[c.stage];
    row[0] += 1;
    row[1 + int(c.status)] += 1;  // pass, fail, error, skipped
  }
  for (const auto& [stage, n] : r.pass_counts) {
    rows[stage][0] += n;
    rows[stage][1] += n;
  }
  html::Table t;
  t.caption = "Checks per stage";
  t.headers = {"stage", "checks", "passed", "failed", "errors", "skipped"};
  t.numeric = {false, true, true, true, true, true};
  for (const auto& [stage, n] : rows)
    t.rows.push_back({stage, html::int_text(n[0]), html::int_text(n[1]), html::int_text(n[2]),
                      html::int_text(n[3]), html::int_text(n[4])});
  t.rows.push_back({"total", html::int_text(sum.checks), html::int_text(sum.passed),
                    html::int_text(sum.failed), html::int_text(sum.errors),
                    html::int_text(sum.skipped)});
  p.table(t);
}

void grid_section(html::Page& p, const Report& r, const Grid& g) {
  p.heading("Verdicts per rank and batch");
  p.paragraph(
      "A cell is a rank's part of a batch: error when a check of it met trouble, mismatch when "
      "a check failed, pass when checks passed, skipped when every check was skipped, not "
      "checked when none ran (a batch not replayed, or after the run stopped). A check of a "
      "whole batch counts in each of its ranks. Hover a cell for its counts and first mismatch.",
      true);
  int64_t counted = 0;
  for (const auto& kv : r.pass_counts) counted += kv.second;
  if (counted > int64_t(r.pass_log.size()))
    p.paragraph("Passes were only counted in this run, so cells show failures alone.", true);
  html::StatusGrid sg;
  sg.title = "Verdict of each rank in each batch";
  sg.rows = g.ranks;
  sg.cols = int64_t(g.batches.size());
  sg.col_ids = g.batches;
  sg.kinds = {
      {"pass", "#43a047"}, {"skipped", "#f9c74f"}, {"mismatch", "#e53935"}, {"error", "#6a1b9a"}};
  sg.status.resize(g.cells.size());
  for (size_t i = 0; i < g.cells.size(); ++i) sg.status[i] = g.cells[i].status();
  sg.tip = [&](int64_t rank, int64_t col) {
    const Cell& c = g.at(rank, size_t(col));
    std::string s = fmt::format("batch {}, rank {}: ", g.batches[size_t(col)], rank);
    if (c.status() < 0) return s + "not checked";
    s += fmt::format("{}; {} passed, {} failed, {} errors, {} skipped", kVerdictNames[c.status()],
                     c.pass, c.fail, c.error, c.skipped);
    if (c.first >= 0) s += "; first: " + first_mismatch(r.checks[size_t(c.first)]);
    return s;
  };
  p.status_grid(sg);
  // The first mismatch of each cell that did not pass.
  constexpr size_t kMaxRows = 1000;
  html::Table t;
  t.caption = "First mismatch of each cell that did not pass";
  t.headers = {"batch", "rank", "verdict",  "check",  "feature",
               "where", "got",  "expected", "message"};
  t.numeric = {true, true, false, false, false, false, true, true, false};
  size_t cells = 0;
  for (int64_t rank = 0; rank < g.ranks; ++rank) {
    for (size_t col = 0; col < g.batches.size(); ++col) {
      const Cell& c = g.at(rank, col);
      if (c.first < 0) continue;
      if (++cells > kMaxRows) continue;
      const CheckResult& ck = r.checks[size_t(c.first)];
      const Detail* d = ck.details.empty() ? nullptr : &ck.details[0];
      t.rows.push_back({std::to_string(g.batches[col]), std::to_string(rank),
                        kVerdictNames[c.status()], ck.stage + " " + ck.check,
                        d ? feature_of(*d) : "", d ? to_string(d->where) : "",
                        d ? ck.got_label + " " + d->got : "",
                        d ? ck.want_label + " " + d->want : "", ck.message});
    }
  }
  std::sort(t.rows.begin(), t.rows.end(), [](const auto& a, const auto& b) {
    return std::make_pair(std::stoll(a[0]), std::stoll(a[1])) <
           std::make_pair(std::stoll(b[0]), std::stoll(b[1]));
  });
  if (cells > kMaxRows)
    t.note = fmt::format("The first {} of {} cells; the text and JSON reports list every check.",
                         kMaxRows, cells);
  if (cells == 0) {
    p.paragraph("Every cell that was checked passed.");
  } else {
    t.fold_after = 40;
    p.table(t);
  }
}

// Mismatches per feature: the failing checks with a listed difference in it, and the listed
// differences (the first --max-mismatches of each check; the check's count has them all).
void feature_section(html::Page& p, const Report& r) {
  std::map<std::string, std::pair<int64_t, int64_t>> per;  // feature -> (checks, differences)
  int64_t failing = 0, listed = 0, counted = 0;
  for (const CheckResult& c : r.checks) {
    if (c.status != CheckStatus::fail) continue;
    ++failing;
    counted += c.mismatches;
    std::set<std::string> seen;
    for (const Detail& d : c.details) {
      std::string f = feature_of(d);
      if (f.empty()) f = "(no feature: " + c.stage + " " + c.check + ")";
      per[f].second += 1;
      ++listed;
      if (seen.insert(f).second) per[f].first += 1;
    }
    if (c.details.empty()) per["(no listed difference)"].first += 1;
  }
  p.heading("Mismatches per feature");
  if (failing == 0) {
    p.paragraph("No check failed.");
    return;
  }
  p.paragraph(fmt::format("{} failing {} with {} differing elements in all; {} differences "
                          "are listed with their coordinates (the first --max-mismatches of "
                          "each check), and the counts below are of those.",
                          failing, failing == 1 ? "check" : "checks", counted, listed),
              true);
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> v(per.begin(), per.end());
  std::stable_sort(v.begin(), v.end(),
                   [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  constexpr size_t kMaxFeatures = 64;
  html::BarChart bc;
  bc.title = "Failing checks and listed differences per feature";
  bc.category_name = "feature";
  bc.value_name = "count";
  bc.series = {{"failing checks", {}}, {"listed differences", {}}};
  for (size_t i = 0; i < v.size() && i < kMaxFeatures; ++i) {
    bc.categories.push_back(v[i].first);
    bc.series[0].values.push_back(double(v[i].second.first));
    bc.series[1].values.push_back(double(v[i].second.second));
  }
  p.bar_chart(bc);
  if (v.size() > kMaxFeatures)
    p.paragraph(fmt::format("The {} features with the most listed differences of {}.", kMaxFeatures,
                            v.size()),
                true);
}

// Under --plan: what differs from the capture's plan (replay_setup's warnings).
void plan_section(html::Page& p, const Report& r) {
  if (r.info.plan.embedded) return;
  const std::string prefix = "--plan differs from the capture's plan: ";
  html::Table t;
  t.caption = "Differences of --plan from the capture's plan";
  t.headers = {"key", "capture", "--plan"};
  for (const std::string& w : r.warnings) {
    if (w.rfind(prefix, 0) != 0) continue;
    const std::string d = w.substr(prefix.size());
    const size_t colon = d.find(": "), arrow = d.find(" (capture) -> ");
    if (colon == std::string::npos || arrow == std::string::npos || arrow < colon) {
      t.rows.push_back({d, "", ""});
      continue;
    }
    std::string other = d.substr(arrow + 14);
    if (other.size() >= 9 && other.compare(other.size() - 9, 9, " (--plan)") == 0)
      other.resize(other.size() - 9);
    t.rows.push_back({d.substr(0, colon), d.substr(colon + 2, arrow - colon - 2), other});
  }
  p.heading("The plan (--plan)");
  if (t.rows.empty()) {
    p.paragraph("--plan " + r.info.plan.path +
                " shards as the capture's plan does (or the capture's plan could not be read).");
    return;
  }
  p.table(t);
}

}  // namespace

std::string html_report(const Report& r) {
  const Summary sum = r.summary();
  html::Page p("dynemb-dist replay: " + r.info.capture.path);
  summary_section(p, r, sum);
  const Grid g = make_grid(r);
  grid_section(p, r, g);
  feature_section(p, r);
  plan_section(p, r);
  // Failures not tied to a batch (opening the capture, the plan).
  std::vector<std::string> run_level;
  for (const CheckResult& c : r.checks)
    if (c.batch < 0 && (c.status == CheckStatus::fail || c.status == CheckStatus::error))
      run_level.push_back(std::string(to_string(c.status)) + ": " + c.stage + " " + c.check + ": " +
                          c.message);
  if (!run_level.empty()) {
    p.heading("Checks of the run as a whole");
    p.list(run_level);
  }
  if (!r.warnings.empty()) {
    p.heading("Warnings");
    p.list(r.warnings);
  }
  return p.str();
}

}  // namespace dynemb
