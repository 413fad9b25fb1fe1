// Reading and writing a chunked dataset by its raw chunks, with (de)compression on every core.
//
// libhdf5 is not thread-safe, and its own H5Dread / H5Dwrite run every chunk through the
// filter pipeline on the calling thread. Here libhdf5 only moves each chunk's stored bytes
// (H5Dread_chunk / H5Dwrite_chunk, on the caller's thread); deflate and shuffle, and moving a
// chunk between the dataset's row-major buffer and the chunk, run on `threads` workers.
// Only the layout our writers and h5py's `compression="gzip", shuffle=True` produce is taken:
// chunked, filters among shuffle and deflate (shuffle first), a fixed-size element (reading:
// every chunk read is stored, a little-endian integer or float; reading rows: chunks of whole
// rows). Anything else is declined and the caller uses H5Dread / H5Dwrite, whose checks and
// messages apply.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dynemb::h5 {

// A chunk that cannot be one of its dataset's (its record or its bytes): which dataset, and
// "chunk 3 (offset 192): stored 100 bytes, unfiltered chunk needs 512".
struct ChunkTrouble {
  hid_t dset = -1;
  std::string what;
};

// `out`: the whole dataset in the file's element type, row-major, `bytes` long. False when the
// layout is not taken or a chunk does not decode to exactly its size, with nothing promised
// about `out`: the caller then reads with H5Dread (after check_chunks). When the false is for a
// chunk whose stored size or filter mask is inconsistent with the dataset's chunk shape and
// pipeline, or that does not decode to exactly its size, `trouble` (when given) says which:
// the file is damaged, and no other read of the dataset may be tried. Memory beyond `out`: a
// window of 4 x `threads` stored chunks and a chunk buffer per worker. `threads` <= 0: one
// per core.
bool read_chunks_parallel(hid_t dset, void* out, uint64_t bytes, int threads,
                          ChunkTrouble* trouble = nullptr);

// Rows [ranges[i].first, ranges[i].second) along the first dimension of `dset` (for a 1-D
// dataset: elements), whole in every other dimension, concatenated into `out` in the order of
// `ranges` (sorted, non-overlapping, non-empty, inside the extent: the caller checks). `out`
// holds sum of range rows x row_bytes bytes in the file's element type. Each stored chunk that
// any range touches is read and decoded once per call, however many ranges it serves.
// False when the layout is not taken (the same rules as read_chunks_parallel, plus: chunks must
// span every dimension but the first), or a chunk does not decode to its size; nothing is
// promised about `out` then, and the caller reads with H5Dread and a hyperslab selection.
// `threads` <= 0: one per core. Memory beyond `out`: a window of stored chunks and a chunk
// buffer per worker, as read_chunks_parallel.
bool read_rows_parallel(hid_t dset, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                        void* out, int threads, ChunkTrouble* trouble = nullptr);

// Rows of several datasets at once (each as above): their chunks are read and decoded as one
// stream, so that a few rows of each of many datasets (a destination rank's rows of every
// sender) keep every worker busy. False as soon as one dataset is declined.
struct Layout;
struct RowsRead {
  hid_t dset = -1;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  void* out = nullptr;
  // readable_layout(dset) when the caller keeps it (a dataset read many times); null: looked
  // up here, one H5Dget_create_plist per call.
  std::shared_ptr<const Layout> layout;
};
// The layout of `dset` as the read path takes it, or null when it is declined.
std::shared_ptr<const Layout> readable_layout(hid_t dset);
// The same with the dataset's creation property list given (H5Dget_create_plist copies it).
std::shared_ptr<const Layout> readable_layout(hid_t dset, hid_t dcpl);
bool read_rows_parallel(const std::vector<RowsRead>& reads, int threads,
                        ChunkTrouble* trouble = nullptr);

// "" when the dataset's filters are ones this reader undoes (none, shuffle, deflate), else
// which one it cannot ("filter lzf (id 32000) cannot be decoded: ..."). libhdf5 would report
// an unavailable filter as "can't open directory <plugin path>".
std::string filters_trouble(hid_t dset);
// The same from the dataset's creation property list (H5Dget_create_plist copies it: a caller
// that holds it passes it on).
std::string filters_trouble_of(hid_t dcpl);

// True when every stored chunk of `dset` (when chunked) has a record consistent with the
// chunk shape and pipeline and decodes to exactly its size; else `why` names the first that
// does not ("chunk 3 (offset 192): deflate stream decodes to 100 bytes, chunk needs 512") or
// the filter (filters_trouble). libhdf5 1.10's H5Dread copies a whole chunk out of whatever
// a chunk decodes to (out of bounds when shorter): every H5Dread of a chunked dataset is
// preceded by this. Serial; decodes each chunk once (`decode_too` = false: only the records,
// from the chunk index, no chunk read). A grid of more than `max_grid` chunks is not checked
// (true): one index look-up per chunk of the grid.
bool check_chunks(hid_t dset, std::string& why, bool decode_too = true,
                  uint64_t max_grid = UINT64_MAX);
// The same with the dataset's creation property list given.
bool check_chunks(hid_t dset, hid_t dcpl, std::string& why, bool decode_too = true,
                  uint64_t max_grid = UINT64_MAX);

// The names (relative to the root, "batches/0/rank0/ids") of every hard link reachable from
// `file`, in H5Lvisit's order (by name, groups depth first); false with `why` when libhdf5
// cannot list them.
bool hard_link_names(hid_t file, std::vector<std::string>& names, std::string& why);

// check_chunks of every dataset reachable from `file` by hard links; false with the first
// bad dataset's absolute `path` and `why`.
bool check_chunks_under(hid_t file, std::string& path, std::string& why, bool decode_too,
                        uint64_t max_grid = UINT64_MAX);

enum class ChunkWrite {
  declined,  // not this layout (or DYNEMB_H5_SERIAL_WRITE is set): nothing was written
  written,   // every chunk is in the file
  failed,    // some chunks may be in the file; `error` says what failed
};

// `data`: the whole dataset, row-major, `bytes` long, in `mem_type`, which must be the
// dataset's own element type (no conversion). The file gets the bytes H5Dwrite would store:
// each chunk padded to its full size with zeros (a dataset with a user-defined fill value is
// declined), shuffled, compressed with compress2 at the level of the deflate filter, and
// written in the order of the chunk grid (last dimension fastest), which is the order HDF5's
// chunk cache flushes them in when at most one chunk fits in it (chunks larger than half the
// cache, as our writer's ~1 MiB ones) or there is one chunk: other layouts are declined.
// Memory: at most 2 x `threads` compressed chunks wait to be written.
// The environment variable DYNEMB_H5_SERIAL_WRITE=1 declines every dataset (the H5Dwrite
// path, for comparing the two). `threads` <= 0: one per core.
ChunkWrite write_chunks_parallel(hid_t dset, hid_t mem_type, const void* data, uint64_t bytes,
                                 int threads, std::string& error);

// The library that undoes deflate on the read path, with its version ("libdeflate 1.14",
// "zlib 1.2.13"): libdeflate when the build found it (DYNEMB_LIBDEFLATE), zlib otherwise.
// Compression always uses zlib: its output is what HDF5's deflate filter stores.
std::string inflate_library();

}  // namespace dynemb::h5
