#include "replay/report.hpp"

#include <fmt/core.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/safe_text.hpp"

namespace dynemb {

const char* to_string(CheckStatus s) {
  switch (s) {
    case CheckStatus::pass:
      return "pass";
    case CheckStatus::fail:
      return "fail";
    case CheckStatus::error:
      return "error";
    case CheckStatus::skipped:
      return "skipped";
  }
  return "?";
}

std::string value_text(float v) {
  if (std::isnan(v)) return "nan";
  return fmt::format("{}", v);
}

std::string CheckResult::name() const {
  std::string n;
  if (batch >= 0) n += fmt::format("batch{}.", batch);
  if (rank >= 0) n += fmt::format("rank{}.", rank);
  return n + stage + "." + check;
}

Summary Report::summary() const {
  Summary s;
  for (const CheckResult& c : checks) {
    ++s.checks;
    switch (c.status) {
      case CheckStatus::pass:
        ++s.passed;
        break;
      case CheckStatus::error:
        ++s.errors;
        break;
      case CheckStatus::skipped:
        ++s.skipped;
        break;
      case CheckStatus::fail:
        ++s.failed;
        if (c.stage == "ctx") ++s.context_mismatches;
        if (c.stage == "lookup") ++s.lookup_mismatches;
        if (c.stage == "module") ++s.module_mismatches;
        if (c.stage == "output") {
          ++s.output_mismatches;
          if (c.cause != "context") ++s.data_mismatches;
        }
        break;
    }
  }
  for (const auto& [stage, n] : pass_counts) {
    s.checks += n;
    s.passed += n;
  }
  if (!trouble.empty() || s.errors > 0) {
    s.status = "error";
    s.exit_code = 2;
  } else if (s.failed > 0) {
    s.status = "fail";
    s.exit_code = 1;
  } else {
    s.status = "pass";
    s.exit_code = 0;
  }
  return s;
}

// ---------------------------------------------------------------- text

namespace {

const char* kRed = "\x1b[31;1m";
const char* kGreen = "\x1b[32;1m";
const char* kYellow = "\x1b[33m";
const char* kReset = "\x1b[0m";

std::string paint(bool colour, const char* c, const std::string& s) {
  return colour ? std::string(c) + s + kReset : s;
}

std::string status_word(CheckStatus s, bool colour) {
  switch (s) {
    case CheckStatus::pass:
      return paint(colour, kGreen, "PASS ");
    case CheckStatus::fail:
      return paint(colour, kRed, "FAIL ");
    case CheckStatus::error:
      return paint(colour, kRed, "ERROR");
    case CheckStatus::skipped:
      return paint(colour, kYellow, "SKIP ");
  }
  return "?";
}

// Every text of a report that came from an input (paths, names, messages that carry them) goes
// through esc(): one field stays one line, with no control character (common/safe_text.hpp).
std::string esc(const std::string& s) {
  return escape_field(s);
}

std::string where_prefix(const CheckResult& c) {
  std::string s;
  if (c.batch >= 0) s += fmt::format("batch {} ", c.batch);
  if (c.rank >= 0) s += fmt::format("rank {} ", c.rank);
  return s;
}

}  // namespace

std::string text_header(const Report& r) {
  const ReportInfo& i = r.info;
  std::string s = fmt::format("# dynemb-dist {} replay\n", esc(i.tool_version));
  s += fmt::format("# capture    {}{}\n", esc(i.capture.path),
                   i.capture.sha256.empty() ? "" : "  sha256 " + esc(i.capture.sha256));
  s += fmt::format("# plan       {}{}\n", esc(i.plan.path),
                   i.plan.sha256.empty() ? "" : "  sha256 " + esc(i.plan.sha256));
  s += fmt::format("# module     {}, world size {}, {} batches in the capture, {} replayed\n",
                   esc(i.module), i.world_size, i.num_batches, i.batches.size());
  s += fmt::format("# backend    {} ({})\n", esc(i.backend), esc(i.device));
  s += fmt::format("# ctx        {}    tolerance {}\n", esc(i.ctx_mode), esc(i.tolerance));
  return s;
}

std::string text_check_line(const CheckResult& c, bool colour) {
  std::string s = fmt::format("{} {}{} {}: {}", status_word(c.status, colour), where_prefix(c),
                              esc(c.stage), esc(c.check), esc(c.message));
  if (!c.cause.empty()) s += fmt::format(" [cause: {}]", esc(c.cause));
  s += "\n";
  for (const Detail& d : c.details) {
    s += fmt::format("        at {}: {} {}, {} {}", esc(to_string(d.where)), esc(c.got_label),
                     esc(d.got), esc(c.want_label), esc(d.want));
    if (!d.note.empty()) s += " (" + esc(d.note) + ")";
    s += "\n";
  }
  if (c.mismatches > int64_t(c.details.size()) && !c.details.empty())
    s += fmt::format("        ... {} more\n", c.mismatches - int64_t(c.details.size()));
  return s;
}

std::string text_summary(const Report& r, bool colour) {
  struct Row {
    int64_t checks = 0, passed = 0, failed = 0, errors = 0, skipped = 0;
  };
  std::map<std::string, Row> rows;
  const char* order[] = {"capture", "ctx", "lookup", "output", "module"};
  for (const CheckResult& c : r.checks) {
    Row& row = rows[c.stage];
    ++row.checks;
    row.passed += c.status == CheckStatus::pass;
    row.failed += c.status == CheckStatus::fail;
    row.errors += c.status == CheckStatus::error;
    row.skipped += c.status == CheckStatus::skipped;
  }
  for (const auto& [stage, n] : r.pass_counts) {
    rows[stage].checks += n;
    rows[stage].passed += n;
  }
  const Summary sum = r.summary();
  std::string s = "#\n";
  s += fmt::format("# {:<8} {:>8} {:>8} {:>8} {:>8} {:>8}\n", "stage", "checks", "passed", "failed",
                   "errors", "skipped");
  auto line = [&](const std::string& name, const Row& row) {
    s += fmt::format("# {:<8} {:>8} {:>8} {:>8} {:>8} {:>8}\n", esc(name), row.checks, row.passed,
                     row.failed, row.errors, row.skipped);
  };
  for (const char* st : order) {
    if (rows.count(st)) line(st, rows[st]);
  }
  for (const auto& [name, row] : rows) {  // any other stage, after the known ones
    bool known = false;
    for (const char* st : order) known |= name == st;
    if (!known) line(name, row);
  }
  line("total", Row{sum.checks, sum.passed, sum.failed, sum.errors, sum.skipped});
  s += "#\n";
  for (const std::string& w : r.warnings) s += fmt::format("# warning: {}\n", esc(w));
  if (!r.trouble.empty()) s += fmt::format("# trouble: {}\n", esc(r.trouble));
  const std::string word = sum.exit_code == 0   ? paint(colour, kGreen, "PASS")
                           : sum.exit_code == 1 ? paint(colour, kRed, "FAIL")
                                                : paint(colour, kRed, "ERROR");
  // How many checks ran, always: a run that checked nothing must not read like a clean one.
  const int64_t ran = sum.checks - sum.skipped;
  s += fmt::format(
      "# result: {} (exit {}): {} context mismatches, {} lookup mismatches, {} output "
      "mismatches ({} data), {} module mismatches, {} errors; {} {} ran{}\n",
      word, sum.exit_code, sum.context_mismatches, sum.lookup_mismatches, sum.output_mismatches,
      sum.data_mismatches, sum.module_mismatches, sum.errors, ran, ran == 1 ? "check" : "checks",
      sum.skipped > 0 ? fmt::format(", {} skipped", sum.skipped) : "");
  return s;
}

// ---------------------------------------------------------------- JSON

namespace {

nlohmann::json opt_number(const std::optional<double>& v) {
  if (!v || !std::isfinite(*v)) return nullptr;
  return *v;
}

nlohmann::json opt_string(const std::string& s) {
  if (s.empty()) return nullptr;
  return s;
}

nlohmann::json where_json(const Coords& c) {
  nlohmann::json w = nlohmann::json::object();
  for (const Coord& x : c) {
    if (!x.label.empty()) {
      w[x.key] = x.label;
      w[x.key + "_index"] = x.value;
    } else {
      w[x.key] = x.value;
    }
  }
  return w;
}

}  // namespace

namespace {

// One entry of the report's "checks".
nlohmann::json check_json(const CheckResult& c) {
  using nlohmann::json;
  json d = json::array();
  for (const Detail& x : c.details) {
    d.push_back({{"where", where_json(x.where)},
                 {"got", x.got},
                 {"want", x.want},
                 {"note", opt_string(x.note)}});
  }
  return {{"name", c.name()},
          {"batch", c.batch >= 0 ? json(c.batch) : json(nullptr)},
          {"rank", c.rank >= 0 ? json(c.rank) : json(nullptr)},
          {"stage", c.stage},
          {"check", c.check},
          {"status", to_string(c.status)},
          {"message", c.message},
          {"cause", opt_string(c.cause)},
          {"got_label", c.got_label},
          {"want_label", c.want_label},
          {"compared", c.compared},
          {"mismatches", c.mismatches},
          {"max_abs_err", opt_number(c.max_abs_err)},
          {"max_rel_err", opt_number(c.max_rel_err)},
          {"details", d}};
}

// Appends pieces of a report to `out` in chunks of about a MiB: a long replay's report is
// written as it is made, never held whole (nor as a JSON tree) in memory.
class ChunkedSink {
 public:
  explicit ChunkedSink(const std::function<void(const std::string&)>& out) : out_(out) {}
  void add(const std::string& s) {
    buf_ += s;
    if (buf_.size() >= (size_t{1} << 20)) flush();
  }
  void flush() {
    if (!buf_.empty()) out_(buf_);
    buf_.clear();
  }

