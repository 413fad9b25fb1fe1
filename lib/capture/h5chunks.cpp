#include "capture/h5chunks.hpp"

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "capture/h5util.hpp"
#include "engine/parallel.hpp"

namespace dynemb::h5 {
namespace {

// The filters of a dataset we can undo: shuffle (optional) then deflate (optional).
struct Pipeline {
  int shuffle_at = -1, deflate_at = -1;  // filter index in the pipeline, -1: absent
};

bool pipeline_of(hid_t dcpl, Pipeline& p) {
  const int n = H5Pget_nfilters(dcpl);
  if (n < 0 || n > 2) return false;
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, conf = 0;
    size_t nelem = 0;
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nelem, nullptr, 0, nullptr, &conf);
    if (id == H5Z_FILTER_SHUFFLE && p.shuffle_at < 0 && p.deflate_at < 0)
      p.shuffle_at = i;
    else if (id == H5Z_FILTER_DEFLATE && p.deflate_at < 0)
      p.deflate_at = i;
    else
      return false;
  }
  return true;
}

// One stored chunk: where it sits in the dataset and its bytes as stored.
struct RawChunk {
  std::vector<hsize_t> offset;
  unsigned mask = 0;  // bit i set: filter i was not applied to this chunk
  std::vector<unsigned char> bytes;
};

// Undoes the filters of `c` into `plain` (chunk_bytes long); false when it does not decode to
// exactly that size.
bool decode(const RawChunk& c, const Pipeline& p, size_t es, std::vector<unsigned char>& plain,
            std::vector<unsigned char>& tmp) {
  const size_t n = plain.size();
  const bool inflate = p.deflate_at >= 0 && !(c.mask & (1u << p.deflate_at));
  const bool unshuffle = p.shuffle_at >= 0 && !(c.mask & (1u << p.shuffle_at)) && es > 1;
  std::vector<unsigned char>& stage = unshuffle ? tmp : plain;
  stage.resize(n);
  if (inflate) {
    uLongf got = static_cast<uLongf>(n);
    if (::uncompress(stage.data(), &got, c.bytes.data(), static_cast<uLong>(c.bytes.size())) !=
            Z_OK ||
        got != n)
      return false;
  } else {
    if (c.bytes.size() != n) return false;
    std::memcpy(stage.data(), c.bytes.data(), n);
  }
  if (unshuffle) {  // byte b of element i was stored at b * (n / es) + i
    const size_t elems = n / es;
    for (size_t b = 0; b < es; ++b) {
      const unsigned char* src = &tmp[b * elems];
      for (size_t i = 0; i < elems; ++i) plain[i * es + b] = src[i];
    }
    // HDF5 leaves a tail that is not a whole element unshuffled.
    std::memcpy(&plain[elems * es], &tmp[elems * es], n - elems * es);
  }
  return true;
}

// Copies a decoded chunk into the row-major dataset buffer (edge chunks are clipped).
void place(const std::vector<unsigned char>& plain, const std::vector<hsize_t>& offset,
           const std::vector<hsize_t>& chunk, const std::vector<hsize_t>& dims, size_t es,
           unsigned char* out) {
  const size_t rank = dims.size();
  // Rows of the chunk (all dims but the last) walked as a counter; the last dim is one memcpy.
  std::vector<hsize_t> idx(rank, 0);
  const hsize_t last = rank - 1;
  const hsize_t run = std::min(chunk[last], dims[last] - offset[last]);
  while (true) {
    bool inside = true;
    size_t src = 0, dst = 0;
    for (size_t d = 0; d < rank; ++d) {
      const hsize_t x = offset[d] + idx[d];
      if (x >= dims[d]) inside = false;
      src = src * chunk[d] + idx[d];
      dst = dst * dims[d] + x;
    }
    if (inside) std::memcpy(out + dst * es, plain.data() + src * es, run * es);
    if (rank == 1) return;
    size_t d = rank - 2;  // next row
    while (true) {
      if (++idx[d] < chunk[d]) break;
      idx[d] = 0;
      if (d == 0) return;
      --d;
    }
  }
}

}  // namespace

bool read_chunks_parallel(hid_t dset, void* out, uint64_t bytes, int threads) {
  Hid dcpl = plist_id(H5Dget_create_plist(dset));
  if (!dcpl.valid() || H5Pget_layout(dcpl) != H5D_CHUNKED) return false;
  Pipeline pipe;
  if (!pipeline_of(dcpl, pipe)) return false;
  Hid t = type_id(H5Dget_type(dset));
  const H5T_class_t cls = H5Tget_class(t);
  if ((cls != H5T_INTEGER && cls != H5T_FLOAT) || H5Tget_order(t) != H5T_ORDER_LE) return false;
  const size_t es = H5Tget_size(t);
  Hid sp = space_id(H5Dget_space(dset));
  const int rank = H5Sget_simple_extent_ndims(sp);
  if (rank < 1 || rank > 8) return false;
  std::vector<hsize_t> dims(static_cast<size_t>(rank)), chunk(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
  if (H5Pget_chunk(dcpl, rank, chunk.data()) != rank) return false;
  uint64_t numel = 1, chunk_elems = 1, nchunks = 1;
  for (int d = 0; d < rank; ++d) {
    if (chunk[d] == 0) return false;
    numel *= dims[d];
    chunk_elems *= chunk[d];
    nchunks *= (dims[d] + chunk[d] - 1) / chunk[d];
  }
  if (numel * es != bytes || numel == 0) return false;
  hsize_t stored = 0;
  // The dataset's own file space: libhdf5 1.10 refuses H5S_ALL here.
  if (H5Dget_num_chunks(dset, sp, &stored) < 0 || stored != nchunks) return false;

  // The stored bytes of every chunk, read here (libhdf5 on one thread), in grid order. Their
  // total is what the file stores for the dataset, which the reader has already bounded
  // against the extent; a chunk claiming more than deflate could ever produce is refused.
  const uint64_t chunk_bytes = chunk_elems * es;
  std::vector<RawChunk> raw(static_cast<size_t>(nchunks));
  std::vector<hsize_t> at(size_t(rank), 0);
  for (hsize_t i = 0; i < nchunks; ++i) {
    RawChunk& c = raw[size_t(i)];
    c.offset = at;
    hsize_t size = 0;
    if (H5Dget_chunk_storage_size(dset, c.offset.data(), &size) < 0 || size == 0 ||
        size > chunk_bytes + (chunk_bytes >> 3) + 4096)
      return false;
    c.bytes.resize(size_t(size));
    uint32_t mask = 0;
    if (H5Dread_chunk(dset, H5P_DEFAULT, c.offset.data(), &mask, c.bytes.data()) < 0) return false;
    c.mask = mask;
    for (int d = rank - 1; d >= 0; --d) {  // next chunk of the grid, last dim fastest
      at[size_t(d)] += chunk[size_t(d)];
      if (at[size_t(d)] < dims[size_t(d)]) break;
      at[size_t(d)] = 0;
    }
  }
  std::atomic<bool> ok{true};
  parallel_for(
      threads, static_cast<int64_t>(nchunks),
      [&](int64_t b, int64_t e) {
        std::vector<unsigned char> plain(size_t(chunk_elems * es)), tmp;
        for (int64_t i = b; i < e && ok.load(std::memory_order_relaxed); ++i) {
          if (!decode(raw[size_t(i)], pipe, es, plain, tmp)) {
            ok = false;
            return;
          }
          place(plain, raw[size_t(i)].offset, chunk, dims, es, static_cast<unsigned char*>(out));
        }
      },
      /*grain=*/2);
  return ok;
}

}  // namespace dynemb::h5
