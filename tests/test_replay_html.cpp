// The replay HTML report (lib/replay/report_html.cpp) from Reports built by hand: the grid's
// verdicts (a whole-batch check counts in every rank, batches not replayed are "not
// checked"), the first mismatch of each cell, the per-feature counts, --plan's differences,
// and a W = 1024 x 100 batches grid drawn in at most 64 x 64 blocks. The text, JSON and JUnit
// reports of the same Report are unchanged by it (they do not know of it).
//
// With DYNEMB_REPLAY_HTML_DIR set, the W = 1024 page is written there as replay-w1024.html
// (tests/cli/test_html_report.sh opens it in a browser).
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "replay/report.hpp"

using namespace dynemb;

namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

CheckResult check(int64_t batch, int rank, const std::string& stage, const std::string& name,
                  CheckStatus st) {
  CheckResult c;
  c.batch = batch;
  c.rank = rank;
  c.stage = stage;
  c.check = name;
  c.status = st;
  c.message = to_string(st);
  return c;
}

CheckResult golden_fail(int64_t batch, int rank, const std::string& feature) {
  CheckResult c = check(batch, rank, "output", "golden", CheckStatus::fail);
  c.got_label = "replayed";
  c.want_label = "golden";
  c.mismatches = 7;
  c.message = "7 of 100 elements differ";
  c.details.push_back(
      {{{"feature", 1, feature}, {"sample", 3, ""}, {"column", 5, ""}}, "1.5", "1.25", ""});
  c.details.push_back(
      {{{"feature", 2, "g<2>"}, {"sample", 0, ""}, {"column", 0, ""}}, "2", "3", ""});
  return c;
}

// W ranks x batches, every (batch, rank) with one pass kept compactly (as --json and --html
// keep them), and the failing checks given.
Report make_report(int64_t w, int64_t batches, const std::vector<CheckResult>& bad) {
  Report r;
  r.info.capture.path = "cap.h5";
  r.info.plan.path = "cap.h5:/plan";
  r.info.plan.embedded = true;
  r.info.world_size = w;
  r.info.num_batches = batches;
  for (int64_t b = 0; b < batches; ++b) r.info.batches.push_back(b);
  for (const CheckResult& c : bad) r.checks.push_back(c);
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t k = 0; k < w; ++k) {
      const CheckResult c = check(b, int(k), "ctx", "input_splits", CheckStatus::pass);
      r.pass_log.add(c, r.checks.size());
      r.pass_counts["ctx"] += 1;
    }
  return r;
}

}  // namespace

TEST_CASE("replay page: verdict per rank and batch, first mismatch, per feature") {
  Report r =
      make_report(4, 3,
                  {golden_fail(1, 2, "f1"), check(2, -1, "capture", "trouble", CheckStatus::error),
                   check(0, 3, "ctx", "lengths", CheckStatus::skipped)});
  r.info.batches = {0, 1, 2};
  r.info.num_batches = 5;
  const std::string s = html_report(r);
  CHECK(s.find("<b>ERROR</b>") != std::string::npos);
  CHECK(s.find("<title>batch 1, rank 2: mismatch; 1 passed, 1 failed, 0 errors, 0 skipped; "
               "first: output golden at feature f1, sample 3, column 5: replayed 1.5, golden "
               "1.25</title>") != std::string::npos);
  // A whole-batch error counts in every rank of the batch.
  for (int k = 0; k < 4; ++k)
    CHECK(s.find("<title>batch 2, rank " + std::to_string(k) + ": error;") != std::string::npos);
  CHECK(s.find("<title>batch 0, rank 3: pass; 1 passed, 0 failed, 0 errors, 1 skipped</title>") !=
        std::string::npos);
  CHECK(s.find("<tr><td class=\"n\">1</td><td class=\"n\">2</td><td>mismatch</td><td>output "
               "golden</td><td>f1</td><td>feature f1, sample 3, column 5</td><td "
               "class=\"n\">replayed 1.5</td><td class=\"n\">golden 1.25</td>") !=
        std::string::npos);
  // Per feature: the check lists one difference in f1 and one in g<2>, escaped.
  CHECK(s.find("<title>f1, listed differences: 1</title>") != std::string::npos);
  CHECK(s.find("<title>g&lt;2&gt;, failing checks: 1</title>") != std::string::npos);
  CHECK(s.find("<g<2>") == std::string::npos);
  CHECK(s.find("Differences of --plan") == std::string::npos);  // the embedded plan
}

TEST_CASE("replay page: batches not replayed are not checked; a passing run") {
  Report r = make_report(2, 2, {});
  r.info.batches = {1};
  r.checks.clear();
  const std::string s = html_report(r);
  CHECK(s.find("<b>PASS</b>") != std::string::npos);
  CHECK(s.find("<title>batch 0, rank 1: pass;") != std::string::npos);  // a check names it
  CHECK(s.find("No check failed.") != std::string::npos);
  Report none = make_report(2, 0, {});
  none.info.batches = {0, 1};
  CHECK(html_report(none).find("<title>batch 1, rank 0: not checked</title>") != std::string::npos);
}

TEST_CASE("replay page: --plan's differences, key by key") {
  Report r = make_report(2, 1, {});
  r.info.plan.embedded = false;
  r.info.plan.path = "other.yaml";
  r.warnings = {
      "--plan differs from the capture's plan: tables[t0].num_embeddings: 1000 (capture) "
      "-> 4000 (--plan)",
      "--plan: the captured ctx/ was made under the capture's plan"};
  const std::string s = html_report(r);
  CHECK(s.find("<tr><td>tables[t0].num_embeddings</td><td>1000</td><td>4000</td></tr>") !=
        std::string::npos);
  CHECK(count(s, "<tr><td>tables[") == 1);
}

TEST_CASE("replay page: W = 1024 x 100 batches is drawn in 64 x 50 blocks") {
  std::vector<CheckResult> bad;
  for (int k = 0; k < 1024; k += 100) bad.push_back(golden_fail(k % 100, k, "f0"));
  const Report r = make_report(1024, 100, bad);
  const std::string s = html_report(r);
  const size_t a = s.find("<svg class=\"grid\""), b = s.find("</svg>", a);
  REQUIRE(a != std::string::npos);
  CHECK(count(s.substr(a, b - a), "</title></rect>") == 64 * 50);
  // rank 300 of batch 0 failed: block (ranks 288-303, batches 0-1), 32 cells.
  CHECK(s.find("<title>ranks 288-303, batches 0-1: 31 pass, 1 mismatch</title>") !=
        std::string::npos);
  CHECK(s.size() < (1u << 20));
  const char* dir = std::getenv("DYNEMB_REPLAY_HTML_DIR");
  if (dir && *dir) std::ofstream(std::string(dir) + "/replay-w1024.html") << s;
}

TEST_CASE("replay page: at most 1000 first mismatches listed, the rest counted") {
  std::vector<CheckResult> bad;
  for (int b = 0; b < 30; ++b)
    for (int k = 0; k < 40; ++k) bad.push_back(golden_fail(b, k, "f0"));
  const std::string s = html_report(make_report(40, 30, bad));
  CHECK(count(s, "<td>mismatch</td><td>output golden</td>") == 1000);
  CHECK(s.find("The first 1000 of 1200 cells") != std::string::npos);
}
