// Text from inputs (plan YAML, capture names, attributes and keys, paths, and the messages that
// carry them) made safe to show: on a terminal, in a CI log, in a JSON or JUnit report.
//
// Shown as escapes (backslash, then):
//   C0 controls and DEL   \n \r \t, the others \xNN (ESC -> \x1b, NUL -> \x00)
//   C1 controls           \uNNNN (U+0085 -> \u0085)
//   U+FFFE, U+FFFF        \ufffe \uffff (XML 1.0 forbids them)
//   invalid UTF-8         each byte that does not start a well-formed sequence: \xNN (\xff)
//   "##["                 "#\x23[" (GitHub Actions' legacy workflow commands match it anywhere)
// Printable ASCII and well-formed UTF-8 come out byte for byte; the result is valid UTF-8.
// A backslash is not doubled, so ordinary paths and messages are unchanged.
#pragma once

#include <string>
#include <string_view>

namespace dynemb {

// Whether escape_field changes `s` (a fast scan, no allocation).
bool needs_escape(std::string_view s);

// One field or one-line message: every line break becomes "\n" too, so that what was one
// finding stays one line.
std::string escape_field(std::string_view s);

// A whole text made of lines we composed (a report, a message per line): as escape_field, but
// '\n' separates lines and stays; and a line whose first non-blank characters are "::" (a
// GitHub Actions workflow command, e.g. `::add-mask::`, `::stop-commands::`) has its first ':'
// shown as \x3a. `keep_sgr` lets colour sequences (ESC [ digits/; m) through, for text whose
// fields were escaped already; `keep_commands` leaves "::" lines alone, for our own
// annotations (cli/annotations.hpp), whose fields were escaped already.
struct LineGuard {
  bool keep_sgr = false;
  bool keep_commands = false;
};
std::string escape_lines(std::string_view text, LineGuard g = {});

// Every string of a JSON document (values and object keys) through escape_field, so that the
// document dumps as valid UTF-8 and no value carries a control character or "##[". `Json` is
// nlohmann::json (a template, so that this layer needs no JSON library).
template <class Json>
void escape_json_strings(Json& j) {
  if (j.is_string()) {
    std::string& s = j.template get_ref<std::string&>();
    if (needs_escape(s)) s = escape_field(s);
  } else if (j.is_array()) {
    for (auto& x : j) escape_json_strings(x);
  } else if (j.is_object()) {
    bool keys_ok = true;
    for (auto it = j.begin(); it != j.end() && keys_ok; ++it) keys_ok = !needs_escape(it.key());
    if (keys_ok) {
      for (auto& x : j) escape_json_strings(x);
      return;
    }
    Json fixed = Json::object();
    for (auto it = j.begin(); it != j.end(); ++it) {
      Json v = std::move(it.value());
      escape_json_strings(v);
      fixed[escape_field(it.key())] = std::move(v);
    }
    j = std::move(fixed);
  }
}

}  // namespace dynemb
