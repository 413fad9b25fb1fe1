// Reading a whole text input (a plan file) with messages that say why it cannot be read
// (errno's reason: missing vs permission denied; a directory), and a time limit for a FIFO
// that nobody writes to, like the capture's open watchdog (DYNEMB_OPEN_TIMEOUT).
#pragma once

#include <cstddef>
#include <string>

namespace dynemb {

// DYNEMB_OPEN_TIMEOUT in seconds (default 60; 0 = no limit). A value that is not a
// non-negative finite number of seconds throws UsageError naming the variable and the value.
double open_timeout_seconds();

// The most a text input (a plan) may hold: plans are a few KiB.
inline constexpr size_t kMaxInputTextBytes = size_t{16} << 20;

// The whole file; throws Error "PATH: cannot read the WHAT: REASON". A FIFO is read as it is
// written, for at most open_timeout_seconds() in all. Reading stops once more than
// `max_bytes` came, whatever the file is (a regular file, /dev/zero, a FIFO that is never
// closed): Error "PATH: the WHAT is larger than 16 MiB; refusing it".
std::string read_input_text(const std::string& path, const std::string& what,
                            size_t max_bytes = kMaxInputTextBytes);

}  // namespace dynemb
