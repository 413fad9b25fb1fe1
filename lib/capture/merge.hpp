// One capture (capture-format.md) from the per-rank files that the dynemb_capture package
// (python/) writes in a live job: `dynemb-dist merge rank*.h5 -o capture.h5`.
//
// A per-rank file is a v1 capture plus the root attribute `rank` = r, holding only
// /batches/<k>/rank<r>. The merge checks that the files agree on format, world size, number
// of batches, plan text and oracle, that every rank 0..W-1 appears exactly once and that each
// file holds exactly its own rank group for every batch; then it copies the groups verbatim
// (H5Ocopy keeps dtypes, chunking and filters) into "<out>.tmp-<pid>", checks the result with
// check_capture() against its plan, and renames it onto OUT.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dynemb {

struct MergeOptions {
  std::vector<std::string> inputs;  // the per-rank files, in any order
  std::string output;
  bool force = false;  // replace OUT if it exists
};

struct MergeResult {
  int64_t files = 0;
  int64_t num_batches = 0;
  int64_t world_size = 0;
};

// on_writing(text): what the merge writes now ("merge: writing OUT.tmp-<pid>"), "" once done,
// for a crash handler to name (libhdf5 1.10 can crash inside H5Ocopy when a write fails).
// Throws CaptureError naming the per-rank file and HDF5 path of the first problem (the merged
// file's own, from the file its object was copied from), UsageError when a rank has no file,
// Error when OUT cannot be made or cannot fit. The per-rank files are never modified; OUT is
// written only complete and checked.
MergeResult merge_captures(const MergeOptions& options,
                           const std::function<void(const std::string&)>& on_writing = {});

}  // namespace dynemb
