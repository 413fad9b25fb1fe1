// The process's start, for wall-time reports that account for the time outside their steps.
#pragma once

#include <chrono>

namespace dynemb {

namespace detail {
// Set during static initialisation, before main(); what the dynamic loader did before that is
// not counted.
inline const std::chrono::steady_clock::time_point process_start = std::chrono::steady_clock::now();
}  // namespace detail

inline std::chrono::steady_clock::time_point process_started() {
  return detail::process_start;
}

}  // namespace dynemb
