#include "common/console.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/safe_text.hpp"

namespace dynemb::console {

namespace {

std::atomic<int> g_stdout_errno{0};

void remember(int e) {
  int none = 0;
  g_stdout_errno.compare_exchange_strong(none, e != 0 ? e : EIO);
}

void write_out(const std::string& s) {
  if (s.empty() || g_stdout_errno.load() != 0) return;  // a broken stdout takes nothing more
  errno = 0;
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) remember(errno);
}

void write_err(const std::string& s) {
  if (!s.empty()) (void)std::fwrite(s.data(), 1, s.size(), stderr);  // nowhere to report it
}

}  // namespace

void init() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // open() returns the lowest free descriptor: this one, as the lower ones are open.
    const int got = ::open("/dev/null", fd == 0 ? O_WRONLY : O_RDONLY);
    if (got >= 0 && got != fd) ::close(got);
  }
}

void out(std::string_view text) {
  write_out(escape_lines(text));
}

void out_coloured(std::string_view text) {
  write_out(escape_lines(text, LineGuard{true, false}));
}

void out_annotations(std::string_view text) {
  write_out(escape_lines(text, LineGuard{false, true}));
}

void err(std::string_view text) {
  write_err(escape_lines(text));
}

void err_annotations(std::string_view text) {
  write_err(escape_lines(text, LineGuard{false, true}));
}

void error_line(std::string_view message) {
  flush();  // what stdout holds comes first
  err("dynemb-dist: error: " + escape_field(message) + "\n");
}

void message_line(std::string_view message) {
  flush();
  err(escape_field(message) + "\n");
}

void flush() {
  if (g_stdout_errno.load() != 0) return;
  errno = 0;
  if (std::fflush(stdout) != 0) remember(errno);
}

int stdout_error() {
  return g_stdout_errno.load();
}

int finish(int status) {
  flush();
  // Something written around the console (CLI11's --help through std::cout) fails only here.
  if (g_stdout_errno.load() == 0 && std::ferror(stdout)) remember(EIO);
  const int e = g_stdout_errno.load();
  if (e == 0) return status;
  err(fmt::format("dynemb-dist: error: stdout: {}\n", std::strerror(e)));
  return 2;
}

}  // namespace dynemb::console
