// common/safe_text.hpp: what an input string looks like once it may be shown (exact texts).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <initializer_list>
#include <string>

#include "common/safe_text.hpp"

using dynemb::escape_field;
using dynemb::escape_json_strings;
using dynemb::escape_lines;
using dynemb::LineGuard;
using namespace std::string_literals;

TEST_CASE("escape_field: printable ASCII and valid UTF-8 unchanged") {
  CHECK(escape_field("") == "");
  CHECK(escape_field("tables[1].name: t_0 'x' \"y\" \\ a:b::c #1 ##") ==
        "tables[1].name: t_0 'x' \"y\" \\ a:b::c #1 ##");
  CHECK(escape_field("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xef\xbf\xbd") ==
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xef\xbf\xbd");
}

TEST_CASE("escape_field: C0 controls, DEL, C1 controls") {
  CHECK(escape_field("a\nb") == "a\\nb");
  CHECK(escape_field("a\r\tb") == "a\\r\\tb");
  CHECK(escape_field("\x1b[2J\x07") == "\\x1b[2J\\x07");
  CHECK(escape_field("t\0x"s) == "t\\x00x");
  CHECK(escape_field("\x7f\x01\x1f") == "\\x7f\\x01\\x1f");
  CHECK(escape_field("a\xc2\x85"
                     "b\xc2\x9b"
                     "c") == "a\\u0085b\\u009bc");  // NEL, CSI
  CHECK(escape_field("\xc2\xa0") == "\xc2\xa0");    // U+00A0 is text
  CHECK(escape_field("\xef\xbf\xbe\xef\xbf\xbf") == "\\ufffe\\uffff");
}

TEST_CASE("escape_field: invalid UTF-8, byte by byte") {
  CHECK(escape_field("\xff") == "\\xff");
  CHECK(escape_field("t\xfe\xff.h5") == "t\\xfe\\xff.h5");
  CHECK(escape_field("\xc3") == "\\xc3");                             // truncated
  CHECK(escape_field("\xc3(") == "\\xc3(");                           // bad continuation
  CHECK(escape_field("\xc0\xaf") == "\\xc0\\xaf");                    // overlong '/'
  CHECK(escape_field("\xe0\x80\xaf") == "\\xe0\\x80\\xaf");           // overlong
  CHECK(escape_field("\xed\xa0\x80") == "\\xed\\xa0\\x80");           // surrogate U+D800
  CHECK(escape_field("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  CHECK(escape_field("\x80"
                     "a") == "\\x80a");                           // lone continuation
  CHECK(escape_field("\xe2\x82") == "\\xe2\\x82");                // truncated 3-byte
  CHECK(escape_field("\xf4\x8f\xbf\xbf") == "\xf4\x8f\xbf\xbf");  // U+10FFFF is well-formed
}

TEST_CASE("escape_field: GitHub Actions' legacy command prefix, anywhere") {
  CHECK(escape_field("x ##[add-mask]secret") == "x #\\x23[add-mask]secret");
  CHECK(escape_field("###[") == "##\\x23[");
  CHECK(escape_field("::add-mask::x") == "::add-mask::x");  // a field is not a line
}

TEST_CASE("escape_lines: line breaks kept, a workflow command at a line's start defused") {
  CHECK(escape_lines("a\nb\n") == "a\nb\n");
  CHECK(escape_lines("\n\n") == "\n\n");
  CHECK(escape_lines("# x\n::add-mask::s\n") == "# x\n\\x3a:add-mask::s\n");
  CHECK(escape_lines("  ::stop-commands::t") == "  \\x3a:stop-commands::t");
  CHECK(escape_lines("\xe3\x80\x80\xc2\xa0::error::m") == "\xe3\x80\x80\xc2\xa0\\x3a:error::m");
  CHECK(escape_lines("\t::error::m") == "\\t::error::m");  // after an escape: not at the start
  CHECK(escape_lines("a ::b::") == "a ::b::");
  CHECK(escape_lines("a\r::error::m\n") == "a\\r::error::m\n");
  CHECK(escape_lines("\x1b[31;1mFAIL\x1b[0m\x1b]0;t\x07") ==
        "\\x1b[31;1mFAIL\\x1b[0m\\x1b]0;t\\x07");
  CHECK(escape_lines("x ##[group]y\n") == "x #\\x23[group]y\n");
}

TEST_CASE("escape_lines: the guard's options") {
  const LineGuard colour{true, false}, commands{false, true};
  CHECK(escape_lines("\x1b[31;1mFAIL\x1b[0m \x1b]0;t\x07\n", colour) ==
        "\x1b[31;1mFAIL\x1b[0m \\x1b]0;t\\x07\n");
  CHECK(escape_lines("::error file=a::m\n", commands) == "::error file=a::m\n");
  CHECK(escape_lines("::error file=a::m\x1b\n", commands) == "::error file=a::m\\x1b\n");
}

TEST_CASE("needs_escape: exactly when escape_field changes the text") {
  for (const std::string& s : std::initializer_list<std::string>{
           "", "plain ascii", "caf\xc3\xa9", "a\nb", "\xff", "a ##[b", "##", "\xc2\x85", "\xc2\xa0",
           "\xef\xbf\xbf", "\xed\xa0\x80", std::string("t\0x", 3)})
    CHECK(dynemb::needs_escape(s) == (escape_field(s) != s));
  CHECK_FALSE(dynemb::needs_escape("caf\xc3\xa9"));
  CHECK(dynemb::needs_escape("a ##[b"));
}

TEST_CASE("escape_json_strings: values and keys, nested") {
  nlohmann::json j = {
      {"name", "t\n\xff"}, {"list", {"ok", "\x1b", 3}}, {"where", {{"f\x01", "x"}}}, {"n", 1.5}};
  escape_json_strings(j);
  CHECK(j.dump() ==
        R"({"list":["ok","\\x1b",3],"n":1.5,"name":"t\\n\\xff","where":{"f\\x01":"x"}})");
}
