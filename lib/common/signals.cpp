#include "common/signals.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "common/output_file.hpp"

namespace dynemb {
namespace {

// Only lock-free atomics and async-signal-safe calls below: the handler may run on any thread,
// at any point, also inside malloc or a libhdf5 call.
std::atomic<int> g_defer_depth{0};
std::atomic<int> g_pending{0};           // the first signal that came while deferred
std::atomic<int> g_complete_status{-1};  // >= 0 once mark_run_complete ran
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

struct Named {
  int sig;
  const char* name;
};
// Signals whose default action ends the process (SIGPIPE and SIGXFSZ aside: ignored). `core`:
// a fault or a request for a core dump, whose default action runs after the clean-up.
constexpr Named kTerminating[] = {
    {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGTERM, "SIGTERM"},     {SIGUSR1, "SIGUSR1"},
    {SIGUSR2, "SIGUSR2"}, {SIGALRM, "SIGALRM"}, {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"},
    {SIGXCPU, "SIGXCPU"}, {SIGIO, "SIGIO"},     {SIGPWR, "SIGPWR"},       {SIGSTKFLT, "SIGSTKFLT"},
};
constexpr Named kCore[] = {
    {SIGQUIT, "SIGQUIT"}, {SIGABRT, "SIGABRT"}, {SIGILL, "SIGILL"},   {SIGFPE, "SIGFPE"},
    {SIGSYS, "SIGSYS"},   {SIGTRAP, "SIGTRAP"}, {SIGSEGV, "SIGSEGV"}, {SIGBUS, "SIGBUS"},
};

bool is_core_signal(int sig) {
  for (const Named& n : kCore)
    if (n.sig == sig) return true;
  return false;
}

void put_stderr(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;  // stderr closed or full: the exit status still tells
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// "SIGHUP", or "signal 40" written into `buf` (at least 16 bytes).
const char* name_or_number(int sig, char* buf) {
  if (const char* n = signal_name(sig)) return n;
  char digits[12];
  int k = 0;
  for (unsigned v = static_cast<unsigned>(sig); k == 0 || v > 0; v /= 10)
    digits[k++] = char('0' + v % 10);
  std::memcpy(buf, "signal ", 7);
  int i = 7;
  while (k > 0) buf[i++] = digits[--k];
  buf[i] = '\0';
  return buf;
}

[[noreturn]] void end_by_signal(int sig) {
  remove_registered_temps();
  char buf[24];
  const char* name = name_or_number(sig, buf);
  // SIGINT and SIGTERM keep the words people know them by; the others are named.
  if (sig == SIGINT || sig == SIGTERM) {
    put_stderr(sig == SIGINT ? "\ndynemb-dist: interrupted (" : "\ndynemb-dist: terminated (");
    put_stderr(name);
    put_stderr(")");
  } else {
    put_stderr("\ndynemb-dist: stopped by ");
    put_stderr(name);
  }
  put_stderr("; temporary files removed\n");
  if (is_core_signal(sig)) {
    // The default action (a core dump where enabled), now that nothing partial is left.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    ::raise(sig);
  }
  ::_exit(128 + sig);
}

extern "C" void on_signal(int sig) {
  const int complete = g_complete_status.load();
  if (complete >= 0) {
    remove_registered_temps();  // none should be left; a stray one is still not kept
    ::_exit(complete);
  }
  if (g_defer_depth.load() > 0) {
    int none = 0;
    g_pending.compare_exchange_strong(none, sig);
    return;
  }
  end_by_signal(sig);
}

// Installs on_signal for `sig` unless the process got it ignored (nohup, `cmd &` in a script)
// or another handler is there already (a sanitizer's). The CLI's crash handler, installed
// after, takes SIGSEGV and SIGBUS over while a capture is read.
void catch_if_default(int sig, const sigset_t& mask) {
  struct sigaction old {};
  if (sigaction(sig, nullptr, &old) != 0) return;
  const bool has_handler =
      (old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != nullptr : old.sa_handler != SIG_DFL;
  if (has_handler) return;  // SIG_IGN, or somebody's handler
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_mask = mask;  // no second handler runs inside the first
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, nullptr);
}

}  // namespace

const char* signal_name(int sig) {
  for (const Named& n : kTerminating)
    if (n.sig == sig) return n.name;
  for (const Named& n : kCore)
    if (n.sig == sig) return n.name;
  if (sig == SIGPIPE) return "SIGPIPE";
  if (sig == SIGXFSZ) return "SIGXFSZ";
  return nullptr;
}

void install_exit_signal_handlers() {
  // A command starts here: nothing held, nothing pending, the run not complete.
  g_defer_depth.store(0);
  g_pending.store(0);
  g_complete_status.store(-1);
  sigset_t mask;
  sigemptyset(&mask);
  for (const Named& n : kTerminating) sigaddset(&mask, n.sig);
  for (const Named& n : kCore) sigaddset(&mask, n.sig);
  for (int s = SIGRTMIN; s <= SIGRTMAX; ++s) sigaddset(&mask, s);
  for (const Named& n : kTerminating) catch_if_default(n.sig, mask);
  for (const Named& n : kCore) catch_if_default(n.sig, mask);
  for (int s = SIGRTMIN; s <= SIGRTMAX; ++s) catch_if_default(s, mask);
  // A closed stdout is a write error (EPIPE) reported with its file; a write past
  // RLIMIT_FSIZE is EFBIG, reported like a full disk.
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGXFSZ, SIG_IGN);
}

DeferSignals::DeferSignals() {
  g_defer_depth.fetch_add(1);
}

DeferSignals::~DeferSignals() {
  if (g_defer_depth.fetch_sub(1) != 1) return;
  const int sig = g_pending.exchange(0);
  if (sig == 0) return;
  if (g_complete_status.load() >= 0) return;  // the run is complete: it ends as it would have
  end_by_signal(sig);
}

void mark_run_complete(int exit_status) {
  g_complete_status.store(exit_status < 0 ? 2 : exit_status);
}

}  // namespace dynemb
