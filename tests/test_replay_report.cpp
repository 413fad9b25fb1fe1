// Report model and writers: summary counts and exit codes, JSON fields, JUnit structure,
// text lines, atomic file writes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.hpp"
#include "replay/report.hpp"

using namespace dynemb;

namespace {
Report sample_report() {
  Report r;
  r.info.argv = {"dynemb-dist", "replay", "c.h5"};
  r.info.tool_version = "0.1.0";
  r.info.backend = "cpu";
  r.info.device = "host";
  r.info.capture = {"c.h5", std::string(64, 'a')};
  r.info.plan = {"c.h5:/plan", "", true};
  r.info.module = "sequence";
  r.info.world_size = 2;
  r.info.num_batches = 1;
  r.info.batches = {0};
  r.info.ctx_mode = "captured";
  r.info.tolerance = "exact";
  CheckResult pass;
  pass.batch = 0;
  pass.rank = 0;
  pass.stage = "ctx";
  pass.check = "input_splits";
  pass.message = "2 elements equal the derived context";
  CheckResult ctx = pass;
  ctx.rank = 1;
  ctx.status = CheckStatus::fail;
  ctx.mismatches = 1;
  ctx.message = "1 of 2 elements differ <&>";
  ctx.details.push_back({{{"index", 1, ""}}, "4", "3", "plan routes 3 ids of rank 1 to rank 1"});
  CheckResult data;
  data.batch = 0;
  data.rank = 1;
  data.stage = "output";
  data.check = "golden";
  data.status = CheckStatus::fail;
  data.cause = "data (golden output)";
  data.got_label = "replayed";
  data.want_label = "golden";
  data.compared = 10;
  data.mismatches = 3;
  data.max_abs_err = 0.5;
  data.max_rel_err = 0.25;
  data.message = "3 of 10 elements differ";
  data.details.push_back({{{"feature", 1, "f1"}, {"sample", 2, ""}}, "1.5", "1", ""});
  r.checks = {pass, ctx, data};
  return r;
}
}  // namespace

TEST_CASE("summary counts checks by status and stage, exit code 0/1/2") {
  Report r = sample_report();
  Summary s = r.summary();
  CHECK(s.checks == 3);
  CHECK(s.passed == 1);
  CHECK(s.failed == 2);
  CHECK(s.context_mismatches == 1);
  CHECK(s.output_mismatches == 1);
  CHECK(s.data_mismatches == 1);
  CHECK(s.status == "fail");
  CHECK(s.exit_code == 1);
  r.checks.resize(1);
  CHECK(r.summary().exit_code == 0);
  r.trouble = "c.h5:/batches/0/rank1/values: missing";
  CHECK(r.summary().exit_code == 2);
  CHECK(r.summary().status == "error");
}

TEST_CASE("JSON report: schema version, summary, one entry per check") {
  const Report r = sample_report();
  const auto j = nlohmann::json::parse(json_report(r));
  CHECK(j["schema_version"] == "1.1.0");
  CHECK(j["argv"].size() == 3);
  CHECK(j["tool"]["version"] == "0.1.0");
  CHECK(j["capture"]["sha256"] == std::string(64, 'a'));
  CHECK(j["plan"]["sha256"].is_null());
  CHECK(j["plan"]["embedded"] == true);
  CHECK(j["summary"]["exit_code"] == 1);
  CHECK(j["summary"]["context_mismatches"] == 1);
  REQUIRE(j["checks"].size() == 3);
  CHECK(j["checks"][1]["name"] == "batch0.rank1.ctx.input_splits");
  CHECK(j["checks"][1]["details"][0]["where"]["index"] == 1);
  CHECK(j["checks"][2]["details"][0]["where"]["feature"] == "f1");
  CHECK(j["checks"][2]["details"][0]["where"]["feature_index"] == 1);
  CHECK(j["checks"][2]["max_abs_err"] == 0.5);
  CHECK(j["checks"][0]["max_abs_err"].is_null());
  CHECK(j["checks"][2]["cause"] == "data (golden output)");
}

TEST_CASE("JUnit: one testcase per check, failure bodies, escaped text, trouble as error") {
  Report r = sample_report();
  std::string x = junit_report(r);
  CHECK(x.find("tests=\"3\" failures=\"2\" errors=\"0\"") != std::string::npos);
  CHECK(x.find("name=\"batch0.rank1.ctx.input_splits\"") != std::string::npos);
  CHECK(x.find("1 of 2 elements differ &lt;&amp;&gt;") != std::string::npos);
  CHECK(x.find("<failure type=\"output mismatch\"") != std::string::npos);
  CHECK(x.find("(plan routes 3 ids of rank 1 to rank 1)\n</failure>") != std::string::npos);
  r.trouble = "bad \"file\"";
  x = junit_report(r);
  CHECK(x.find("tests=\"4\" failures=\"2\" errors=\"1\"") != std::string::npos);
  CHECK(x.find("<error type=\"trouble\" message=\"bad &quot;file&quot;\"") != std::string::npos);
}

