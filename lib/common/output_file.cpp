#include "common/output_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <limits.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/error.hpp"
#include "common/signals.hpp"

namespace dynemb {

std::string errno_text(int e) {
  return std::strerror(e);
}

// ------------------------------------------------------------------ registry of temporaries
namespace {

// A fixed table, so that the signal handler reads it without locks or allocation: a slot is
// claimed (0 -> 2), filled, published (1); the handler unlinks every published path. A path is
// published before its file is created, so no moment exists where the file is there and the
// handler does not know it (unlinking a name that does not exist yet is harmless).
constexpr int kSlots = 32;
struct Slot {
  std::atomic<int> state{0};
  char path[PATH_MAX];
};
Slot g_slots[kSlots];
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

int register_temp(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (!g_slots[i].state.compare_exchange_strong(expected, 2)) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].state.store(1);
    return i;
  }
  return -1;  // more than kSlots live outputs: still removed by the destructor, not by a signal
}

void unregister_temp(int slot) {
  if (slot >= 0) g_slots[slot].state.store(0);
}

std::string dir_of(const std::string& p) {
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string base_of(const std::string& p) {
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

struct Identity {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string resolved;
};

bool same(const Identity& a, const Identity& b) {
  return a.exists && b.exists && a.dev == b.dev && a.ino == b.ino;
}

}  // namespace

void remove_registered_temps() noexcept {
  for (Slot& s : g_slots)
    if (s.state.load() == 1) ::unlink(s.path);
}

uint64_t free_bytes_at(const std::string& dir) {
  struct statvfs st;
  if (::statvfs(dir.c_str(), &st) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(st.f_bavail) * static_cast<uint64_t>(st.f_frsize);
}

uint64_t file_size_limit() {
  struct rlimit rl;
  if (::getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  return static_cast<uint64_t>(rl.rlim_cur);
}

// ------------------------------------------------------------------ identity

std::string resolve_output_path(const std::string& path) {
  if (path.empty()) throw UsageError("an output file name is empty");
  std::string p = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) break;
    std::string target(PATH_MAX, '\0');
    const ssize_t n = ::readlink(p.c_str(), target.data(), target.size());
    if (n < 0) break;
    target.resize(static_cast<size_t>(n));
    p = target[0] == '/' ? target : dir_of(p) + "/" + target;
  }
  const std::string base = base_of(p);
  if (base.empty() || base == "." || base == "..")
    throw Error(fmt::format("{}: is a directory; give a file name", path));
  const std::string dir = dir_of(p);
  char buf[PATH_MAX];
  if (::realpath(dir.c_str(), buf) == nullptr)
    throw Error(
        fmt::format("{}: cannot write there: directory {}: {}", path, dir, errno_text(errno)));
  const std::string rd = buf;
  return rd == "/" ? "/" + base : rd + "/" + base;
}

void check_output_clashes(const std::vector<NamedPath>& inputs,
                          const std::vector<NamedPath>& outputs) {
  auto input_id = [](const std::string& p) {
    Identity id;
    struct stat st;
    if (::stat(p.c_str(), &st) == 0) id = {true, st.st_dev, st.st_ino, ""};
    return id;
  };
  std::vector<Identity> in, out;
  for (const NamedPath& i : inputs) in.push_back(input_id(i.path));
  for (const NamedPath& o : outputs) {
    Identity id;
    id.resolved = resolve_output_path(o.path);
    struct stat st;
    if (::stat(id.resolved.c_str(), &st) == 0) {
      id.exists = true;
      id.dev = st.st_dev;
      id.ino = st.st_ino;
    }
    out.push_back(id);
  }
  for (size_t a = 0; a < outputs.size(); ++a) {
    for (size_t b = 0; b < inputs.size(); ++b)
      if (same(out[a], in[b]))
        throw UsageError(
            fmt::format("output {} ({}) is the same file as the input {} ({}){}; inputs are never "
                        "overwritten: choose another output file",
                        outputs[a].path, outputs[a].role, inputs[b].path, inputs[b].role,
                        outputs[a].path == inputs[b].path ? "" : " (same device and inode)"));
    for (size_t b = 0; b < a; ++b)
      if (same(out[a], out[b]) || out[a].resolved == out[b].resolved)
        throw UsageError(
            fmt::format("output {} ({}) is the same file as the output {} ({}); one would "
                        "overwrite the other: give each its own file",
                        outputs[a].path, outputs[a].role, outputs[b].path, outputs[b].role));
  }
}

// ------------------------------------------------------------------ OutputFile
namespace {

// 48 random bits in 8 base-32 digits: the temporary's name cannot be guessed ahead of time.
std::string random_tag() {
  uint64_t r = 0;
  if (::getrandom(&r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r)) {
    // No entropy source: O_EXCL still refuses anything planted, the name is only guessable.
    struct timespec ts {};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    r = static_cast<uint64_t>(ts.tv_nsec) * 0x9E3779B97F4A7C15ull ^
        static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&r));
  }
  static const char kDigits[] = "0123456789abcdefghijklmnopqrstuv";
  std::string tag(8, '0');
  for (char& c : tag) {
    c = kDigits[r & 31];
    r >>= 5;
  }
  return tag;
}

