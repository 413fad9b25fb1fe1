// How the process ends when a signal comes (docs/robustness.md, "Every way a process ends").
//
// Every signal whose default action ends the process is caught, unless the process was
// started with it ignored (nohup, a shell's background job) or another handler was installed
// first (a sanitizer's): the handler removes every live temporary (common/output_file.hpp),
// prints one line on stderr and exits 128 + the signal's number, so no partial output is
// ever left behind by anything but SIGKILL. SIGPIPE is ignored: a write to a closed pipe
// fails with EPIPE and is reported like any other write error; SIGXFSZ is ignored, so a write
// past `ulimit -f` fails with EFBIG. Signals that mean a fault or ask for a core (SIGQUIT,
// SIGABRT, SIGILL, SIGFPE, SIGSYS, SIGTRAP) remove the temporaries and then take their
// default action, core dump included.
//
// The outputs of a run are committed as one step (commit_outputs): a signal that comes while
// they are being renamed into place waits until all are, and once they are, the run is
// complete: a later signal ends the process with the run's own exit status, not 128 + N.
#pragma once

namespace dynemb {

// Installs the handlers described above, with the run's state new (not complete, no signal
// held). Call it once, as the command starts, before the first output exists.
void install_exit_signal_handlers();

// While one exists (nestable), a terminating signal is recorded instead of acted on. When the
// last one ends, a recorded signal is acted on then, unless the run was marked complete.
class DeferSignals {
 public:
  DeferSignals();
  ~DeferSignals();
  DeferSignals(const DeferSignals&) = delete;
  DeferSignals& operator=(const DeferSignals&) = delete;
};

// Every output of the run is in place: from now on a terminating signal exits with
// `exit_status` (what the run itself is about to return).
void mark_run_complete(int exit_status);

// "SIGHUP" for SIGHUP, "signal 40" for an unnamed one; async-signal-safe (a static table).
const char* signal_name(int sig);

}  // namespace dynemb
