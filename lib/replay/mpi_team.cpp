// The team of a replay under a launcher (team.hpp): MPI point-to-point messages between the
// processes, and a supervising parent for each process, so that a process that dies by a signal
// (SIGKILL, the OOM killer) ends the run with exit 2 and a line naming it, not the launcher's
// 128 + N. The only file that includes mpi.h.
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>

#include "common/error.hpp"
#include "common/signals.hpp"
#include "replay/team.hpp"

#ifdef DYNEMB_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only: no MPI C++ bindings to link
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace dynemb {

namespace {

// The launcher's word for this process's place, from the environment: Open MPI's mpirun, PMIx
// (srun --mpi=pmix, Open MPI 5, Kubeflow's MPIJob through mpirun), PMI-1/2 (MPICH's hydra).
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return *end == '\0' && x >= 0 && x < (1L << 30) ? int(x) : fallback;
}

int launched_size() {
  int n = env_int("OMPI_COMM_WORLD_SIZE", -1);
  if (n < 0) n = env_int("PMI_SIZE", -1);
  if (n < 0 && std::getenv("PMIX_RANK")) n = env_int("SLURM_STEP_NUM_TASKS", -1);
  if (n < 0 && std::getenv("PMIX_RANK")) n = env_int("SLURM_NTASKS", -1);
  if (n < 0 && std::getenv("PMIX_RANK")) n = env_int("PMIX_SIZE", 2);  // asked of MPI then
  return n;
}

int launched_rank() {
  int r = env_int("OMPI_COMM_WORLD_RANK", -1);
  if (r < 0) r = env_int("PMIX_RANK", -1);
  if (r < 0) r = env_int("PMI_RANK", -1);
  return r < 0 ? 0 : r;
}

}  // namespace

bool launched_with_others() {
  return launched_size() > 1;
}

std::string launched_place() {
  return fmt::format("process {} of {}", launched_rank(), launched_size());
}

#ifndef DYNEMB_HAVE_MPI

std::shared_ptr<ReplayTeam> join_launched_team() {
  return nullptr;
}

#else

namespace {

// ------------------------------------------------------------------ the supervising parent

pid_t g_child = 0;

extern "C" void forward_signal(int sig) {
  if (g_child > 0) ::kill(g_child, sig);
}

void put_stderr(const std::string& s) {
  const char* p = s.data();
  size_t n = s.size();
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, p, n);
    if (w <= 0) return;
    p += w;
    n -= size_t(w);
  }
}

// The process the launcher started forks: the child runs the replay (and joins MPI), the parent
// only waits for it. The parent forwards every terminating signal (the launcher's SIGTERM when
// another process failed, a user's Ctrl-C); the child dies with the parent if that is killed. A
// child that ends by a signal the parent did not forward (SIGKILL, the OOM killer) ends the parent
// with exit 2 and one line naming the process: the launcher then stops the others and its own exit
// status is that 2. Returns in the child only.
void supervise() {
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) return;  // no fork to be had: the process runs unsupervised
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::raise(SIGTERM);  // the parent died before the prctl
    return;
  }
  g_child = child;
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGALRM, SIGQUIT, SIGCONT})
    sigaction(sig, &sa, nullptr);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  const char* name = sig == SIGKILL ? "SIGKILL" : signal_name(sig);
  put_stderr(fmt::format(
      "dynemb-dist: {} (pid {}) was killed by {}: the replay is incomplete and no report is "
      "written (exit 2); the launcher stops the other processes\n",
      launched_place(), child, name ? name : fmt::format("signal {}", sig)));
  ::_exit(2);
}

// ------------------------------------------------------------------ the messages

enum Tag : int { kProgress = 1, kResultSize = 2, kResultData = 3, kCarry = 4 };
constexpr int64_t kChunk = int64_t(1) << 30;  // MPI counts are int: results go in chunks

void nap() {
  const timespec t{0, 2'000'000};  // 2 ms between polls: a waiting process leaves its core free
  ::nanosleep(&t, nullptr);
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw Error(fmt::format("MPI: {} failed (error {})", what, rc));
}

