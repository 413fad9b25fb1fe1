// The load report's page (lib/load/load_html.cpp) from LoadReports built by hand: the per-rank
// bars, imbalance, hottest rank and estimates say the report's numbers; the heat maps stay at
// most 64 x 64; the text is escaped; the file is written through a temporary.
//
// With DYNEMB_LOAD_HTML_DIR set, the "pages for the browser" case writes load-w8.html and
// load-w1024.html there (tests/cli/test_html_report.sh opens them).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <filesystem>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "load/load_html.hpp"

using namespace dynemb;
using namespace dynemb::load;

namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

Plan make_plan(int64_t w, int tables) {
  Plan p;
  p.world_size = w;
  for (int t = 0; t < tables; ++t) {
    TableConfig tc;
    tc.name = "t" + std::to_string(t);
    tc.num_embeddings = 1000;
    tc.embedding_dim = 16;
    tc.features = {"f" + std::to_string(t)};
    p.tables.push_back(tc);
  }
  return p;
}

// A plan's load over `batches` batches: table t sends (t + 1) * (r + 1) ids to rank r per
// batch, except that `hot` gets `extra` more of table 0; traffic s -> d is 8 * (s + 2 * d + 1)
// bytes per batch on the input dist and 64 times that on the output dist.
PlanLoad make_load(const std::string& name, int64_t w, int tables, int64_t batches, int64_t hot = 0,
                   int64_t extra = 0) {
  PlanLoad p;
  p.name = name;
  p.origin = name == "captured"     ? "the plan the capture was taken under"
             : name == "balanced"   ? "uneven row ranges that even out the observed ids"
             : name == "roundrobin" ? "every table under dist_type roundrobin"
                                    : name;
  p.plan = make_plan(w, tables);
  p.table_ids.assign(size_t(tables * w), 0);
  p.total.assign(size_t(w), RankLoad{});
  for (int t = 0; t < tables; ++t)
    for (int64_t r = 0; r < w; ++r) {
      const int64_t n = (t + 1) * (r + 1) * batches + (t == 0 && r == hot ? extra : 0);
      p.table_ids[size_t(t * w + r)] = n;
      p.total[size_t(r)].ids += n;
      p.total[size_t(r)].unique_rows += n / 2;
    }
  p.input_dist = TrafficMatrix(w);
  p.output_dist = TrafficMatrix(w);
  for (int64_t s = 0; s < w; ++s)
    for (int64_t d = 0; d < w; ++d) {
      p.input_dist.add(s, d, 8 * (s + 2 * d + 1) * batches);
      p.output_dist.add(s, d, 64 * 8 * (s + 2 * d + 1) * batches);
    }
  for (int64_t b = 0; b < batches; ++b) {
    BatchLoad bl;
    bl.batch = b;
    bl.ranks.assign(size_t(w), RankLoad{1, 1});
    bl.input_dist_seconds = 1e-4 * double(b + 1);
    bl.output_dist_seconds = 2e-3;
    p.batches.push_back(bl);
  }
  p.hottest_rank = hot;
  p.hottest_rows = {{0, 42, 1000, 0}, {1, 7, 500, 3}};
  p.input_dist_seconds = 0.0123;
  p.output_dist_seconds = 0.25;
  return p;
}

