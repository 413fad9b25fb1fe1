// The JUnit XML report (report.hpp).
#include <fmt/core.h>

#include <functional>

#include "common/error.hpp"
#include "common/safe_text.hpp"
#include "replay/report.hpp"

namespace dynemb {

namespace {

// XML 1.0 well-formed whatever the input: the text first through escape_lines (attributes:
// escape_field), which leaves no control character but '\n' and only valid UTF-8 without
// U+FFFE/U+FFFF, then the markup characters.
std::string xml_markup(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&apos;";
        break;
      default:
        o += ch;
    }
  }
  return o;
}

std::string xml_attr(const std::string& s) {
  return xml_markup(escape_field(s));
}

std::string xml_text(const std::string& s) {
  return xml_markup(escape_lines(s));
}

}  // namespace

void write_junit_report(const Report& r, const std::function<void(const std::string&)>& out) {
  const Summary sum = r.summary();
  int64_t tests = sum.checks, errors = sum.errors;
  // Trouble that stopped the run is one more <error> testcase.
  const bool trouble_case = !r.trouble.empty();
  if (trouble_case) {
    ++tests;
    ++errors;
  }
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  const std::string suite = xml_attr("dynemb-dist replay " + r.info.capture.path);
  s += fmt::format(
      "<testsuites name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\">\n", suite,
      tests, sum.failed, errors, sum.skipped);
  s += fmt::format(
      "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\">\n",
      suite, tests, sum.failed, errors, sum.skipped);
  for (const CheckResult& c : r.listed_checks()) {
    if (s.size() >= (size_t{1} << 20)) {  // written as it is made (ChunkedSink)
      out(s);
      s.clear();
    }
    const std::string cls =
        c.batch >= 0 ? fmt::format("replay.batch{}", c.batch) : std::string("replay");
    s += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"0\"", xml_attr(cls),
                     xml_attr(c.name()));
    if (c.status == CheckStatus::pass) {
      s += "/>\n";
      continue;
    }
    s += ">\n";
    std::string body = text_check_line(c, false);
    if (c.status == CheckStatus::fail) {
      s += fmt::format("      <failure type=\"{} mismatch\" message=\"{}\">{}</failure>\n",
                       xml_attr(c.stage), xml_attr(c.message), xml_text(body));
    } else if (c.status == CheckStatus::error) {
      s += fmt::format("      <error type=\"trouble\" message=\"{}\">{}</error>\n",
                       xml_attr(c.message), xml_text(body));
    } else {
      s += fmt::format("      <skipped message=\"{}\"/>\n", xml_attr(c.message));
    }
    s += "    </testcase>\n";
  }
  if (trouble_case) {
    s += "    <testcase classname=\"replay\" name=\"replay.trouble\" time=\"0\">\n";
    s += fmt::format("      <error type=\"trouble\" message=\"{}\">{}</error>\n",
                     xml_attr(r.trouble), xml_attr(r.trouble));
    s += "    </testcase>\n";
  }
  s += "  </testsuite>\n</testsuites>\n";
  out(s);
}

std::string junit_report(const Report& r) {
  std::string s;
  write_junit_report(r, [&](const std::string& piece) { s += piece; });
  return s;
}

}  // namespace dynemb
