// The DYNEMB_* environment variables, each judged here: a value that means nothing
// (DYNEMB_MEMORY_LIMIT=lots, DYNEMB_OPEN_TIMEOUT=-5) is refused with UsageError
// "DYNEMB_X='VALUE': WHY" (exit 2), never silently ignored, which would leave the setting
// seeming in force. Unset or empty: nullopt, the default.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace dynemb::env {

// Seconds: a number from 0 to 1e9.
std::optional<double> seconds(const char* name);
// A count: a whole number >= 1.
std::optional<int64_t> count(const char* name);
// A size in bytes, as parse_size reads it (4G, 512M, 1.5GiB): more than 0.
std::optional<uint64_t> size(const char* name);
// One of `allowed`.
std::optional<std::string> choice(const char* name, std::initializer_list<const char*> allowed);

// Every variable above that this program reads, judged at once: main_entry calls it before a
// command runs, so that a bad value is exit 2 before any work, not wherever it is first read.
void check_all();

}  // namespace dynemb::env