LoadReport make_report(int64_t w, int64_t batches, int tables = 3) {
  LoadReport r;
  r.capture = "cap.h5";
  r.capture_world_size = w;
  r.num_batches = batches;
  r.link_gbps = 100;
  r.plans.push_back(make_load("captured", w, tables, batches, w - 1, 10 * w * batches));
  r.plans.push_back(make_load("balanced", w, tables, batches, 0, 0));
  return r;
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("load page: bars, imbalance, hottest rank and estimates carry the report's numbers") {
  const LoadReport r = make_report(4, 2);
  const std::string s = load_html(r);
  CHECK(s.find("Content-Security-Policy") != std::string::npos);
  CHECK(s.find("<script") == std::string::npos);
  // captured, rank 3: tables 0..2 give (1 + 2 + 3) * 4 * 2 = 48 ids, plus 10 * 4 * 2 = 80.
  CHECK(s.find("<title>rank 3, captured: 128</title>") != std::string::npos);
  CHECK(s.find("<title>rank 3, balanced: 48</title>") != std::string::npos);
  // Input dist bytes received by rank 0 (column 0 without the diagonal): s = 1..3, d = 0:
  // 8 * (s + 1) * 2 = 32 + 48 + 64 = 144 B.
  CHECK(s.find("<title>rank 0, captured: 144 B</title>") != std::string::npos);
  // Imbalance of table t0 under captured: ids 2, 4, 6, 8 + 80 -> max 88 / mean 25 = 3.52.
  CHECK(s.find("<title>t0, captured: 3.52</title>") != std::string::npos);
  CHECK(s.find("<title>t0, balanced: 1.60</title>") != std::string::npos);
  // The hottest rank's rows: exact or bounded.
  CHECK(s.find("Plan captured: rank 3") != std::string::npos);
  CHECK(s.find("<td>t0</td><td class=\"n\">42</td><td class=\"n\">1,000</td><td>exact</td>") !=
        std::string::npos);
  CHECK(s.find("<td>t1</td><td class=\"n\">7</td><td class=\"n\">500</td><td>at most 3 "
               "over</td>") != std::string::npos);
  // Estimates, labelled so.
  CHECK(s.find("Estimated dist time over all batches (estimate)") != std::string::npos);
  CHECK(
      s.find("<td>captured</td><td>12.3 ms</td><td>250 ms</td><td>200 \u00b5s</td><td>2 ms</td>") !=
      std::string::npos);
  // Heat maps: 2 plans x 2 dists of 4 x 4; the diagonal drawn as zero.
  CHECK(count(s, "<svg class=\"heat\"") == 4);
  CHECK(s.find("<title>1 \u2192 2: 96 B</title>") != std::string::npos);
  CHECK(s.find("<title>2 \u2192 2: 0 B</title>") != std::string::npos);
}

TEST_CASE("load page: W = 1024 draws at most 64 x 64 cells per map, ranks in blocks") {
  const LoadReport r = make_report(1024, 2, 2);
  const std::string s = load_html(r);
  size_t cells = 0;
  for (size_t a = s.find("<svg class=\"heat\""); a != std::string::npos;
       a = s.find("<svg class=\"heat\"", a + 1)) {
    const std::string svg = s.substr(a, s.find("</svg>", a) - a);
    const size_t n = count(svg, "</title></use>");
    CHECK(n <= 64 * 64);
    cells += n;
  }
  // The first plan's 2 maps at 64 x 64, the other plan's 2 sharing 4096 cells: blocks of
  // 1024 / 45 -> 23 ranks, 45 x 45 cells.
  CHECK(cells == 2 * 64 * 64 + 2 * 45 * 45);
  CHECK(s.find("<title>ranks 1008-1023, captured:") != std::string::npos);
  CHECK(s.find("ids (largest of the block)") != std::string::npos);
  CHECK(s.size() < 4u << 20);
}

TEST_CASE("load page: W = 64 x 100 batches stays under 2 MB with 1 to 8 plans") {
  for (int plans = 1; plans <= 8; ++plans) {
    LoadReport r = make_report(64, 100);
    r.plans.resize(1);
    for (int k = 1; k < plans; ++k)
      r.plans.push_back(make_load("alt" + std::to_string(k), 64, 3, 100, k, 100 * k));
    const std::string s = load_html(r);
    CAPTURE(plans);
    CHECK(s.size() < 2000000);
    CHECK(count(s, "<svg class=\"heat\"") == size_t(2 * plans));
  }
}

TEST_CASE("load page: names from the inputs are escaped") {
  LoadReport r = make_report(2, 1);
  r.capture = "<b>cap\xff.h5";
  r.plans[1].name = "x<y";
  r.plans[1].plan.tables[0].name = "t\"0";
  const std::string s = load_html(r);
  CHECK(s.find("<b>") == std::string::npos);
  CHECK(s.find("&lt;b&gt;cap\\xff.h5") != std::string::npos);
  CHECK(s.find("x&lt;y") != std::string::npos);
  CHECK(s.find("t&quot;0") != std::string::npos);
}

TEST_CASE("write_load_html: the file is complete, no temporary left") {
  char dir[] = "/tmp/test_load_html.XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/load.html";
  write_load_html(make_report(4, 2), path);
  const std::string s = read(path);
  CHECK(s.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(s.find("</html>") != std::string::npos);
  for (const auto& e : std::filesystem::directory_iterator(dir))  // no temporary left
    CHECK(e.path().filename().string().find("tmp") == std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("pages for the browser (DYNEMB_LOAD_HTML_DIR)") {
  const char* dir = std::getenv("DYNEMB_LOAD_HTML_DIR");
  if (!dir || !*dir) return;
  LoadReport w8 = make_report(8, 10);
  w8.plans.push_back(make_load("roundrobin", 8, 3, 10, 5, 100));
  write_load_html(w8, std::string(dir) + "/load-w8.html");
  write_load_html(make_report(1024, 4, 2), std::string(dir) + "/load-w1024.html");
}
