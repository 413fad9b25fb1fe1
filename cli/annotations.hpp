// CI annotations (`--annotations github|none`): GitHub Actions workflow commands
// `::error file=F,line=L,title=T::message`, which the runner turns into annotations on the
// file in the pull request. Default: github when the environment has GITHUB_ACTIONS=true (as
// every GitHub Actions step has), none otherwise.
#pragma once

#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "common/safe_text.hpp"

namespace dynemb::cli {

inline bool annotations_enabled(const std::string& option) {
  if (option == "github") return true;
  if (option == "none") return false;
  const char* gha = std::getenv("GITHUB_ACTIONS");
  return gha && std::string(gha) == "true";
}

// Escaping of the workflow-command syntax: the message loses only %, CR and LF; property
// values (file, title) also ':' and ',', which separate the properties. First escape_field
// (common/safe_text.hpp): no control character or invalid UTF-8 of an input reaches the log.
inline std::string gha_escape(const std::string& text, bool property) {
  const std::string s = escape_field(text);
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '%':
        out += "%25";
        break;
      case '\r':
        out += "%0D";
        break;
      case '\n':
        out += "%0A";
        break;
      case ':':
        out += property ? "%3A" : ":";
        break;
      case ',':
        out += property ? "%2C" : ",";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

// One annotation line: `level` is error, warning or notice; line <= 0 leaves line (and col) out.
// Written with console::out_annotations (or err_annotations), the one way a line that begins
// with "::" reaches stdout or stderr.
inline std::string gha_annotation(const std::string& level, const std::string& file, int line,
                                  int col, const std::string& title, const std::string& message) {
  std::string props;
  if (!file.empty()) props += "file=" + gha_escape(file, true);
  if (line > 0) {
    props += (props.empty() ? "" : ",") + std::string("line=") + std::to_string(line);
    if (col > 0) props += ",col=" + std::to_string(col);
  }
  if (!title.empty()) props += (props.empty() ? "" : ",") + ("title=" + gha_escape(title, true));
  return "::" + level + (props.empty() ? "" : " " + props) + "::" + gha_escape(message, false) +
         "\n";
}

}  // namespace dynemb::cli
