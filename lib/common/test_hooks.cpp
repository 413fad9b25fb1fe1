#include "common/test_hooks.hpp"

#include <cstdlib>
#include <string>

#include "common/env.hpp"

namespace dynemb::test_hooks {

namespace {

// The hook's value, or null: unset, empty, or a build without hooks.
const char* value(const char* name) {
  if (!enabled()) return nullptr;
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

std::optional<int64_t> count(const char* name) {
  return enabled() ? env::count(name) : std::nullopt;
}

bool is(const char* name, const char* want) {
  const char* v = value(name);
  return v && std::string(v) == want;
}

}  // namespace

bool enabled() {
#ifdef DYNEMB_TEST_HOOKS
  return true;
#else
  return false;
#endif
}

std::optional<int64_t> slice_columns() {
  return count("DYNEMB_SLICE_COLUMNS");
}
std::optional<int64_t> destination_rows() {
  return count("DYNEMB_DESTINATION_ROWS");
}
ByDestination by_destination() {
  return is("DYNEMB_BY_DESTINATION", "off")      ? ByDestination::off
         : is("DYNEMB_BY_DESTINATION", "report") ? ByDestination::report
                                                 : ByDestination::normal;
}
bool hold_outputs_on_host() {
  return is("DYNEMB_HOLD_OUTPUTS", "host");
}
std::optional<uint64_t> device_memory() {
  return enabled() ? env::size("DYNEMB_DEVICE_MEMORY") : std::nullopt;
}
bool synth_by_destination_off() {
  return is("DYNEMB_SYNTH_BY_DESTINATION", "off");
}
std::optional<int64_t> synth_unit_rows() {
  return count("DYNEMB_SYNTH_UNIT_ROWS");
}
bool merge_no_space_check() {
  return is("DYNEMB_MERGE_NO_SPACE_CHECK", "1");
}
bool h5_serial_write() {
  return is("DYNEMB_H5_SERIAL_WRITE", "1");
}
std::optional<int64_t> backend_start_ms() {
  return count("DYNEMB_BACKEND_START_MS");
}
std::optional<int64_t> mpi_kill() {
  return count("DYNEMB_MPI_KILL");
}
bool team_split_lockstep() {
  return is("DYNEMB_TEAM_SPLIT", "lockstep");
}
const char* gpu_node() {
  return value("DYNEMB_GPU_NODE");
}

}  // namespace dynemb::test_hooks
