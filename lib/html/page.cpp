#include "html/page.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

#include "common/output_file.hpp"
#include "common/safe_text.hpp"

namespace dynemb::html {

std::string esc(std::string_view s) {
  const std::string safe = needs_escape(s) ? escape_field(s) : std::string(s);
  std::string out;
  out.reserve(safe.size());
  for (const char c : safe) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 5) {
    b /= 1024;
    ++u;
  }
  if (u == 0) return fmt::format("{:.0f} B", b);
  const int digits = std::fabs(b) >= 100 ? 0 : std::fabs(b) >= 10 ? 1 : 2;
  return fmt::format("{:.{}f} {}", b, digits, units[u]);
}

std::string int_text(int64_t v) {
  std::string d = std::to_string(v < 0 ? -(v + 1) + uint64_t{1} : uint64_t(v));
  std::string out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string ratio_text(double v) {
  return fmt::format("{:.{}f}", v, v >= 100 ? 0 : v >= 10 ? 1 : 2);
}

std::string plural(std::string_view noun) {
  const bool es = noun.size() >= 2 && (noun.substr(noun.size() - 2) == "ch" || noun.back() == 's' ||
                                       noun.back() == 'x');
  return std::string(noun) + (es ? "es" : "s");
}

Blocks::Blocks(int64_t items, int64_t max_blocks) : n(items) {
  max_blocks = std::max<int64_t>(1, max_blocks);
  size = std::max<int64_t>(1, (n + max_blocks - 1) / max_blocks);
  count = (n + size - 1) / size;
}

std::string Blocks::label(int64_t b, std::string_view noun) const {
  if (end(b) - begin(b) == 1) return fmt::format("{} {}", noun, begin(b));
  return fmt::format("{} {}-{}", plural(noun), begin(b), end(b) - 1);
}

std::string Blocks::label(int64_t b, std::string_view noun, const std::vector<int64_t>& ids) const {
  if (ids.empty()) return label(b, noun);
  const int64_t first = ids[size_t(begin(b))], last = ids[size_t(end(b) - 1)];
  if (end(b) - begin(b) == 1) return fmt::format("{} {}", noun, first);
  return fmt::format("{} {}-{}", plural(noun), first, last);
}

std::string Blocks::range(int64_t b, const std::vector<int64_t>& ids) const {
  const int64_t first = ids.empty() ? begin(b) : ids[size_t(begin(b))];
  const int64_t last = ids.empty() ? end(b) - 1 : ids[size_t(end(b) - 1)];
  return end(b) - begin(b) == 1 ? std::to_string(first) : fmt::format("{}-{}", first, last);
}

namespace {

const char* kSeriesColors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759",
                               "#b07aa1", "#76b7b2", "#edc948", "#9c755f"};

// A sequential scale (light yellow to dark blue) for the heat maps; zero has its own grey.
const char* kHeat[] = {"#ffffd9", "#edf8b1", "#c7e9b4", "#7fcdbb",
                       "#41b6c4", "#1d91c0", "#225ea8", "#0c2c84"};
constexpr int kHeatSteps = 8;
const char* kZero = "#eeeeee";

std::string value_text(const std::function<std::string(double)>& f, double v) {
  return f ? f(v) : int_text(static_cast<int64_t>(std::llround(v)));
}

// Axis and legend text; escaped.
std::string svg_text(double x, double y, std::string_view s, std::string_view extra = "") {
  return fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\"{}>{}</text>", x, y,
                     extra.empty() ? "" : " " + std::string(extra), esc(s));
}

