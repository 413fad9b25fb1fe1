// Test hooks: environment variables that make the tests' comparisons possible (a batch forced
// over column slices, one destination at a time, or whole; outputs kept on the host as a device
// keeps them; a merge without its free-space check). They are read only by a build configured
// with -DDYNEMB_TEST_HOOKS=ON (the test suite's); any other build ignores them, so a user's
// environment never changes what a replay checks. Each value is checked (env.hpp) before any
// work.
#pragma once

#include <cstdint>
#include <optional>

namespace dynemb::test_hooks {

// Whether this build reads the hooks below.
bool enabled();

// DYNEMB_SLICE_COLUMNS=n: a replay's column slices have at most n columns.
std::optional<int64_t> slice_columns();
// DYNEMB_DESTINATION_ROWS=n: a by-destination unit has at most n rows.
std::optional<int64_t> destination_rows();
// DYNEMB_BY_DESTINATION=off: every batch runs whole; =report: stderr says how each batch ran.
enum class ByDestination : uint8_t { normal, off, report };
ByDestination by_destination();
// DYNEMB_HOLD_OUTPUTS=host: the CPU backend keeps what a step may keep, in host memory.
bool hold_outputs_on_host();
// DYNEMB_DEVICE_MEMORY=size (with DYNEMB_HOLD_OUTPUTS=host): the CPU backend says it has this
// much device memory for what it keeps, so that a replay sizes its column slices as it does
// for a GPU (Backend::device_memory_for_kept).
std::optional<uint64_t> device_memory();
// DYNEMB_SYNTH_BY_DESTINATION=off: synth makes every batch's output dist whole.
bool synth_by_destination_off();
// DYNEMB_SYNTH_UNIT_ROWS=n: synth's by-destination units have at most n rows.
std::optional<int64_t> synth_unit_rows();
// DYNEMB_MERGE_NO_SPACE_CHECK=1: merge skips its free-space check.
bool merge_no_space_check();
// DYNEMB_H5_SERIAL_WRITE=1: the capture writer writes through libhdf5 alone, not its chunk path.
bool h5_serial_write();
// DYNEMB_MPI_KILL=q: under a launcher, process q of the replay SIGKILLs itself as its first
// batch begins (how a killed process ends the run).
std::optional<int64_t> mpi_kill();
// DYNEMB_GPU_NODE=FILE: the file start_backend takes for the GPU's device node instead of
// /dev/nvidia0 (null: unset): a CUDA build on a machine without a GPU points it at /dev/null to
// take the path of a device node without a usable device.
const char* gpu_node();
// DYNEMB_TEAM_SPLIT=lockstep: under a launcher, the replay takes the lockstep split that
// --backend nccl takes (every process replays every batch whole and records only its ranks'
// checks; replay.hpp TeamSplit) on any backend, and each process says so on stderr.
bool team_split_lockstep();
// DYNEMB_BACKEND_START_MS=n: a backend that start_backend makes at once (the CPU reference) is
// handed over from another thread only n ms later, as a GPU backend's start is (BackendStartup),
// so that what the replay does while its backend starts runs on any machine.
std::optional<int64_t> backend_start_ms();

}  // namespace dynemb::test_hooks
