// lib/html: escaping, blocks of ranks, and the charts' cell counts and tables.
#include <doctest/doctest.h>

#include <string>

#include "html/page.hpp"

using namespace dynemb::html;

namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

// The part of `page` from the first `<svg class="CLS"` to its `</svg>`.
std::string svg_of(const std::string& page, const std::string& cls) {
  const size_t a = page.find("<svg class=\"" + cls + "\"");
  REQUIRE(a != std::string::npos);
  const size_t b = page.find("</svg>", a);
  return page.substr(a, b - a);
}

}  // namespace

TEST_CASE("esc: HTML metacharacters, control characters and invalid UTF-8 become text") {
  CHECK(esc("a<b>&\"'") == "a&lt;b&gt;&amp;&quot;&#39;");
  CHECK(esc("</title><script>x</script>") == "&lt;/title&gt;&lt;script&gt;x&lt;/script&gt;");
  CHECK(esc(std::string("t\xff\x01") + "\n") == "t\\xff\\x01\\n");
  CHECK(esc("caf\xc3\xa9") == "caf\xc3\xa9");  // well-formed UTF-8 kept
}

TEST_CASE("numbers") {
  CHECK(int_text(0) == "0");
  CHECK(int_text(1234567) == "1,234,567");
  CHECK(int_text(-1000) == "-1,000");
  CHECK(bytes_text(512) == "512 B");
  CHECK(bytes_text(1536) == "1.50 KiB");
  CHECK(bytes_text(3.0 * 1024 * 1024 * 200) == "600 MiB");
}

TEST_CASE("Blocks: at most max_blocks, labelled by their ranks") {
  const Blocks small(8, 64);
  CHECK(small.size == 1);
  CHECK(small.count == 8);
  CHECK(small.label(3, "rank") == "rank 3");
  const Blocks big(1024, 64);
  CHECK(big.size == 16);
  CHECK(big.count == 64);
  CHECK(big.label(0, "rank") == "ranks 0-15");
  CHECK(big.label(63, "rank") == "ranks 1008-1023");
  const Blocks odd(65, 64);  // blocks of 2, the last one alone
  CHECK(odd.count == 33);
  CHECK(odd.label(32, "rank") == "rank 64");
  CHECK(odd.range(32) == "64");
  CHECK(odd.range(1) == "2-3");
  CHECK(Blocks(100, 64).label(1, "batch", std::vector<int64_t>(100, 7)) == "batches 7-7");
}

TEST_CASE("a page is self-contained: CSP, no script, escaped title") {
  Page p("report <of> \xfe");
  p.paragraph("<img src=x onerror=alert(1)>");
  const std::string s = p.str();
  CHECK(s.find("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
               "style-src 'unsafe-inline'; img-src data:\">") != std::string::npos);
  CHECK(s.find("<script") == std::string::npos);
  CHECK(s.find("<img") == std::string::npos);
  CHECK(s.find("&lt;img src=x onerror=alert(1)&gt;") != std::string::npos);
  CHECK(s.find("report &lt;of&gt; \\xfe") != std::string::npos);
}

TEST_CASE("heat map: W = 1024 draws 64 x 64 cells, summed, with a legend and a table") {
  HeatMap h;
  h.title = "traffic";
  h.n = 1024;
  h.cells.assign(size_t(1024 * 1024), 1.0);
  h.cells[size_t(5 * 1024 + 1000)] = 1001;  // block (0, 62)
  Page p("t");
  p.heat_map(h);
  const std::string s = p.str();
  const std::string svg = svg_of(s, "heat");
  CHECK(count(svg, "<title>") == 1 + 64 * 64);  // the chart's own, then one per cell
  CHECK(svg.find("<title>ranks 0-15 \u2192 ranks 992-1007: 1,256</title>") != std::string::npos);
  CHECK(svg.find("<title>ranks 16-31 \u2192 ranks 0-15: 256</title>") != std::string::npos);
  // The table under it: 64 rows of blocks, folded.
  CHECK(s.find("<details><summary>traffic: the numbers") != std::string::npos);
  CHECK(count(s, "<tr><td>ranks ") == 64);
}