 private:
  const std::function<void(const std::string&)>& out_;
  std::string buf_;
};

}  // namespace

void write_json_report(const Report& r, const std::function<void(const std::string&)>& out) {
  using nlohmann::json;
  const ReportInfo& i = r.info;
  const Summary sum = r.summary();
  json j;
  j["schema_version"] = kReportSchemaVersion;
  j["tool"] = {{"name", "dynemb-dist"}, {"version", i.tool_version}};
  j["command"] = "replay";
  j["argv"] = i.argv;
  j["backend"] = {{"name", i.backend}, {"device", i.device}};
  j["capture"] = {{"path", i.capture.path}, {"sha256", opt_string(i.capture.sha256)}};
  j["plan"] = {
      {"path", i.plan.path}, {"sha256", opt_string(i.plan.sha256)}, {"embedded", i.plan.embedded}};
  j["run"] = {{"module", i.module},
              {"world_size", i.world_size},
              {"num_batches", i.num_batches},
              {"batches", i.batches},
              {"ctx", i.ctx_mode},
              {"tolerance", i.tolerance},
              {"max_mismatches", i.max_mismatches},
              {"write_output", opt_string(i.write_output)}};
  j["summary"] = {{"status", sum.status},
                  {"exit_code", sum.exit_code},
                  {"checks", sum.checks},
                  {"passed", sum.passed},
                  {"failed", sum.failed},
                  {"errors", sum.errors},
                  {"skipped", sum.skipped},
                  {"context_mismatches", sum.context_mismatches},
                  {"lookup_mismatches", sum.lookup_mismatches},
                  {"output_mismatches", sum.output_mismatches},
                  {"data_mismatches", sum.data_mismatches},
                  {"module_mismatches", sum.module_mismatches}};
  j["warnings"] = r.warnings;
  j["trouble"] = opt_string(r.trouble);
  // The checks are rendered one at a time into the place of an empty "checks" (keys are
  // sorted, so it is neither the first nor the last member): the same bytes as one dump of
  // the whole tree, with one check's tree in memory at a time.
  j["checks"] = json::array();
  // Every string escaped (common/safe_text.hpp): valid UTF-8, no control character, whatever
  // a path, name or message holds.
  escape_json_strings(j);
  const std::string doc = j.dump(2) + "\n";
  const std::string slot = "\n  \"checks\": [],\n";
  const size_t at = doc.find(slot);
  ChunkedSink w(out);
  w.add(doc.substr(0, at) + "\n  \"checks\": [");
  bool first = true;
  for (const CheckResult& c : r.listed_checks()) {
    std::string e = first ? "\n    " : ",\n    ";
    first = false;
    json cj = check_json(c);
    escape_json_strings(cj);
    for (const char ch : cj.dump(2)) {
      e += ch;
      if (ch == '\n') e += "    ";  // nested two levels deep
    }
    w.add(e);
  }
  w.add(std::string(first ? "" : "\n  ") + "],\n" + doc.substr(at + slot.size()));
  w.flush();
}

std::string json_report(const Report& r) {
  std::string s;
  write_json_report(r, [&](const std::string& piece) { s += piece; });
  return s;
}

// ---------------------------------------------------------------- JUnit

}  // namespace dynemb
