// Reading a chunked dataset by its raw chunks, with decompression on every core.
//
// libhdf5 is not thread-safe, and its own H5Dread inflates every chunk on the calling thread.
// Here libhdf5 only hands over each chunk's stored bytes (H5Dread_chunk, on the caller's
// thread); undoing deflate and shuffle and placing the chunk into the dataset's row-major
// buffer runs on `threads` workers. Only the layout our writers and h5py's
// `compression="gzip", shuffle=True` produce is taken: chunked, filters among shuffle and
// deflate (shuffle first), every chunk written, a little-endian fixed-size element. Anything
// else, and any chunk that does not decode to exactly its size, returns false with nothing
// promised about `out`: the caller then reads with H5Dread, whose checks and messages apply.
#pragma once

#include <hdf5.h>

#include <cstdint>

namespace dynemb::h5 {

// `out`: the whole dataset in the file's element type, row-major, `bytes` long.
bool read_chunks_parallel(hid_t dset, void* out, uint64_t bytes, int threads);

}  // namespace dynemb::h5