TEST_CASE("text: failing check lines with details, '#' summary, colour only when asked") {
  const Report r = sample_report();
  const std::string line = text_check_line(r.checks[1], false);
  CHECK(line ==
        "FAIL  batch 0 rank 1 ctx input_splits: 1 of 2 elements differ <&>\n"
        "        at index 1: captured 4, derived 3 (plan routes 3 ids of rank 1 to rank 1)\n");
  const std::string data = text_check_line(r.checks[2], false);
  CHECK(data.find("[cause: data (golden output)]") != std::string::npos);
  CHECK(data.find("at feature f1, sample 2: replayed 1.5, golden 1") != std::string::npos);
  CHECK(data.find("... 2 more") != std::string::npos);
  const std::string sum = text_summary(r, false);
  std::istringstream in(sum);
  for (std::string l; std::getline(in, l);) CHECK(l.rfind("#", 0) == 0);
  CHECK(sum.find("# result: FAIL (exit 1)") != std::string::npos);
  CHECK(sum.find('\x1b') == std::string::npos);
  CHECK(text_summary(r, true).find("\x1b[31;1mFAIL") != std::string::npos);
  CHECK(text_header(r).find("# capture    c.h5  sha256 aaaa") ==
        0 + text_header(r).find("# capture"));
}

TEST_CASE("value_text: shortest round-trip text; every NaN as nan, whatever its sign") {
  CHECK(value_text(1.5f) == "1.5");
  CHECK(value_text(-0.671875f) == "-0.671875");
  CHECK(value_text(0.1f) == "0.1");
  CHECK(value_text(-0.0f) == "-0");
  CHECK(value_text(std::numeric_limits<float>::infinity()) == "inf");
  CHECK(value_text(-std::numeric_limits<float>::infinity()) == "-inf");
  // A bf16 NaN with its sign bit set (0xFFFD), widened as the codecs do, and CUDA's canonical NaN.
  float neg_nan, cuda_nan;
  const uint32_t neg_bits = 0xFFFD0000u, cuda_bits = 0x7FFFFFFFu;
  std::memcpy(&neg_nan, &neg_bits, 4);
  std::memcpy(&cuda_nan, &cuda_bits, 4);
  REQUIRE(std::signbit(neg_nan));
  CHECK(value_text(neg_nan) == "nan");
  CHECK(value_text(cuda_nan) == "nan");
  CHECK(value_text(std::numeric_limits<float>::quiet_NaN()) == "nan");
}

TEST_CASE("passes kept compactly (PassLog) give the same reports, in the order decided") {
  // Whole: pass0, fail ctx, pass1 (with errors), fail data, pass2.
  Report whole = sample_report();
  CheckResult p1 = whole.checks[0];
  p1.batch = 1;
  p1.stage = "output";
  p1.check = "reference";
  p1.got_label = "replayed";
  p1.want_label = "reference";
  p1.compared = 512;
  p1.max_abs_err = 0.0;
  p1.max_rel_err = 1.5e-7;
  p1.message = "512 elements within ulp:4 (max abs err 0, max rel err 1.5e-07)";
  CheckResult p2 = whole.checks[0];
  p2.rank = 1;
  whole.checks = {whole.checks[0], whole.checks[1], p1, whole.checks[2], p2};
  // Compact: the passes in the log, each after the checks decided before it.
  Report compact = whole;
  compact.checks = {whole.checks[1], whole.checks[3]};
  REQUIRE(PassLog::fits(whole.checks[0]));
  REQUIRE(!PassLog::fits(whole.checks[1]));
  compact.pass_log.add(whole.checks[0], 0);
  compact.pass_log.add(p1, 1);
  compact.pass_log.add(p2, 2);
  for (const CheckResult& c : {whole.checks[0], p1, p2}) ++compact.pass_counts[c.stage];
  std::vector<std::string> names;
  for (const CheckResult& c : compact.listed_checks()) names.push_back(c.name());
  CHECK(names ==
        std::vector<std::string>{"batch0.rank0.ctx.input_splits", "batch0.rank1.ctx.input_splits",
                                 "batch1.rank0.output.reference", "batch0.rank1.output.golden",
                                 "batch0.rank1.ctx.input_splits"});
  CHECK(compact.summary().checks == 5);
  CHECK(compact.summary().passed == 3);
  CHECK(json_report(compact) == json_report(whole));
  CHECK(junit_report(compact) == junit_report(whole));
  CHECK(text_summary(compact, false) == text_summary(whole, false));
  // Counted only (no log): the summary and the text table still count them.
  Report counted = compact;
  counted.pass_log = PassLog();
  CHECK(text_summary(counted, false) == text_summary(whole, false));
  // Written in pieces: the same bytes.
  std::string pieces;
  write_json_report(compact, [&](const std::string& s) { pieces += s; });
  CHECK(pieces == json_report(whole));
  CHECK(json_report(whole).find("\"checks\": [\n    {\n      \"batch\": 0,") != std::string::npos);
}

