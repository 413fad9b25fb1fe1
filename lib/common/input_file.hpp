// Reading a whole text input (a plan file) with messages that say why it cannot be read
// (errno's reason: missing vs permission denied; a directory), and a time limit for a FIFO
// that nobody writes to, like the capture's open watchdog (DYNEMB_OPEN_TIMEOUT).
#pragma once

#include <string>

namespace dynemb {

// DYNEMB_OPEN_TIMEOUT in seconds (default 60; 0 = no limit).
double open_timeout_seconds();

// The whole file; throws Error "PATH: cannot read the WHAT: REASON". A FIFO is read as it is
// written, for at most open_timeout_seconds() in all.
std::string read_input_text(const std::string& path, const std::string& what);

}  // namespace dynemb
