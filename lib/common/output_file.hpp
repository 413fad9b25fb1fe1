// Every file the tool writes goes through OutputFile (docs/robustness.md, "Nothing lost"):
//
//  * identity, not spelling: outputs are compared with the inputs and with each other by
//    device and inode after links are resolved (check_output_clashes), so `./rank1.h5`, an
//    absolute path, a symbolic link or a hard link to an input are all caught before any work;
//  * an output that is a symbolic link is written through: the file it points to is replaced
//    and the link is kept (as cp and most editors do);
//  * the temporary "<resolved target>.tmp-<pid>" is created when the OutputFile is made, so an
//    unwritable directory is found before a long run, not after it;
//  * commit() = fsync + rename onto the target; destroyed without commit(), the temporary is
//    removed; SIGINT / SIGTERM remove every live temporary (a process-wide registry read by an
//    async-signal-safe handler) and exit 130 / 143.
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

class OutputFile {
 public:
  // Resolves `target`, refuses a directory or anything but a regular file, refuses an existing
  // file unless `overwrite` ("use --force" is the caller's hint, `force_hint`), and creates the
  // temporary now. Throws Error / UsageError naming the file and errno's reason.
  explicit OutputFile(const std::string& target, bool overwrite = true,
                      const std::string& force_hint = "");
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
  // fsync the temporary, rename it onto the target, fsync the directory.
  void commit();
  // Removes the temporary now (idempotent; the destructor does it too).
  void discard() noexcept;

 private:
  std::string target_, resolved_, temp_;
  int fd_ = -1;
  int slot_ = -1;  // in the signal handler's registry
  bool committed_ = false;
};

// SIGINT / SIGTERM: unlink every live temporary, print one line, _exit(130 / 143). SIGXFSZ is
// ignored, so a write past RLIMIT_FSIZE fails with EFBIG (an error with a message) instead of
// killing the process. Idempotent.
void install_interrupt_handlers();

// Unlinks every live temporary now; async-signal-safe (for the CLI's crash handler).
void remove_registered_temps() noexcept;

// Bytes free for an unprivileged writer on the file system holding `dir`, and the process's
// file size limit (RLIMIT_FSIZE); UINT64_MAX when unknown / unlimited.
uint64_t free_bytes_at(const std::string& dir);
uint64_t file_size_limit();

// "Permission denied" etc. for errno `e`.
std::string errno_text(int e);

}  // namespace dynemb