TEST_CASE("a report with no checks: the JSON's \"checks\" is an empty array") {
  Report r = sample_report();
  r.checks.clear();
  const std::string j = json_report(r);
  CHECK(j.find("\n  \"checks\": [],\n") != std::string::npos);
  CHECK(nlohmann::json::parse(j)["checks"].empty());
}

TEST_CASE("hostile strings: escaped in text, JSON and JUnit; each stays one line") {
  Report r = sample_report();
  r.info.capture.path = "c\xff\n::add-mask::x.h5";
  r.checks[1].message =
      std::string("keys [f\x1b[2J\x07, f\r\n::stop-commands::e, t") + std::string(1, '\0') + "x]";
  r.checks[2].details[0].where = {{"feature", 1, "f\n1"}};
  r.warnings = {"w\x85"};
  r.trouble = "bad \xc0\xaf";
  const std::string line = text_check_line(r.checks[1], true);
  CHECK(line ==
        "\x1b[31;1mFAIL \x1b[0m batch 0 rank 1 ctx input_splits: keys [f\\x1b[2J\\x07, "
        "f\\r\\n::stop-commands::e, t\\x00x]\n"
        "        at index 1: captured 4, derived 3 (plan routes 3 ids of rank 1 to rank 1)\n");
  CHECK(text_check_line(r.checks[2], false).find("at feature f\\n1: replayed 1.5") !=
        std::string::npos);
  CHECK(text_header(r).find("# capture    c\\xff\\n::add-mask::x.h5  sha256") != std::string::npos);
  const std::string sum = text_summary(r, false);
  CHECK(sum.find("# warning: w\\x85\n") != std::string::npos);  // invalid UTF-8: a lone byte
  CHECK(sum.find("# trouble: bad \\xc0\\xaf\n") != std::string::npos);

  const auto j = nlohmann::json::parse(json_report(r));  // throws on invalid UTF-8
  CHECK(j["capture"]["path"] == "c\\xff\\n::add-mask::x.h5");
  CHECK(j["checks"][1]["message"] == "keys [f\\x1b[2J\\x07, f\\r\\n::stop-commands::e, t\\x00x]");
  CHECK(j["checks"][2]["details"][0]["where"]["feature"] == "f\\n1");
  CHECK(j["trouble"] == "bad \\xc0\\xaf");

  const std::string x = junit_report(r);
  CHECK(x.find("<testsuites name=\"dynemb-dist replay c\\xff\\n::add-mask::x.h5\"") !=
        std::string::npos);
  CHECK(x.find("message=\"keys [f\\x1b[2J\\x07, f\\r\\n::stop-commands::e, t\\x00x]\"") !=
        std::string::npos);
  CHECK(std::count_if(x.begin(), x.end(), [](char c) {
          return static_cast<unsigned char>(c) < 0x20 && c != '\n';
        }) == 0);
}

TEST_CASE("text: the result line counts the module stage like the others") {
  Report r = sample_report();
  r.checks.resize(1);  // one passing ctx check
  CheckResult m;
  m.batch = 0;
  m.rank = 0;
  m.stage = "module";
  m.check = "module_output";
  m.status = CheckStatus::fail;
  m.mismatches = 2;
  m.message = "2 of 8 elements differ";
  r.checks.push_back(m);
  r.checks.push_back(m);
  const std::string sum = text_summary(r, false);
  CHECK(sum.find("# result: FAIL (exit 1): 0 context mismatches, 0 lookup mismatches, 0 output "
                 "mismatches (0 data), 2 module mismatches, 0 errors; 3 checks ran\n") !=
        std::string::npos);
}
