// A backend that holds the output dists' outputs on the host, as a device backend holds them
// where it makes them (Backend::hold_outputs): the sink gets each output's dtype and shape with
// no data, and the checks compare the held output. It keeps the lookups made for a dist only
// (Backend::lookup_for_dist) the same way, handing back their shapes. It wraps any backend and
// forwards every other call.
//
// Why: the replay's held paths (a check that never brings an output back, a dist on kept
// lookups) otherwise run only where a GPU is; with this wrapper around the CPU reference they run
// everywhere, so their reports can be compared with the unheld ones on any machine (the test hook
// DYNEMB_HOLD_OUTPUTS=host, backends/registry.cpp). A held output lives until the next output
// dist or hold_outputs call, as on the device.
#pragma once

#include <memory>

#include "engine/backend.hpp"

namespace dynemb {

std::unique_ptr<Backend> make_holding_backend(std::unique_ptr<Backend> inner);

}  // namespace dynemb
