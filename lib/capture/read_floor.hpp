// The read floor of a capture (`dynemb-dist bench CAPTURE --read-floor`, docs/cli.md): every
// dataset of the file read whole and inflated on every core, no check of what it holds; the
// least any replay of that file could take on this machine's CPU.
#pragma once

#include <cstdint>
#include <string>

namespace dynemb {

struct ReadFloor {
  int64_t datasets = 0;        // reachable by hard links, each object once
  uint64_t logical_bytes = 0;  // sum of element count x element size (bench/h5py_read.py's count)
  uint64_t stored_bytes = 0;   // sum of what the file stores for them (H5Dget_storage_size)
  uint64_t largest_bytes = 0;  // the one reused buffer: the largest dataset's logical bytes
  double seconds = 0;          // steady clock over the reads (each dataset opened and read)
  int threads = 0;             // workers that inflate chunks
};

// Reads every dataset of the HDF5 file `path` into one buffer of the largest dataset's size:
// chunked ones by h5::read_chunks_parallel on `threads` workers (<= 0: one per core), what it
// declines by H5Dread after h5::check_chunks, variable-length strings by the bounds-checked
// string reader. Not timed: opening the file and the walk that sizes the buffer.
// Throws CaptureError naming the file and the dataset: not an HDF5 file, a damaged chunk or
// header, an element type it cannot read (variable-length other than strings).
ReadFloor read_floor(const std::string& path, int threads = 0);

}  // namespace dynemb
