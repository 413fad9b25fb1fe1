#include "common/input_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/env.hpp"
#include "common/error.hpp"

namespace dynemb {

double open_timeout_seconds() {
  return env::seconds("DYNEMB_OPEN_TIMEOUT").value_or(60.0);
}

std::string read_input_text(const std::string& path, const std::string& what, size_t max_bytes) {
  const auto fail = [&](const std::string& why) {
    return Error(fmt::format("{}: cannot read the {}: {}", path, what, why));
  };
  const auto too_large = [&] {
    const std::string limit = max_bytes % (size_t{1} << 20) == 0
                                  ? fmt::format("{} MiB", max_bytes >> 20)
                                  : fmt::format("{} bytes", max_bytes);
    return Error(fmt::format("{}: the {} is larger than {}; refusing it", path, what, limit));
  };
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw fail(std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw fail("it is a directory");
  // A regular file says its size; a device (/dev/zero) or a FIFO is bounded while it is read.
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes) throw too_large();
  const bool fifo = S_ISFIFO(st.st_mode);
  // A FIFO without a writer would block open() itself: open it non-blocking, then wait.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (fifo ? O_NONBLOCK : 0));
  if (fd < 0) throw fail(std::strerror(errno));
  const double limit = open_timeout_seconds();
  const auto start = std::chrono::steady_clock::now();
  std::string text;
  char buf[65536];
  bool seen_writer = false;
  for (;;) {
    if (fifo) {
      const double left =
          limit - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (limit > 0 && left <= 0) {
        ::close(fd);
        throw fail(fmt::format(
            "it is a pipe (FIFO) and reading it did not finish in {:g} s (nobody writing to "
            "it?). DYNEMB_OPEN_TIMEOUT sets the limit",
            limit));
      }
      struct pollfd p {};
      p.fd = fd;
      p.events = POLLIN;
      const int ms = limit > 0 ? static_cast<int>(std::min(left, 1.0) * 1000) + 1 : 1000;
      const int rc = ::poll(&p, 1, ms);
      if (rc < 0 && errno != EINTR) {
        const int e = errno;
        ::close(fd);
        throw fail(std::strerror(e));
      }
      if (rc <= 0) continue;
      if (!(p.revents & POLLIN) && (p.revents & POLLHUP) && !seen_writer) continue;
    }
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      const int e = errno;
      ::close(fd);
      throw fail(std::strerror(e));
    }
    if (n == 0) {
      if (fifo && !seen_writer) continue;  // no writer yet (non-blocking FIFO reads 0)
      break;
    }
    seen_writer = true;
    if (static_cast<size_t>(n) > max_bytes - text.size()) {
      ::close(fd);
      throw too_large();
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace dynemb
