// A backend made on another thread while its caller goes on (a GPU backend's context and
// workspace take a sizeable part of a second, which a replay spends opening the capture and
// reading its first batch instead: backends/registry.cpp, start_backend). name() answers at
// once; every other call waits until `make` has returned, then goes to what it made, or
// rethrows what it threw (every call alike). The thread ends before the backend goes.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/backend.hpp"

namespace dynemb {

std::unique_ptr<Backend> make_starting_backend(std::string name,
                                               std::function<std::unique_ptr<Backend>()> make);

}  // namespace dynemb