// "<dir>/<base>.tmp-<pid>-<tag>", the base shortened where the whole name would pass NAME_MAX
// (a 250-character output name still gets a temporary next to it).
std::string temp_name_for(const std::string& resolved) {
  const std::string suffix = fmt::format(".tmp-{}-{}", static_cast<long>(::getpid()), random_tag());
  std::string base = base_of(resolved);
  constexpr size_t kNameMax = NAME_MAX;
  if (base.size() + suffix.size() > kNameMax) base.resize(kNameMax - suffix.size());
  const std::string dir = dir_of(resolved);
  return (dir == "/" ? "" : dir) + "/" + base + suffix;
}

// No write permission bit for whoever would replace it.
bool read_only(const struct stat& st, const std::string& path) {
  if (st.st_uid == ::geteuid()) return (st.st_mode & S_IWUSR) == 0;
  return (st.st_mode & 0222) == 0 || ::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) != 0;
}

}  // namespace

OutputFile::OutputFile(const std::string& target, Existing existing, const std::string& force_hint)
    : target_(target),
      resolved_(resolve_output_path(target)),
      existing_(existing),
      force_hint_(force_hint) {
  struct stat st;
  mode_t mode = 0644;
  if (::stat(resolved_.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      throw Error(fmt::format("{}: is a directory; give a file name", target));
    if (!S_ISREG(st.st_mode))
      throw Error(fmt::format(
          "{}: not a regular file (a pipe, a socket or a device); outputs are written to a "
          "temporary file and renamed, which needs a regular file or a new name",
          target));
    if (existing == Existing::refuse)
      throw UsageError(
          fmt::format("{} exists{}", target, force_hint.empty() ? "" : " (" + force_hint + ")"));
    if (existing == Existing::replace_writable && read_only(st, resolved_))
      throw UsageError(fmt::format("{} exists and is read-only (mode {:04o}){}", target,
                                   st.st_mode & 07777,
                                   force_hint.empty() ? "" : "; " + force_hint));
    mode = st.st_mode & 07777;
  }
  // A name that exists already (planted, or left by a process with our pid) is never opened:
  // O_EXCL refuses it, and another random name is tried.
  for (int attempt = 0;; ++attempt) {
    temp_ = temp_name_for(resolved_);
    slot_ = register_temp(temp_);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ >= 0) break;
    const int e = errno;
    unregister_temp(slot_);
    slot_ = -1;
    if (e != EEXIST || attempt == 8)
      throw Error(
          fmt::format("{}: cannot create the temporary file {}: {}", target, temp_, errno_text(e)));
  }
  if (mode != 0644) ::fchmod(fd_, mode);
}

OutputFile::~OutputFile() {
  discard();
}

std::string OutputFile::open_path() const {
  if (fd_ < 0) return temp_;
  const std::string proc = fmt::format("/proc/self/fd/{}", fd_);
  struct stat a, b;
  if (::stat(proc.c_str(), &a) == 0 && ::fstat(fd_, &b) == 0 && a.st_dev == b.st_dev &&
      a.st_ino == b.st_ino)
    return proc;
  return temp_;
}

void OutputFile::write(const std::string& bytes) {
  if (fd_ < 0) throw Error(fmt::format("{}: the temporary file is closed", temp_));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("{}: cannot write (temporary file {}): {}", target_, temp_,
                              errno_text(errno)));
    }
    done += static_cast<size_t>(n);
  }
}

void OutputFile::sync_temp() {
  if (discarded_) throw Error(fmt::format("{}: not written (its temporary was removed)", target_));
  if (fd_ < 0) return;
  if (::fsync(fd_) != 0)
    throw Error(fmt::format("{}: cannot write (temporary file {}): fsync: {}", target_, temp_,
                            errno_text(errno)));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0)
    throw Error(fmt::format("{}: cannot write (temporary file {}): close: {}", target_, temp_,
                            errno_text(errno)));
}

void OutputFile::rename_into_place() {
  if (existing_ == Existing::refuse) {
    // Atomic "no --force": a file that appeared at the target since the check is kept.
    int rc = ::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, resolved_.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {  // a file system without it
      rc = ::link(temp_.c_str(), resolved_.c_str());
      if (rc == 0) ::unlink(temp_.c_str());
    }
    if (rc != 0 && errno == EEXIST)
      throw UsageError(fmt::format("{} appeared while it was being written and was kept{}", target_,
                                   force_hint_.empty() ? "" : " (" + force_hint_ + ")"));
    if (rc != 0)
      throw Error(fmt::format("{}: cannot rename the temporary file {} onto it: {}", target_, temp_,
                              errno_text(errno)));
  } else if (std::rename(temp_.c_str(), resolved_.c_str()) != 0) {
    throw Error(fmt::format("{}: cannot rename the temporary file {} onto it: {}", target_, temp_,
                            errno_text(errno)));
  }
  committed_ = true;
  unregister_temp(slot_);
  slot_ = -1;
  // The rename itself is durable once the directory is synced (best effort).
  const int dfd = ::open(dir_of(resolved_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void OutputFile::commit() {
  if (committed_) return;
  DeferSignals hold;
  sync_temp();
  rename_into_place();
}

void OutputFile::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!committed_ && !temp_.empty() && !discarded_) {
    ::unlink(temp_.c_str());
    discarded_ = true;
  }
  unregister_temp(slot_);
  slot_ = -1;
}

void commit_outputs(const std::vector<OutputFile*>& files, int exit_status) {
  DeferSignals hold;
  for (OutputFile* f : files)
    if (f && !f->committed() && !f->discarded()) f->sync_temp();
  for (OutputFile* f : files)
    if (f && !f->committed() && !f->discarded()) f->rename_into_place();
  mark_run_complete(exit_status);
}

}  // namespace dynemb