class MpiTeam final : public ReplayTeam {
 public:
  MpiTeam() {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    MPI_Comm_rank(MPI_COMM_WORLD, &index_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // The processes that share this host's memory (MPI-3's shared-memory split).
    MPI_Comm host = MPI_COMM_NULL;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, index_, MPI_INFO_NULL, &host) ==
            MPI_SUCCESS &&
        host != MPI_COMM_NULL) {
      MPI_Comm_size(host, &host_size_);
      MPI_Comm_free(&host);
    }
  }
  // MPI_Finalize waits for every process: only once this one's exchange is complete. A process
  // that stops before (trouble before the replay, which every process meets alike) exits
  // without it, and the launcher stops the others.
  ~MpiTeam() override {
    if (complete_) MPI_Finalize();
  }
  void alone() { complete_ = true; }  // a team of one: finalized as it ends
  int index() const override { return index_; }
  int size() const override { return size_; }
  int host_size() const override { return host_size_; }

  // Progress goes out coalesced (a message per batch, or per 100 ms of one) and without
  // waiting: process 0 takes it in only between its own steps, and a blocking send would hold
  // this process until then.
  void send_progress(int64_t k, bool whole_batch) override {
    if (pending_[2] >= 0 && pending_[0] != k) flush_progress();
    pending_[0] = k;
    pending_[2] = 0;
    if (whole_batch)
      pending_[2] = 1;
    else
      ++pending_[1];
    const auto now = std::chrono::steady_clock::now();
    if (whole_batch || now - last_sent_ > std::chrono::milliseconds(100)) flush_progress();
  }
  void poll_progress(const ProgressFn& fn) override {
    for (;;) {
      int ready = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kProgress, MPI_COMM_WORLD, &ready, &st);
      if (!ready) return;
      int64_t m[3];
      check(
          MPI_Recv(m, 3, MPI_INT64_T, st.MPI_SOURCE, kProgress, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
          "receiving progress");
      if (!fn) continue;
      for (int64_t i = 0; i < m[1]; ++i) fn(m[0], false);
      if (m[2] == 1) fn(m[0], true);
    }
  }
  void send_result(const std::string& bytes) override {
    flush_progress();
    for (auto& [m, req] : sent_) MPI_Wait(&req, MPI_STATUS_IGNORE);
    sent_.clear();
    const int64_t n = int64_t(bytes.size());
    check(MPI_Send(&n, 1, MPI_INT64_T, 0, kResultSize, MPI_COMM_WORLD), "sending findings");
    for (int64_t at = 0; at < n; at += kChunk)
      check(MPI_Send(bytes.data() + at, int(std::min(kChunk, n - at)), MPI_CHAR, 0, kResultData,
                     MPI_COMM_WORLD),
            "sending findings");
    complete_ = true;
  }
  std::string receive_result(int q, const ProgressFn& fn) override {
    for (;;) {
      poll_progress(fn);
      int ready = 0;
      MPI_Iprobe(q, kResultSize, MPI_COMM_WORLD, &ready, MPI_STATUS_IGNORE);
      if (ready) break;
      nap();
    }
    int64_t n = 0;
    check(MPI_Recv(&n, 1, MPI_INT64_T, q, kResultSize, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
          "receiving findings");
    std::string bytes(size_t(n), '\0');
    for (int64_t at = 0; at < n; at += kChunk)
      check(MPI_Recv(bytes.data() + at, int(std::min(kChunk, n - at)), MPI_CHAR, q, kResultData,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE),
            "receiving findings");
    complete_ = q == size_ - 1;
    return bytes;
  }
  void send_carry(const std::string& bytes) override {
    check(MPI_Send(bytes.data(), int(bytes.size()), MPI_CHAR, index_ + 1, kCarry, MPI_COMM_WORLD),
          "sending the latch");
  }
  std::string receive_carry() override {
    MPI_Status st;
    for (;;) {  // polled, not a blocking receive: a waiting process leaves its core free
      int ready = 0;
      MPI_Iprobe(index_ - 1, kCarry, MPI_COMM_WORLD, &ready, &st);
      if (ready) break;
      nap();
    }
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string bytes(size_t(n), '\0');
    check(
        MPI_Recv(bytes.data(), n, MPI_CHAR, index_ - 1, kCarry, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
        "receiving the latch");
    return bytes;
  }
  // Non-blocking collectives, tested between naps: a waiting process leaves its core free, and
  // process 0 takes in progress meanwhile. A dead peer never answers: its supervising parent then
  // exits 2 and the launcher stops every process.
  std::vector<std::string> allgather(const std::string& bytes, const ProgressFn& fn) override {
    std::vector<int64_t> sizes(size_t(size_), 0);
    const int64_t mine = int64_t(bytes.size());
    MPI_Request req;
    check(MPI_Iallgather(&mine, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, MPI_COMM_WORLD, &req),
          "exchanging a batch's findings");
    wait(req, fn);
    std::vector<int> counts, at;
    int64_t total = 0;
    for (int64_t n : sizes) {
      counts.push_back(int(n));
      at.push_back(int(total));
      total += n;
      if (n < 0 || total > int64_t(INT_MAX))
        abort(fmt::format("a batch's findings come to more than 2 GiB ({} bytes)", total));
    }
    std::string all(size_t(total), '\0');
    check(MPI_Iallgatherv(bytes.data(), int(mine), MPI_CHAR, all.data(), counts.data(), at.data(),
                          MPI_CHAR, MPI_COMM_WORLD, &req),
          "exchanging a batch's findings");
    wait(req, fn);
    std::vector<std::string> out;
    for (int q = 0; q < size_; ++q)
      out.push_back(all.substr(size_t(at[size_t(q)]), size_t(sizes[size_t(q)])));
    return out;
  }
  void broadcast(std::string& bytes) override {
    check(MPI_Bcast(bytes.data(), int(bytes.size()), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  }
  [[noreturn]] void abort(const std::string& why) override {
    put_stderr(fmt::format("dynemb-dist: {}: {}; the run stops (exit 2)\n", launched_place(), why));
    MPI_Abort(MPI_COMM_WORLD, 2);
    ::_exit(2);
  }

 private:
  void wait(MPI_Request& req, const ProgressFn& fn) {
    for (;;) {
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "exchanging a batch's findings");
      if (done) return;
      if (index_ == 0) poll_progress(fn);
      nap();
    }
  }
  void flush_progress() {
    if (pending_[2] < 0) return;
    sent_.emplace_back();
    sent_.back().first = pending_;
    check(MPI_Isend(sent_.back().first.data(), 3, MPI_INT64_T, 0, kProgress, MPI_COMM_WORLD,
                    &sent_.back().second),
          "sending progress");
    pending_ = {-1, 0, -1};
    last_sent_ = std::chrono::steady_clock::now();
    while (!sent_.empty()) {  // the sends process 0 has taken in, forgotten
      int done = 0;
      MPI_Test(&sent_.front().second, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      sent_.pop_front();
    }
  }

  int index_ = 0, size_ = 1, host_size_ = 1;
  bool complete_ = false;
  // Progress not sent yet: {batch, rank-batches done, 1 when the batch is done (-1: nothing)},
  // and the sends in flight (a deque: their buffers stay where they are).
  std::array<int64_t, 3> pending_{-1, 0, -1};
  std::deque<std::pair<std::array<int64_t, 3>, MPI_Request> > sent_;
  std::chrono::steady_clock::time_point last_sent_ = std::chrono::steady_clock::now();
};

}  // namespace

std::shared_ptr<ReplayTeam> join_launched_team() {
  if (!launched_with_others()) return nullptr;
  supervise();
  auto team = std::make_shared<MpiTeam>();
  if (team->size() <= 1) {  // finalized here: the replay runs as one process
    team->alone();
    return nullptr;
  }
  return team;
}

#endif

}  // namespace dynemb
