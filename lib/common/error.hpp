// Errors carry what and where; only cli/ turns them into exit codes.
//
//   PlanError     -> "plan.yaml:12:5: error: tables[1].embedding_dim: ..."  (exit 2)
//   CaptureError  -> "capture.h5:/batches/3/rank1/lengths: sum 812 != ..."  (exit 2)
//   UsageError    -> bad command line                                      (exit 2)
//   DeviceError   -> CUDA/NCCL failure with file:line and the call text     (exit 2)
//
// A *mismatch* (capture disagrees with what the plan implies) is not an exception: it is
// a finding in a report, and the run goes on (exit 1).
#pragma once

#include <stdexcept>
#include <string>

namespace dynemb {

// Base of every error the tool reports as "trouble" (exit status 2).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UsageError : public Error {
 public:
  using Error::Error;
};

// Position inside a text file, 1-based; line == 0 means "whole file".
struct SourceLoc {
  std::string file;
  int line = 0;
  int col = 0;
  std::string str() const {
    if (line <= 0) return file;
    return file + ":" + std::to_string(line) + ":" + std::to_string(col);
  }
};

class PlanError : public Error {
 public:
  PlanError(SourceLoc loc, const std::string& msg)
      : Error(loc.str() + ": error: " + msg), loc_(std::move(loc)), msg_(msg) {}
  const SourceLoc& loc() const { return loc_; }
  const std::string& message() const { return msg_; }

 private:
  SourceLoc loc_;
  std::string msg_;
};

// An HDF5 capture that cannot be read as capture-format.md says.
class CaptureError : public Error {
 public:
  CaptureError(const std::string& file, const std::string& h5path, const std::string& msg)
      : Error(file + ":" + h5path + ": " + msg), file_(file), path_(h5path), msg_(msg) {}
  const std::string& file() const { return file_; }
  const std::string& h5path() const { return path_; }
  const std::string& message() const { return msg_; }

 private:
  std::string file_, path_, msg_;
};

class DeviceError : public Error {
 public:
  using Error::Error;
};

}  // namespace dynemb
