// The process's stdout and stderr. Nothing here throws: a write that fails (a full disk, a
// closed pipe: EPIPE, since SIGPIPE is ignored) is remembered, the run goes on, and
// `finish` turns a failed stdout into exit status 2 with "dynemb-dist: error: stdout: <why>"
// on stderr (nothing, when stderr is broken too). Whatever goes out passes the line guard of
// common/safe_text.hpp: no control character, no invalid UTF-8, no line that GitHub Actions
// would run as a workflow command, whatever a plan or capture holds.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>

namespace dynemb::console {

// First thing of the process: a closed fd 0, 1 or 2 is given /dev/null opened the wrong way
// round (reads of 0 and writes of 1 and 2 fail), so that no file opened later lands on it and
// takes our messages. (SIGPIPE is ignored by install_exit_signal_handlers, common/signals.hpp.)
void init();

void out(std::string_view text);              // stdout, through escape_lines
void out_coloured(std::string_view text);     // stdout, our colour sequences kept (fields escaped)
void out_annotations(std::string_view text);  // stdout, our own `::` lines (gha_annotation)
void err(std::string_view text);              // stderr, through escape_lines
void err_annotations(std::string_view text);  // stderr, our own `::` lines
// "dynemb-dist: error: MESSAGE" on stderr, the message as one line (escape_field).
void error_line(std::string_view message);
// A message as it is (PlanError: "file:line:col: error: ..."), as one line.
void message_line(std::string_view message);

template <typename... T>
void outf(fmt::format_string<T...> f, T&&... args) {
  out(fmt::format(f, std::forward<T>(args)...));
}
template <typename... T>
void errf(fmt::format_string<T...> f, T&&... args) {
  err(fmt::format(f, std::forward<T>(args)...));
}

// Pushes stdout's buffer out (progress that a CI log should see now); a failure is remembered.
void flush();
// The errno of the first failed write to stdout, 0 while none failed.
int stdout_error();
// The end of a run: flushes stdout; `status` unless stdout failed, then 2 (and the message).
int finish(int status);

}  // namespace dynemb::console