TEST_CASE("heat map: a small one is drawn cell by cell") {
  HeatMap h;
  h.title = "t";
  h.n = 3;
  h.cells = {0, 1, 2, 3, 0, 5, 6, 7, 0};
  Page p("t");
  p.heat_map(h);
  const std::string svg = svg_of(p.str(), "heat");
  CHECK(count(svg, "<title>") == 10);
  CHECK(svg.find("<title>2 \u2192 1: 7</title>") != std::string::npos);
  CHECK(svg.find("fill=\"#eeeeee\"><title>0 \u2192 0: 0") != std::string::npos);
  CHECK(svg.find("fill=\"#0c2c84\"><title>2 \u2192 1: 7") != std::string::npos);
  // The scale runs from the smallest nonzero cell (1, the lightest) to the largest (7).
  CHECK(svg.find("fill=\"#ffffd9\"><title>0 \u2192 1: 1") != std::string::npos);
  CHECK(svg.find(">1 \u2013 2<") != std::string::npos);
  CHECK(svg.find(">6 \u2013 7<") != std::string::npos);
}

TEST_CASE("status grid: aggregated blocks show the worst status and count them all") {
  StatusGrid g;
  g.title = "verdicts";
  g.rows = 128;
  g.cols = 100;
  g.kinds = {{"pass", "#2e7d32"}, {"mismatch", "#c62828"}};
  g.status.assign(size_t(g.rows * g.cols), 0);
  g.status[size_t(3 * 100 + 5)] = 1;  // rank 3, batch 5: block (ranks 2-3, batches 4-5)
  g.status[size_t(127 * 100 + 99)] = -1;
  for (int64_t c = 0; c < 100; ++c) g.col_ids.push_back(c + 1000);
  Page p("t");
  p.status_grid(g);
  const std::string svg = svg_of(p.str(), "grid");
  CHECK(count(svg, "</title></rect>") == 64 * 50);
  CHECK(svg.find("<title>ranks 2-3, batches 1004-1005: 3 pass, 1 mismatch</title>") !=
        std::string::npos);
  CHECK(svg.find("<title>ranks 126-127, batches 1098-1099: 1 not checked, 3 pass</title>") !=
        std::string::npos);
}

TEST_CASE("status grid: small grids use the caller's tooltip") {
  StatusGrid g;
  g.title = "v";
  g.rows = 2;
  g.cols = 2;
  g.kinds = {{"pass", "#0f0"}};
  g.status = {0, 0, -1, 0};
  g.tip = [](int64_t r, int64_t c) {
    return "cell <" + std::to_string(r) + std::to_string(c) + ">";
  };
  Page p("t");
  p.status_grid(g);
  const std::string svg = svg_of(p.str(), "grid");
  CHECK(svg.find("<title>cell &lt;10&gt;</title>") != std::string::npos);
  CHECK(count(svg, "</title></rect>") == 4);
}

TEST_CASE("bar chart: one bar per series and category, and the numbers table") {
  BarChart c;
  c.title = "ids per rank";
  c.category_name = "rank";
  c.value_name = "ids";
  c.categories = {"rank 0", "rank 1"};
  c.series = {{"captured", {10, 20}}, {"balanced", {15, 15}}};
  Page p("t");
  p.bar_chart(c);
  const std::string s = p.str();
  const std::string svg = svg_of(s, "bars");
  CHECK(svg.find("<title>rank 1, captured: 20</title>") != std::string::npos);
  CHECK(svg.find("<title>rank 0, balanced: 15</title>") != std::string::npos);
  CHECK(s.find("<tr><td>rank 1</td><td>20</td><td>15</td></tr>") != std::string::npos);
}

TEST_CASE("bar chart: the value axis steps by nice numbers, of KiB for bytes") {
  BarChart c;
  c.title = "bytes";
  c.categories = {"a"};
  c.series = {{"s", {645120}}};
  c.format = [](double v) { return bytes_text(v); };
  c.bytes = true;
  Page p("t");
  p.bar_chart(c);
  const std::string svg = svg_of(p.str(), "bars");
  for (const char* tick : {">0 B<", ">200 KiB<", ">400 KiB<", ">600 KiB<", ">800 KiB<"})
    CHECK(svg.find(tick) != std::string::npos);
  BarChart n;
  n.title = "ids";
  n.categories = {"a"};
  n.series = {{"s", {3}}};
  Page q("t");
  q.bar_chart(n);
  const std::string s2 = svg_of(q.str(), "bars");
  for (const char* tick : {">0<", ">1<", ">2<", ">3<", ">4<"})
    CHECK(s2.find(tick) != std::string::npos);
}