const char* kStyle = R"(
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1d1d1f;
background:#fff;margin:0 auto;max-width:1180px;padding:24px 32px}
h1{font-size:26px;margin:0 0 12px}h2{font-size:20px;margin:36px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:16px;margin:20px 0 6px}
p.muted{color:#666;font-size:13px}
.banner{display:flex;align-items:baseline;gap:16px;padding:14px 18px;border-radius:8px;margin:8px 0 16px}
.banner b{font-size:24px;letter-spacing:.04em}
.good{background:#e6f4ea;border:1px solid #2e7d32}.good b{color:#1b5e20}
.bad{background:#fdecea;border:1px solid #c62828}.bad b{color:#b71c1c}
.warn{background:#fff8e1;border:1px solid #f9a825}.warn b{color:#8d6e00}
.neutral{background:#f3f3f3;border:1px solid #999}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:8px 0}
dl.facts dt{color:#555}dl.facts dd{margin:0;overflow-wrap:anywhere}
figure.chart{margin:12px 0 20px;overflow-x:auto}figure.chart figcaption{font-weight:600;margin:4px 0}
svg{font:11px system-ui,"DejaVu Sans",sans-serif;fill:#333}
svg text.ax{fill:#555}svg line{stroke:#ccc}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #ddd;padding:2px 8px;text-align:left;vertical-align:top}
th{background:#f5f5f5}td.n,table.num td+td{text-align:right;font-variant-numeric:tabular-nums}
caption{text-align:left;font-weight:600;padding:4px 0;white-space:nowrap}
details{margin:6px 0}summary{cursor:pointer;color:#345}
code{font-size:13px}
)";

}  // namespace

Page::Page(std::string title) : title_(std::move(title)) {
  body_ = "<h1>" + esc(title_) + "</h1>\n";
}

void Page::heading(std::string_view text, int level) {
  level = std::clamp(level, 2, 4);
  body_ += fmt::format("<h{0}>{1}</h{0}>\n", level, esc(text));
}

void Page::paragraph(std::string_view text, bool muted) {
  body_ += fmt::format("<p{}>{}</p>\n", muted ? " class=\"muted\"" : "", esc(text));
}

void Page::banner(std::string_view word, std::string_view line, Tone tone) {
  const char* cls = tone == Tone::good   ? "good"
                    : tone == Tone::bad  ? "bad"
                    : tone == Tone::warn ? "warn"
                                         : "neutral";
  body_ += fmt::format("<div class=\"banner {}\"><b>{}</b><span>{}</span></div>\n", cls, esc(word),
                       esc(line));
}

void Page::facts(const std::vector<std::pair<std::string, std::string>>& kv) {
  body_ += "<dl class=\"facts\">\n";
  for (const auto& [k, v] : kv) body_ += fmt::format("<dt>{}</dt><dd>{}</dd>\n", esc(k), esc(v));
  body_ += "</dl>\n";
}

void Page::list(const std::vector<std::string>& items) {
  body_ += "<ul>\n";
  for (const std::string& s : items) body_ += "<li>" + esc(s) + "</li>\n";
  body_ += "</ul>\n";
}

void Page::table(const Table& t) {
  std::string s;
  const bool fold = t.fold_after > 0 && t.rows.size() > t.fold_after;
  if (fold)
    s += fmt::format("<details><summary>{} ({} rows)</summary>\n", esc(t.caption), t.rows.size());
  // A table whose columns after the first are all numbers is right-aligned by one class (the
  // heat maps' tables have thousands of cells), others cell by cell.
  bool all_numeric = t.numeric.size() >= 2;
  for (size_t i = 1; i < t.numeric.size(); ++i) all_numeric &= bool(t.numeric[i]);
  all_numeric &= t.numeric.empty() || !t.numeric[0];
  s += all_numeric ? "<table class=\"num\">" : "<table>";
  if (!fold && !t.caption.empty()) s += "<caption>" + esc(t.caption) + "</caption>";
  s += "\n<tr>";
  for (const std::string& h : t.headers) s += "<th>" + esc(h) + "</th>";
  s += "</tr>\n";
  for (const auto& row : t.rows) {
    s += "<tr>";
    for (size_t i = 0; i < row.size(); ++i) {
      const bool num = !all_numeric && i < t.numeric.size() && t.numeric[i];
      s += (num ? "<td class=\"n\">" : "<td>") + esc(row[i]) + "</td>";
    }
    s += "</tr>\n";
  }
  s += "</table>\n";
  if (!t.note.empty()) s += "<p class=\"muted\">" + esc(t.note) + "</p>\n";
  if (fold) s += "</details>\n";
  body_ += s;
}

void Page::bar_chart(const BarChart& c) {
  const size_t ncat = c.categories.size(), nser = std::max<size_t>(1, c.series.size());
  double top_value = 0;
  for (const Series& s : c.series)
    for (const double v : s.values) top_value = std::max(top_value, v);
  // The axis runs to 4 nice steps (1, 2, 2.5 or 5 times a power of ten; at least 1, values
  // being counts or bytes) at or above the largest bar.
  double step = 1;
  if (top_value > 4) {
    // Bytes step by nice numbers of KiB, MiB, ... (the labels then read 256 KiB, 512 KiB).
    double unit = 1;
    while (c.bytes && top_value / 4 >= unit * 1024) unit *= 1024;
    const double raw = top_value / 4 / unit;
    const double p10 = std::pow(10.0, std::floor(std::log10(raw))) * unit;
    step = p10 * 10;
    for (const double m : {1.0, 2.0, 2.5, 5.0})
      if (m * p10 >= raw * unit) {
        step = m * p10;
        break;
      }
  }
  const double vmax = 4 * step;
  // Geometry: the plot about 1000 px wide (bars of 1.5 to 16 px), groups separated by a third
  // of a group, 240 px high.
  const double bar = std::clamp(750.0 / double(std::max<size_t>(1, ncat * nser)), 1.5, 16.0);
  const double group = bar * double(nser), gap = std::max(2.0, group / 3);
  const double left = 70, top = 28, plot_h = 240, bottom = 90;
  const double plot_w = double(ncat) * (group + gap) + gap;
  double legend_w = left;
  for (const Series& ser : c.series) legend_w += 30 + 7.0 * double(ser.name.size());
  const double width = std::max(left + plot_w + 20, legend_w), height = top + plot_h + bottom;
  std::string s = fmt::format(
      "<figure class=\"chart\"><figcaption>{}</figcaption>\n<svg class=\"bars\" "
      "xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" role=\"img\">"
      "<title>{}</title>\n",
      esc(c.title), width, height, esc(c.title));
  // Legend (series) along the top.
  double lx = left;
  for (size_t k = 0; k < c.series.size(); ++k) {
    s += fmt::format("<rect x=\"{:.0f}\" y=\"6\" width=\"12\" height=\"12\" fill=\"{}\"/>", lx,
                     kSeriesColors[k % 8]);
    s += svg_text(lx + 16, 16, c.series[k].name);
    lx += 30 + 7.0 * double(c.series[k].name.size());
  }
  // Grid lines and the value axis.
  for (int g = 0; g <= 4; ++g) {
    const double y = top + plot_h - plot_h * g / 4.0;
    s += fmt::format("<line x1=\"{:.0f}\" x2=\"{:.0f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>", left,
                     left + plot_w, y, y);
    s += svg_text(left - 6, y + 4, value_text(c.format, vmax * g / 4.0),
                  "class=\"ax\" text-anchor=\"end\"");
  }
  s += svg_text(
      12, top + plot_h / 2, c.value_name,
      fmt::format("class=\"ax\" transform=\"rotate(-90 12 {:.0f})\" text-anchor=\"middle\"",
                  top + plot_h / 2));
  // Every category label when they fit, else every k-th.
  const size_t every = std::max<size_t>(1, size_t(std::ceil(14.0 / (group + gap))));
  for (size_t i = 0; i < ncat; ++i) {
    const double gx = left + gap + double(i) * (group + gap);
    for (size_t k = 0; k < c.series.size(); ++k) {
      const double v = i < c.series[k].values.size() ? c.series[k].values[i] : 0;
      const double h = vmax > 0 ? plot_h * v / vmax : 0;
      s += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\">"
          "<title>{}, {}: {}</title></rect>",
          gx + bar * double(k), top + plot_h - h, bar, std::max(h, 0.5), kSeriesColors[k % 8],
          esc(c.categories[i]), esc(c.series[k].name), esc(value_text(c.format, v)));
    }
    s += "\n";
    if (i % every == 0) {
      const double tx = gx + group / 2, ty = top + plot_h + 12;
      s += svg_text(tx, ty, c.categories[i],
                    fmt::format("class=\"ax\" text-anchor=\"end\" transform=\"rotate(-45 {:.1f} "
                                "{:.1f})\"",
                                tx, ty));
    }
  }
  s += "</svg></figure>\n";
  body_ += s;
  ++charts_;
  Table t;
  t.caption = c.title + ": the numbers";
  t.headers.push_back(c.category_name);
  t.numeric.push_back(false);
  for (const Series& ser : c.series) {
    t.headers.push_back(ser.name);
    t.numeric.push_back(true);
  }
  for (size_t i = 0; i < ncat; ++i) {
    std::vector<std::string> row{c.categories[i]};
    for (const Series& ser : c.series)
      row.push_back(value_text(c.format, i < ser.values.size() ? ser.values[i] : 0));
    t.rows.push_back(std::move(row));
  }
  t.fold_after = 16;
  table(t);
}

void Page::heat_map(const HeatMap& h) {
  const Blocks b(h.n, h.max_side);
  std::vector<double> agg(size_t(b.count * b.count), 0);
  for (int64_t r = 0; r < h.n; ++r)
    for (int64_t c = 0; c < h.n; ++c)
      agg[size_t((r / b.size) * b.count + c / b.size)] += h.cells[size_t(r * h.n + c)];
  // The colors span the smallest to the largest nonzero cell, so that a nearly even matrix
  // (all-to-all traffic often is) shows its differences; 0 has its own grey. All cells equal:
  // the middle color.
  double vmax = 0, vmin = 0;
  for (const double v : agg) {
    vmax = std::max(vmax, v);
    if (v > 0 && (vmin == 0 || v < vmin)) vmin = v;
  }
  const double span = vmax - vmin;
  const auto step = [&](double v) {
    if (v <= 0 || vmax <= 0) return -1;
    if (span <= 0) return kHeatSteps / 2;
    return std::min(kHeatSteps - 1, int((v - vmin) / span * kHeatSteps));
  };
  const double cell =
      std::clamp(std::floor(512.0 / double(std::max<int64_t>(1, b.count))), 6.0, 40.0);
  const double left = 64, top = 40, side = cell * double(b.count);
  const double width = left + side + 190, height = top + side + 30;
  std::string s = fmt::format(
      "<figure class=\"chart\"><figcaption>{}</figcaption>\n<svg class=\"heat\" "
      "xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" role=\"img\">"
      "<title>{}</title>\n",
      esc(h.title), width, height, esc(h.title));
  s += svg_text(left + side / 2, 14, fmt::format("{} ({}) \u2192", h.col_role, plural(h.col_noun)),
                "class=\"ax\" text-anchor=\"middle\"");
  s +=
      svg_text(14, top + side / 2, fmt::format("{} ({}) \u2192", h.row_role, plural(h.row_noun)),
               fmt::format("class=\"ax\" text-anchor=\"middle\" transform=\"rotate(90 14 {:.0f})\"",
                           top + side / 2));
  const int64_t every = std::max<int64_t>(1, int64_t(std::ceil(18.0 / cell)));
  for (int64_t i = 0; i < b.count; i += every) {
    const std::string first = std::to_string(b.begin(i));
    s += svg_text(left + cell * (double(i) + 0.5), top - 6, first,
                  "class=\"ax\" text-anchor=\"middle\"");
    s += svg_text(left - 4, top + cell * (double(i) + 0.5) + 4, first,
                  "class=\"ax\" text-anchor=\"end\"");
  }
  // Every cell is a <use> of one square (its fill inherited), a third smaller than a <rect>:
  // a 64 x 64 map is 4096 of them. Tooltips say "12 \u2192 5" for single ranks (the axes name
  // them), "ranks 0-15 \u2192 ranks 16-31" for blocks.
  const std::string id = fmt::format("hc{}", charts_);
  s += fmt::format("<defs><rect id=\"{}\" width=\"{:.0f}\" height=\"{:.0f}\"/></defs>\n", id, cell,
                   cell);
  const auto name = [&](int64_t i, const std::string& noun) {
    return b.size == 1 ? std::to_string(i) : b.label(i, noun);
  };
  for (int64_t r = 0; r < b.count; ++r) {
    for (int64_t c = 0; c < b.count; ++c) {
      const double v = agg[size_t(r * b.count + c)];
      const int k = step(v);
      s += fmt::format(
          "<use href=\"#{}\" x=\"{:.0f}\" y=\"{:.0f}\" fill=\"{}\"><title>{} \u2192 {}: "
          "{}</title></use>",
          id, left + cell * double(c), top + cell * double(r), k < 0 ? kZero : kHeat[k],
          esc(name(r, h.row_noun)), esc(name(c, h.col_noun)), esc(value_text(h.format, v)));
    }
    s += "\n";
  }
  // Legend: the scale's steps with the range each covers.
  const double lx = left + side + 24;
  s += svg_text(lx, top + 4, "scale", "class=\"ax\"");
  for (int k = -1; k < kHeatSteps; ++k) {
    if (k >= 0 && span <= 0 && k != kHeatSteps / 2) continue;
    const double y = top + 12 + 18.0 * (k + 1);
    s += fmt::format(
        "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"14\" height=\"14\" fill=\"{}\" "
        "stroke=\"#999\" stroke-width=\"0.5\"/>",
        lx, y, k < 0 ? kZero : kHeat[k]);
    const std::string range =
        k < 0 ? "0"
        : span <= 0
            ? value_text(h.format, vmax)
            : fmt::format("{} \u2013 {}", value_text(h.format, vmin + span * k / kHeatSteps),
                          value_text(h.format, vmin + span * (k + 1) / kHeatSteps));
    s += svg_text(lx + 20, y + 11, range);
  }
  s += "</svg></figure>\n";
  body_ += s;
  ++charts_;
  Table t;
  t.caption = h.title + ": the numbers (" + h.row_role + " a row, " + h.col_role + " a column)";
  t.headers.push_back("");
  t.numeric.push_back(false);
  for (int64_t c = 0; c < b.count; ++c) {
    t.headers.push_back(b.range(c));
    t.numeric.push_back(true);
  }
  for (int64_t r = 0; r < b.count; ++r) {
    std::vector<std::string> row{b.label(r, h.row_noun)};
    for (int64_t c = 0; c < b.count; ++c)
      row.push_back(value_text(h.format, agg[size_t(r * b.count + c)]));
    t.rows.push_back(std::move(row));
  }
  t.fold_after = 8;
  table(t);
}

void Page::status_grid(const StatusGrid& g) {
  const Blocks rb(g.rows, g.max_side), cb(g.cols, g.max_side);
  const size_t nk = g.kinds.size();
  // counts[(block) * (nk + 1) + kind + 1]: slot 0 counts cells of no status.
  std::vector<int64_t> counts(size_t(rb.count * cb.count) * (nk + 1), 0);
  for (int64_t r = 0; r < g.rows; ++r)
    for (int64_t c = 0; c < g.cols; ++c) {
      const int st = g.status[size_t(r * g.cols + c)];
      counts[size_t((r / rb.size) * cb.count + c / cb.size) * (nk + 1) + size_t(st + 1)] += 1;
    }
  const auto worst = [&](int64_t blk) {
    for (size_t k = nk; k > 0; --k)
      if (counts[size_t(blk) * (nk + 1) + k] > 0) return int(k) - 1;
    return -1;
  };
  const auto summary = [&](int64_t blk) {
    std::string s;
    for (size_t k = 0; k <= nk; ++k) {
      const int64_t n = counts[size_t(blk) * (nk + 1) + k];
      if (n == 0) continue;
      s += fmt::format("{}{} {}", s.empty() ? "" : ", ", n,
                       k == 0 ? g.none_name : g.kinds[k - 1].name);
    }
    return s;
  };
  const bool whole = rb.size == 1 && cb.size == 1;
  const double cell = std::clamp(640.0 / double(std::max<int64_t>(1, cb.count)), 6.0, 28.0);
  const double left = 96, top = 44;
  const double width = left + cell * double(cb.count) + 20;
  const double height = top + cell * double(rb.count) + 40;
  double legend_w = left + 37 + 7.0 * double(g.none_name.size());
  for (const StatusKind& k : g.kinds) legend_w += 30 + 7.0 * double(k.name.size());
  std::string s = fmt::format(
      "<figure class=\"chart\"><figcaption>{}</figcaption>\n<svg class=\"grid\" "
      "xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" role=\"img\">"
      "<title>{}</title>\n",
      esc(g.title), std::max(width, legend_w), height, esc(g.title));
  // Legend along the top.
  double lx = left;
  for (int k = -1; k < int(nk); ++k) {
    const std::string& name = k < 0 ? g.none_name : g.kinds[size_t(k)].name;
    s += fmt::format("<rect x=\"{:.0f}\" y=\"4\" width=\"12\" height=\"12\" fill=\"{}\"/>", lx,
                     k < 0 ? "#e0e0e0" : g.kinds[size_t(k)].color.c_str());
    s += svg_text(lx + 16, 14, name);
    lx += 30 + 7.0 * double(name.size());
  }
  s += svg_text(left, top - 10,
                cb.size == 1 ? plural(g.col_noun) + " \u2192" : g.col_noun + " blocks \u2192",
                "class=\"ax\"");
  const int64_t every_c = std::max<int64_t>(1, int64_t(std::ceil(24.0 / cell)));
  const int64_t every_r = std::max<int64_t>(1, int64_t(std::ceil(12.0 / cell)));
  for (int64_t r = 0; r < rb.count; ++r) {
    if (r % every_r == 0)
      s += svg_text(left - 4, top + cell * (double(r) + 0.5) + 4,
                    rb.label(r, g.row_noun, g.row_ids), "class=\"ax\" text-anchor=\"end\"");
    for (int64_t c = 0; c < cb.count; ++c) {
      const int64_t blk = r * cb.count + c;
      const int st = worst(blk);
      std::string tip;
      if (whole && g.tip) {
        tip = g.tip(r, c);
      } else {
        tip = fmt::format("{}, {}: {}", rb.label(r, g.row_noun, g.row_ids),
                          cb.label(c, g.col_noun, g.col_ids), summary(blk));
      }
      s += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" "
          "stroke=\"#fff\" stroke-width=\"{}\"><title>{}</title></rect>",
          left + cell * double(c), top + cell * double(r), cell, cell,
          st < 0 ? "#e0e0e0" : g.kinds[size_t(st)].color.c_str(), cell >= 10 ? 1 : 0.5, esc(tip));
    }
    s += "\n";
  }
  for (int64_t c = 0; c < cb.count; c += every_c) {
    const std::string lab = g.col_ids.empty() ? std::to_string(cb.begin(c))
                                              : std::to_string(g.col_ids[size_t(cb.begin(c))]);
    s += svg_text(left + cell * (double(c) + 0.5), top + cell * double(rb.count) + 14, lab,
                  "class=\"ax\" text-anchor=\"middle\"");
  }
  s += "</svg></figure>\n";
  body_ += s;
  ++charts_;
  Table t;
  t.caption = g.title + ": the cells (" + g.row_noun + " a row, " + g.col_noun + " a column" +
              (whole ? "" : "; a block shows its worst status") + ")";
  t.headers.push_back("");
  t.numeric.push_back(false);
  for (int64_t c = 0; c < cb.count; ++c) {
    t.headers.push_back(cb.range(c, g.col_ids));
    t.numeric.push_back(false);
  }
  for (int64_t r = 0; r < rb.count; ++r) {
    std::vector<std::string> row{rb.label(r, g.row_noun, g.row_ids)};
    for (int64_t c = 0; c < cb.count; ++c) {
      const int st = worst(r * cb.count + c);
      row.push_back(st < 0 ? "-" : g.kinds[size_t(st)].name);
    }
    t.rows.push_back(std::move(row));
  }
  t.fold_after = 8;
  table(t);
}

std::string Page::str() const {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
         "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
         "style-src 'unsafe-inline'; img-src data:\">\n"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
         "<title>" +
         esc(title_) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n" + body_ +
         "</body>\n</html>\n";
}

void write_page(const std::string& page, const std::string& path) {
  OutputFile f(path);
  f.write(page);
  f.commit();
}

}  // namespace dynemb::html
