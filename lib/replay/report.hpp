// The replay report: one CheckResult per (batch, rank, check), plus run information, and
// its renderings (text, JSON schema 1.0.0 of docs/report-schema.md, JUnit XML, HTML).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "replay/coords.hpp"
#include "replay/pass_log.hpp"

namespace dynemb {

enum class CheckStatus : uint8_t { pass, fail, error, skipped };
const char* to_string(CheckStatus s);

// An element's value as a report writes it: the shortest text that reads back to the same float,
// and every NaN as "nan". A NaN's sign is not part of the result: IEEE 754 leaves it open for
// arithmetic, x86 carries an operand's through a sum while CUDA makes every NaN its canonical
// positive one, so a report must not differ between backends by it.
std::string value_text(float v);

// One differing element of a checked field or tensor.
struct Detail {
  Coords where;
  std::string got;   // captured / replayed value, as text
  std::string want;  // derived / golden / reference value
  std::string note;  // what the plan implies here, e.g. "plan routes 4 ids of rank 0 to rank 1"
};

struct CheckResult {
  int64_t batch = -1;  // -1: not tied to a batch (e.g. opening the capture)
  int rank = -1;       // -1: not tied to a rank
  std::string stage;   // "ctx", "lookup", "output", "module", "capture"
  std::string check;   // field or check name, e.g. "input_splits", "unbucketize_permute.bijection"
  CheckStatus status = CheckStatus::pass;
  std::string message;  // one line: what was found (or what passed)
  std::string got_label = "captured", want_label = "derived";  // what got / want are
  std::string cause;  // output checks: verdict on the cause ("context", "data (golden output)")
  int64_t compared = 0;
  int64_t mismatches = 0;
  std::optional<double> max_abs_err, max_rel_err;
  std::vector<Detail> details;  // the first --max-mismatches differences

  // Unique name "batch3.rank1.ctx.input_splits" (JUnit testcase name).
  std::string name() const;
};

struct FileInfo {
  std::string path;
  std::string sha256;     // of the file, or of the embedded plan text; empty when unknown
  bool embedded = false;  // the plan came from the capture's /plan
};

struct ReportInfo {
  std::vector<std::string> argv;
  std::string tool_version;
  std::string backend, device;
  FileInfo capture, plan;
  std::string module;  // "sequence" / "pooled"
  int64_t world_size = 0;
  int64_t num_batches = 0;       // in the capture
  std::vector<int64_t> batches;  // replayed
  std::string ctx_mode;          // "captured" / "derived"
  std::string tolerance;         // canonical text
  int64_t max_mismatches = 0;
  std::string write_output;  // --write-output path, or empty
};

struct Summary {
  int64_t checks = 0, passed = 0, failed = 0, errors = 0, skipped = 0;
  int64_t context_mismatches = 0;  // failed checks of stage ctx
  int64_t lookup_mismatches = 0;   // failed checks of stage lookup
  int64_t output_mismatches = 0;   // failed checks of stage output
  int64_t data_mismatches = 0;     // failed output checks whose cause is not the context
  int64_t module_mismatches = 0;   // failed checks of stage module (module_output)
  std::string status;              // "pass", "fail", "error"
  int exit_code = 0;               // 0, 1, 2
};

struct Report {
  ReportInfo info;
  std::vector<CheckResult> checks;
  std::vector<std::string> warnings;
  std::string trouble;  // the exit-2 message when the run stopped on trouble, else empty
  // Checks that passed and are not in `checks` (ReplayOptions::passes), by stage: they count
  // in the summary and the text table.
  std::map<std::string, int64_t> pass_counts;
  // Their records when a report file lists every check (PassMode::compact), else empty.
  PassLog pass_log;

  Summary summary() const;

  // Every check kept, in the order decided: `checks` and `pass_log` merged (by value: a pass
  // is made again from its record).
  class Listed {
   public:
    class iterator {
     public:
      iterator(const Report& r, size_t i, size_t p) : r_(&r), i_(i), p_(p) {}
      CheckResult operator*() const { return from_log() ? r_->pass_log.at(p_) : r_->checks[i_]; }
      iterator& operator++() {
        (from_log() ? p_ : i_) += 1;
        return *this;
      }
      bool operator!=(const iterator& o) const { return i_ != o.i_ || p_ != o.p_; }

     private:
      // The log's next pass was decided after checks[0, before) and before checks[before].
      bool from_log() const { return p_ < r_->pass_log.size() && r_->pass_log.before(p_) <= i_; }
      const Report* r_;
      size_t i_, p_;
    };
    explicit Listed(const Report& r) : r_(r) {}
    iterator begin() const { return {r_, 0, 0}; }
    iterator end() const { return {r_, r_.checks.size(), r_.pass_log.size()}; }

   private:
    const Report& r_;
  };
  Listed listed_checks() const { return Listed(*this); }
};

// Text rendering (cli.md "Reports"): `colour` adds ANSI colour to the status words.
std::string text_header(const Report& r);
std::string text_check_line(const CheckResult& c, bool colour);  // one failing check (+details)
std::string text_summary(const Report& r, bool colour);          // table + '#' lines

std::string json_report(const Report& r);   // pretty-printed, schema_version 1.1.0
std::string junit_report(const Report& r);  // JUnit XML
// A self-contained HTML page (report_html.cpp): the verdict, a rank x batch grid of verdicts
// with each non-passing cell's first mismatch, mismatches per feature, --plan's differences.
// Its cells count the passes too, so the report must keep them (PassMode whole or compact).
std::string html_report(const Report& r);
// The same bytes, handed to `out` in pieces as they are made (a long replay's report is never
// held whole in memory): what the CLI writes its report files with.
void write_json_report(const Report& r, const std::function<void(const std::string&)>& out);
void write_junit_report(const Report& r, const std::function<void(const std::string&)>& out);

inline constexpr const char* kReportSchemaVersion = "1.1.0";

}  // namespace dynemb
