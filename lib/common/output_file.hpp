// Every file the tool writes goes through OutputFile (docs/robustness.md, "Nothing lost"):
//
//  * identity, not spelling: outputs are compared with the inputs and with each other by
//    device and inode after links are resolved (check_output_clashes), so `./rank1.h5`, an
//    absolute path, a symbolic link or a hard link to an input are all caught before any work;
//  * an output that is a symbolic link is written through: the file it points to is replaced and
//    the link is kept (as cp and most editors do);
//  * the temporary "<resolved target>.tmp-<pid>-<random>" is created when the OutputFile is
//    made (O_CREAT | O_EXCL | O_NOFOLLOW, so nothing planted at that name is followed or
//    truncated), and registered for removal before it exists, so an unwritable directory is
//    found before a long run and no signal can leave it behind (common/signals.hpp);
//  * commit() = fsync + rename onto the target; without --force the rename refuses a file
//    that appeared meanwhile (RENAME_NOREPLACE); destroyed without commit(), the temporary is
//    removed. commit_outputs() commits a run's outputs as one step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dynemb {

// A file named on the command line, with the role it plays ("capture", "--json", ...).
struct NamedPath {
  std::string role;
  std::string path;
};

// Throws UsageError naming both when an output is the same file as an input or as another
// output (device + inode of what each path resolves to; for outputs that do not exist yet,
// the resolved directory and name). Missing inputs are skipped (their own open reports them).
void check_output_clashes(const std::vector<NamedPath>& inputs,
                          const std::vector<NamedPath>& outputs);

// The path an output is written to: symbolic links followed (even one pointing to a file that
// does not exist yet), the directory made absolute. Throws Error when the directory does not
// exist or cannot be searched (with errno's reason).
std::string resolve_output_path(const std::string& path);

// What an OutputFile does with a file that is already at its target.
enum class Existing {
  refuse,            // synth -o, merge -o: "OUT exists (use --force to replace it)"
  replace_writable,  // reports: replaced, unless it is read-only (that needs --force)
  replace,           // --force: any regular file is replaced, a read-only one too
};

class OutputFile {
 public:
  // Resolves `target`, refuses a directory or anything but a regular file, applies `existing`
  // ("use --force ..." is the caller's hint, `force_hint`), and creates the temporary now.
  // Throws Error / UsageError naming the file and errno's reason.
  explicit OutputFile(const std::string& target, Existing existing = Existing::replace_writable,
                      const std::string& force_hint = "use --force to replace it");
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  const std::string& target() const { return target_; }      // as given
  const std::string& resolved() const { return resolved_; }  // what commit() replaces
  const std::string& temp_path() const { return temp_; }
  bool committed() const { return committed_; }

  // Appends to the temporary; throws Error naming the temporary and errno's reason (ENOSPC,
  // EFBIG, EIO...).
  void write(const std::string& bytes);
  // The path libhdf5 (or anything that opens by name) writes the temporary through: the open
  // descriptor's /proc/self/fd entry where there is one, so a name swapped in the directory
  // meanwhile is never followed; else temp_path().
  std::string open_path() const;
  // fsync the temporary, rename it onto the target, fsync the directory. A signal that comes
  // meanwhile waits until the rename is done.
  void commit();
  // Removes the temporary now (idempotent; the destructor does it too).
  void discard() noexcept;
  bool discarded() const { return discarded_; }

 private:
  friend void commit_outputs(const std::vector<OutputFile*>& files, int exit_status);
  void sync_temp();
  void rename_into_place();

  std::string target_, resolved_, temp_;
  Existing existing_ = Existing::replace_writable;
  std::string force_hint_;
  int fd_ = -1;
  int slot_ = -1;  // in the signal handler's registry
  bool committed_ = false;
  bool discarded_ = false;
};

// Commits a run's outputs as one step: every temporary synced first (a full disk fails before
// any file is replaced), then each renamed into place, with signals held until the last is;
// then the run is complete (mark_run_complete(exit_status)): a later signal ends the process
// with `exit_status`. Null and discarded entries are skipped. On an error the outputs not yet
// renamed stay uncommitted (their destructors remove the temporaries) and the error is thrown.
void commit_outputs(const std::vector<OutputFile*>& files, int exit_status);

// Unlinks every live temporary now; async-signal-safe (for the signal handlers).
void remove_registered_temps() noexcept;

// Bytes free for an unprivileged writer on the file system holding `dir`, and the process's
// file size limit (RLIMIT_FSIZE); UINT64_MAX when unknown / unlimited.
uint64_t free_bytes_at(const std::string& dir);
uint64_t file_size_limit();

// "Permission denied" etc. for errno `e`.
std::string errno_text(int e);

}  // namespace dynemb
