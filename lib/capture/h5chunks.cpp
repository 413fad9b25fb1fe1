#include "capture/h5chunks.hpp"

#include <zlib.h>
#if defined(DYNEMB_HAVE_LIBDEFLATE)
#include <libdeflate.h>
#endif

#include <fmt/format.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "capture/h5util.hpp"
#include "common/parallel.hpp"
#include "common/test_hooks.hpp"
#include "common/trace.hpp"

namespace dynemb::h5 {
namespace {

// The filters of a dataset we can undo: shuffle (optional) then deflate (optional).
struct Pipeline {
  int shuffle_at = -1, deflate_at = -1;  // filter index in the pipeline, -1: absent
  int level = -1;                        // deflate's level (its cd_values[0])
};

bool pipeline_of(hid_t dcpl, Pipeline& p) {
  const int n = H5Pget_nfilters(dcpl);
  if (n < 0 || n > 2) return false;
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, conf = 0, cd[4] = {0, 0, 0, 0};
    size_t nelem = 4;
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nelem, cd, 0, nullptr, &conf);
    if (id == H5Z_FILTER_SHUFFLE && p.shuffle_at < 0 && p.deflate_at < 0) {
      p.shuffle_at = i;
    } else if (id == H5Z_FILTER_DEFLATE && p.deflate_at < 0) {
      p.deflate_at = i;
      if (nelem >= 1 && cd[0] <= 9) p.level = static_cast<int>(cd[0]);
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

// What both directions need to know of a dataset taken by the chunk path.
struct Layout {
  Hid dcpl, type;
  Pipeline pipe;
  size_t es = 0;                     // element size in bytes
  std::vector<hsize_t> dims, chunk;  // extent and chunk shape, rank 1..8
  uint64_t numel = 1, chunk_elems = 1, nchunks = 1;
  int nfilters = 0;
  uint64_t chunk_bytes() const { return chunk_elems * es; }

  // The grid index (last dimension fastest) of the chunk at dataset offset `off`.
  uint64_t index_of(const std::vector<hsize_t>& off) const {
    uint64_t i = 0;
    for (size_t d = 0; d < dims.size(); ++d)
      i = i * ((dims[d] + chunk[d] - 1) / chunk[d]) + off[d] / chunk[d];
    return i;
  }
  // The grid coordinates of chunk i (grid order: last dimension fastest) as a dataset offset.
  void offset_of(uint64_t i, std::vector<hsize_t>& off) const {
    off.resize(dims.size());
    for (size_t d = dims.size(); d-- > 0;) {
      const uint64_t per = (dims[d] + chunk[d] - 1) / chunk[d];
      off[d] = (i % per) * chunk[d];
      i /= per;
    }
  }
};

namespace {

// Chunked, a pipeline of shuffle/deflate, rank 1..8, a non-empty extent.
bool layout_of(hid_t dset, Layout& L, hid_t dcpl = H5I_INVALID_HID) {
  // The caller's list, with a reference of L's own (closed with L), or the dataset's.
  if (dcpl >= 0 && H5Iinc_ref(dcpl) >= 0)
    L.dcpl = plist_id(dcpl);
  else
    L.dcpl = plist_id(H5Dget_create_plist(dset));
  if (!L.dcpl.valid() || H5Pget_layout(L.dcpl) != H5D_CHUNKED) return false;
  if (!pipeline_of(L.dcpl, L.pipe)) return false;
  L.nfilters = H5Pget_nfilters(L.dcpl);
  L.type = type_id(H5Dget_type(dset));
  if (!L.type.valid()) return false;
  L.es = H5Tget_size(L.type);
  if (L.es == 0) return false;
  Hid sp = space_id(H5Dget_space(dset));
  const int rank = H5Sget_simple_extent_ndims(sp);
  if (rank < 1 || rank > 8) return false;
  L.dims.assign(size_t(rank), 0);
  L.chunk.assign(size_t(rank), 0);
  H5Sget_simple_extent_dims(sp, L.dims.data(), nullptr);
  if (H5Pget_chunk(L.dcpl, rank, L.chunk.data()) != rank) return false;
  for (int d = 0; d < rank; ++d) {
    if (L.chunk[size_t(d)] == 0) return false;
    L.numel *= L.dims[size_t(d)];
    L.chunk_elems *= L.chunk[size_t(d)];
    L.nchunks *= (L.dims[size_t(d)] + L.chunk[size_t(d)] - 1) / L.chunk[size_t(d)];
  }
  return L.numel > 0;
}

// Calls run(src, dst, n) for each row of the chunk at `offset` that lies inside the extent:
// element src of the chunk (row-major in the chunk shape) and element dst of the dataset
// (row-major in the extent) start a run of n elements along the last dimension.
template <class Fn>
void for_each_row(const Layout& L, const std::vector<hsize_t>& offset, Fn&& run) {
  const size_t rank = L.dims.size();
  std::vector<hsize_t> idx(rank, 0);
  const size_t last = rank - 1;
  const hsize_t n = std::min(L.chunk[last], L.dims[last] - offset[last]);
  while (true) {  // rows of the chunk (all dims but the last) walked as a counter
    bool inside = true;
    size_t src = 0, dst = 0;
    for (size_t d = 0; d < rank; ++d) {
      const hsize_t x = offset[d] + idx[d];
      if (x >= L.dims[d]) inside = false;
      src = src * L.chunk[d] + idx[d];
      dst = dst * L.dims[d] + x;
    }
    if (inside) run(src, dst, size_t(n));
    if (rank == 1) return;
    size_t d = rank - 2;  // next row
    while (true) {
      if (++idx[d] < L.chunk[d]) break;
      idx[d] = 0;
      if (d == 0) return;
      --d;
    }
  }
}

bool is_edge(const Layout& L, const std::vector<hsize_t>& offset) {
  for (size_t d = 0; d < L.dims.size(); ++d)
    if (offset[d] + L.chunk[d] > L.dims[d]) return true;
  return false;
}

// HDF5's shuffle filter: byte b of element i goes to b * elems + i; nothing is moved for
// 1-byte elements or a chunk of one element, and a tail that is not a whole element stays.
bool shuffles(const Pipeline& p, unsigned mask, size_t es, size_t n) {
  return p.shuffle_at >= 0 && !(mask & (1u << p.shuffle_at)) && es > 1 && n / es > 1;
}
// Byte b of element i <-> b * elems + i, for the element sizes our captures hold as constants
// (the compiler unrolls the byte loop), any other size through the general loop.
template <size_t ES, bool Forward>
void transpose(const unsigned char* in, size_t elems, size_t es_dyn, unsigned char* out) {
  const size_t es = ES ? ES : es_dyn;
  for (size_t i = 0; i < elems; ++i)
    for (size_t b = 0; b < es; ++b) {
      if (Forward)
        out[b * elems + i] = in[i * es + b];
      else
        out[i * es + b] = in[b * elems + i];
    }
}
#if defined(__SSE2__)
// The unshuffle of 16 elements at a time for 2-, 4- and 8-byte elements: one 16-byte load from
// each byte plane, then log2(es) rounds of byte/word/dword interleaves put each element's bytes
// together (the scalar loop's gather of one byte per plane does not vectorise). Returns how
// many leading elements it did; the caller does the rest.
size_t unshuffle_sse2(const unsigned char* in, size_t elems, size_t es, unsigned char* out) {
  const size_t done = elems / 16 * 16;
  auto plane = [&](size_t b, size_t i) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + b * elems + i));
  };
  auto store = [&](size_t i, size_t k, __m128i v) {  // the k-th 16 bytes of elements i..i+15
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i * es + 16 * k), v);
  };
  for (size_t i = 0; i < done; i += 16) {
    if (es == 2) {
      const __m128i p0 = plane(0, i), p1 = plane(1, i);
      store(i, 0, _mm_unpacklo_epi8(p0, p1));
      store(i, 1, _mm_unpackhi_epi8(p0, p1));
    } else if (es == 4) {
      const __m128i p0 = plane(0, i), p1 = plane(1, i), p2 = plane(2, i), p3 = plane(3, i);
      // [bytes 0,1] and [bytes 2,3] of elements 0-7 (lo) and 8-15 (hi)
      const __m128i a_lo = _mm_unpacklo_epi8(p0, p1), a_hi = _mm_unpackhi_epi8(p0, p1);
      const __m128i b_lo = _mm_unpacklo_epi8(p2, p3), b_hi = _mm_unpackhi_epi8(p2, p3);
      store(i, 0, _mm_unpacklo_epi16(a_lo, b_lo));
      store(i, 1, _mm_unpackhi_epi16(a_lo, b_lo));
      store(i, 2, _mm_unpacklo_epi16(a_hi, b_hi));
      store(i, 3, _mm_unpackhi_epi16(a_hi, b_hi));
    } else {               // es == 8
      __m128i pair[4][2];  // pair[j]: bytes 2j, 2j+1 of elements 0-7 ([0]) and 8-15 ([1])
      for (size_t j = 0; j < 4; ++j) {
        const __m128i lo = plane(2 * j, i), hi = plane(2 * j + 1, i);
        pair[j][0] = _mm_unpacklo_epi8(lo, hi);
        pair[j][1] = _mm_unpackhi_epi8(lo, hi);
      }
      for (size_t h = 0; h < 2; ++h) {  // elements 8h .. 8h+7
        // qAB: bytes 0-3 (A = 0) or 4-7 (A = 1) of elements 8h+4B .. 8h+4B+3
        const __m128i q00 = _mm_unpacklo_epi16(pair[0][h], pair[1][h]);
        const __m128i q01 = _mm_unpackhi_epi16(pair[0][h], pair[1][h]);
        const __m128i q10 = _mm_unpacklo_epi16(pair[2][h], pair[3][h]);
        const __m128i q11 = _mm_unpackhi_epi16(pair[2][h], pair[3][h]);
        store(i, 4 * h + 0, _mm_unpacklo_epi32(q00, q10));
        store(i, 4 * h + 1, _mm_unpackhi_epi32(q00, q10));
        store(i, 4 * h + 2, _mm_unpacklo_epi32(q01, q11));
        store(i, 4 * h + 3, _mm_unpackhi_epi32(q01, q11));
      }
    }
  }
  return done;
}
#endif

template <bool Forward>
void transpose_any(const unsigned char* in, size_t n, size_t es, unsigned char* out) {
  const size_t elems = n / es;
#if defined(__SSE2__)
  if (!Forward && (es == 2 || es == 4 || es == 8)) {
    const size_t done = unshuffle_sse2(in, elems, es, out);
    for (size_t i = done; i < elems; ++i)
      for (size_t b = 0; b < es; ++b) out[i * es + b] = in[b * elems + i];
    std::memcpy(out + elems * es, in + elems * es, n - elems * es);
    return;
  }
#endif
  switch (es) {
    case 2:
      transpose<2, Forward>(in, elems, es, out);
      break;
    case 4:
      transpose<4, Forward>(in, elems, es, out);
      break;
    case 8:
      transpose<8, Forward>(in, elems, es, out);
      break;
    default:
      transpose<0, Forward>(in, elems, es, out);
      break;
  }
  std::memcpy(out + elems * es, in + elems * es, n - elems * es);
}
void shuffle(const unsigned char* in, size_t n, size_t es, unsigned char* out) {
  transpose_any<true>(in, n, es, out);
}
void unshuffle(const unsigned char* in, size_t n, size_t es, unsigned char* out) {
  transpose_any<false>(in, n, es, out);
}

// Undoes deflate's zlib stream into exactly `n` bytes; "" then, else why not ("deflate stream
// decodes to 100 bytes, chunk needs 16384"). One per worker thread (libdeflate's decompressor
// holds its tables).
#if defined(DYNEMB_HAVE_LIBDEFLATE)
class Inflater {
 public:
  Inflater() : d_(libdeflate_alloc_decompressor()) {}
  ~Inflater() {
    if (d_) libdeflate_free_decompressor(d_);
  }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  // libdeflate checks the adler32 of the stream as zlib does.
  std::string operator()(const unsigned char* in, size_t in_n, unsigned char* out, size_t n) {
    if (!d_) return "no memory for a deflate decompressor";
    size_t got = 0;
    switch (libdeflate_zlib_decompress(d_, in, in_n, out, n, &got)) {
      case LIBDEFLATE_SUCCESS:
        if (got == n) return "";
        [[fallthrough]];
      case LIBDEFLATE_SHORT_OUTPUT:
        return fmt::format("deflate stream decodes to {} bytes, chunk needs {}", got, n);
      case LIBDEFLATE_INSUFFICIENT_SPACE:
        return fmt::format("deflate stream decodes to more than the {} bytes the chunk needs", n);
      default:
        return fmt::format("stored {} bytes that are not a valid deflate stream", in_n);
    }
  }

 private:
  libdeflate_decompressor* d_;
};
#else
class Inflater {
 public:
  std::string operator()(const unsigned char* in, size_t in_n, unsigned char* out, size_t n) {
    uLongf got = static_cast<uLongf>(n);
    const int rc = ::uncompress(out, &got, in, static_cast<uLong>(in_n));
    if (rc == Z_OK && got == n) return "";
    if (rc == Z_OK)
      return fmt::format("deflate stream decodes to {} bytes, chunk needs {}", got, n);
    if (rc == Z_BUF_ERROR)
      return fmt::format(
          "deflate stream decodes to more than the {} bytes the chunk needs, or "
          "is cut short",
          n);
    return fmt::format("stored {} bytes that are not a valid deflate stream", in_n);
  }
};
#endif

// One stored chunk: where it sits in the dataset and its bytes as stored.
struct RawChunk {
  std::vector<hsize_t> offset;
  unsigned mask = 0;  // bit i set: filter i was not applied to this chunk
  std::vector<unsigned char> bytes;
};

// Why a chunk's record (filter mask, stored size) cannot be a chunk of L, "" when it can:
// without deflate a chunk stores exactly its bytes (shuffle keeps the size), with it at most
// what deflate makes of them. libhdf5 1.10 trusts both (it copies a whole chunk out of a
// shorter buffer), so this runs before any chunk is decoded, by us or by H5Dread.
std::string record_trouble(const Pipeline& p, int nfilters, unsigned mask, uint64_t size,
                           uint64_t chunk_bytes) {
  if (nfilters < 32 && (mask >> nfilters) != 0)
    return fmt::format("filter mask {:#x} skips filters the dataset does not have ({} filters)",
                       mask, nfilters);
  const bool deflated = p.deflate_at >= 0 && !(mask & (1u << p.deflate_at));
  if (!deflated && size != chunk_bytes) {
    const bool shuffled = p.shuffle_at >= 0 && !(mask & (1u << p.shuffle_at));
    return fmt::format("stored {} bytes, {} chunk needs {}", size,
                       shuffled ? "a shuffled, not deflated" : "unfiltered", chunk_bytes);
  }
  if (deflated && (size == 0 || size > chunk_bytes + (chunk_bytes >> 3) + 4096))
    return fmt::format("stored {} bytes, not what deflate makes of a {}-byte chunk", size,
                       chunk_bytes);
  return "";
}

// Undoes the filters of `c` into `plain` (n bytes); "" then, else why it does not decode to
// exactly that size. `tmp`: the shuffled bytes, when the chunk was shuffled.
std::string decode(const RawChunk& c, const Pipeline& p, size_t es, Inflater& inflater,
                   unsigned char* plain, size_t n, std::vector<unsigned char>& tmp) {
  const bool inflate = p.deflate_at >= 0 && !(c.mask & (1u << p.deflate_at));
  const bool unshuf = shuffles(p, c.mask, es, n);
  if (unshuf) tmp.resize(n);
  unsigned char* stage = unshuf ? tmp.data() : plain;
  if (inflate) {
    std::string why = inflater(c.bytes.data(), c.bytes.size(), stage, n);
    if (!why.empty()) return why;
  } else {
    if (c.bytes.size() != n)
      return fmt::format("stored {} bytes, unfiltered chunk needs {}", c.bytes.size(), n);
    std::memcpy(stage, c.bytes.data(), n);
  }
  if (unshuf) unshuffle(tmp.data(), n, es, plain);
  return "";
}

bool serial_write_forced() {
  return test_hooks::h5_serial_write();
}

std::string offset_str(const std::vector<hsize_t>& off) {
  return fmt::format("[{}]", fmt::join(off, ", "));
}

// "chunk 3 (offset 192)" (1-D) or "chunk 5 (offset [64, 0])": how a message names a chunk.
std::string chunk_name(uint64_t index, const std::vector<hsize_t>& off) {
  return off.size() == 1 ? fmt::format("chunk {} (offset {})", index, off[0])
                         : fmt::format("chunk {} (offset {})", index, offset_str(off));
}

}  // namespace

std::string inflate_library() {
#if defined(DYNEMB_HAVE_LIBDEFLATE)
  return std::string("libdeflate ") + LIBDEFLATE_VERSION_STRING;
#else
  return std::string("zlib ") + zlibVersion();
#endif
}

namespace {

// A worker's inflater and chunk buffers, kept across windows (a fresh 1 MiB buffer per window
// would be fresh pages to fault in).
struct Worker {
  Inflater inflater;
  std::vector<unsigned char> plain, tmp;

  std::string why;  // why the last decode failed

  // Decodes `c` (a whole chunk of L's shape) into `at`; false (with `why`) when it does not.
  bool into(const RawChunk& c, const Layout& L, unsigned char* at) {
    why = decode(c, L.pipe, L.es, inflater, at, size_t(L.chunk_bytes()), tmp);
    return why.empty();
  }
  // Decodes `c` into this worker's chunk buffer; nullptr (with `why`) when it does not decode.
  const unsigned char* buffered(const RawChunk& c, const Layout& L) {
    plain.resize(size_t(L.chunk_bytes()));
    return into(c, L, plain.data()) ? plain.data() : nullptr;
  }
};

// Workers kept between calls: a wide batch read one destination at a time makes a call per
// destination, each of a chunk or two, and a worker's decompressor and chunk buffer cost more
// to make than such a read. At most one per hardware thread is kept (a call's most): what they
// hold between calls is what one call held at its peak.
class KeptWorkers {
 public:
  std::unique_ptr<Worker> take() {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!kept_.empty()) {
        std::unique_ptr<Worker> w = std::move(kept_.back());
        kept_.pop_back();
        return w;
      }
    }
    return std::make_unique<Worker>();
  }
  void give(std::unique_ptr<Worker> w) {
    std::lock_guard<std::mutex> lock(m_);
    if (kept_.size() < size_t(hardware_threads())) kept_.push_back(std::move(w));
  }

 private:
  std::mutex m_;
  std::vector<std::unique_ptr<Worker>> kept_;
};
KeptWorkers& kept_workers() {
  static KeptWorkers* k = new KeptWorkers;  // never destroyed: workers may outlive main's statics
  return *k;
}

// The layouts the read path takes: layout_of's, of little-endian integers or floats.
bool readable(hid_t dset, Layout& L, hid_t dcpl = H5I_INVALID_HID) {
  if (!layout_of(dset, L, dcpl)) return false;
  const H5T_class_t cls = H5Tget_class(L.type);
  return (cls == H5T_INTEGER || cls == H5T_FLOAT) && H5Tget_order(L.type) == H5T_ORDER_LE;
}

}  // namespace

std::shared_ptr<const Layout> readable_layout(hid_t dset) {
  return readable_layout(dset, H5I_INVALID_HID);
}

std::shared_ptr<const Layout> readable_layout(hid_t dset, hid_t dcpl) {
  auto L = std::make_shared<Layout>();
  if (!readable(dset, *L, dcpl)) return nullptr;
  return L;
}

namespace {

// How far the fetch of a window's stored chunks has come: chunks [0, done) are fetched; once
// `stopped`, no more will be (the window is fetched, or a chunk could not be).
class Fetched {
 public:
  void publish(uint64_t done) {
    {
      std::lock_guard<std::mutex> lock(m_);
      done_ = done;
    }
    cv_.notify_all();
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stopped_ = true;
    }
    cv_.notify_all();
  }
  // Waits until chunk i is fetched (true) or will not be (false).
  bool wait_for(uint64_t i) {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return done_ > i || stopped_; });
    return done_ > i;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  uint64_t done_ = 0;
  bool stopped_ = false;
};

// Reads the stored bytes of chunks 0..n-1 (offset(k, off) sets `off` to chunk k's dataset
// offset and returns its dataset and that dataset's layout: the chunks may be of several
// datasets) here, a window of 4 x `threads` at a time (libhdf5 on this thread only), and calls
// place(k, chunk, worker) for each on the workers as soon as it is fetched, which decodes it and
// puts its bytes where they belong: the fetch of a window's later chunks overlaps the decode of
// its first ones. Memory beyond the output is one window of stored chunks and a worker's
// buffers per thread decoding. False as soon as a chunk is not stored or cannot be read
// (declined: the caller checks and reads otherwise), or a chunk's record is inconsistent or
// place says false (a bad chunk: `trouble` says which and why, when given; of two, the first).
template <class Offset, class Place>
bool decode_chunks(uint64_t n, int threads, ChunkTrouble* trouble, Offset&& offset, Place&& place) {
  if (threads <= 0) threads = hardware_threads();
  const uint64_t window = std::min<uint64_t>(n, uint64_t(4 * threads));
  std::vector<RawChunk> raw(static_cast<size_t>(window));
  std::vector<std::pair<hid_t, const Layout*>> of(static_cast<size_t>(window));
  const auto bad = [&](uint64_t i, const std::string& why) {
    if (trouble) {
      const auto [dset, L] = of[size_t(i)];
      trouble->dset = dset;
      trouble->what =
          chunk_name(L->index_of(raw[size_t(i)].offset), raw[size_t(i)].offset) + ": " + why;
    }
    return false;
  };
  for (uint64_t first = 0; first < n; first += window) {
    const uint64_t count = std::min(window, n - first);
    // The fetch: which chunk stopped it (count: none) and why ("": declined, not bad).
    Fetched fetched;
    uint64_t fetch_stop = count;
    std::string fetch_why;
    std::exception_ptr fetch_error;
    // Chunk i of the window fetched; false (with fetch_why when it is bad) when it cannot be.
    const auto fetch_one = [&](uint64_t i) {
      RawChunk& c = raw[size_t(i)];
      of[size_t(i)] = offset(first + i, c.offset);
      const auto [dset, L] = of[size_t(i)];
      unsigned mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info_by_coord(dset, c.offset.data(), &mask, &addr, &size) < 0) {
        last_error();
        return false;
      }
      if (addr == HADDR_UNDEF) return false;  // not stored: fill values, H5Dread's
      fetch_why = record_trouble(L->pipe, L->nfilters, mask, size, L->chunk_bytes());
      if (!fetch_why.empty()) return false;
      c.bytes.resize(size_t(size));
      uint32_t mask2 = 0;
      if (H5Dread_chunk(dset, H5P_DEFAULT, c.offset.data(), &mask2, c.bytes.data()) < 0) {
        last_error();
        return false;
      }
      c.mask = mask2;
      return true;
    };
    const std::function<void()> fetch_all = [&] {
      const TraceSpan raw_span("raw chunks", int64_t(count));
      try {
        for (uint64_t i = 0; i < count; ++i) {
          if (!fetch_one(i)) {
            fetch_stop = i;
            break;
          }
          fetched.publish(i + 1);
        }
      } catch (...) {  // no memory for a chunk's bytes
        fetch_error = std::current_exception();
        fetch_stop = 0;
      }
      fetched.stop();
    };
    // The decode: the first chunk that did not decode (count: none) and why, and the first
    // exception (of the lowest chunk); a chunk after a failed one is not decoded.
    std::mutex m;
    std::atomic<uint64_t> failed{count};
    std::string failed_why;
    std::exception_ptr error;
    uint64_t error_at = count;
    const TraceSpan decode_span("decode", int64_t(count));
    const std::function<void(int64_t)> decode_one = [&](int64_t t) {
      const uint64_t i = uint64_t(t);
      if (!fetched.wait_for(i) || i > failed.load(std::memory_order_relaxed)) return;
      std::unique_ptr<Worker> w;
      try {
        w = kept_workers().take();
        if (!place(first + i, raw[size_t(i)], *w)) {
          std::lock_guard<std::mutex> lk(m);
          if (i < failed.load()) {
            failed = i;
            failed_why = w->why;
          }
        }
      } catch (...) {
        std::lock_guard<std::mutex> lk(m);
        if (i < error_at) error_at = i, error = std::current_exception();
      }
      if (w) kept_workers().give(std::move(w));
    };
    run_on_pool(int64_t(count), decode_one, fetch_all);
    if (error) std::rethrow_exception(error);
    if (failed < count) return bad(failed, failed_why);  // before any chunk the fetch stopped at
    if (fetch_error) std::rethrow_exception(fetch_error);
    if (fetch_stop < count) return fetch_why.empty() ? false : bad(fetch_stop, fetch_why);
  }
  return true;
}

// Elements in one row (every dimension but the first) and whether a chunk spans them all.
uint64_t row_elems_of(const Layout& L, bool& whole_rows) {
  uint64_t row_elems = 1;
  whole_rows = true;
  for (size_t d = 1; d < L.dims.size(); ++d) {
    row_elems *= L.dims[d];
    whole_rows = whole_rows && L.chunk[d] == L.dims[d];
  }
  return row_elems;
}

}  // namespace

bool read_chunks_parallel(hid_t dset, void* out, uint64_t bytes, int threads,
                          ChunkTrouble* trouble) {
  Layout L;
  if (!readable(dset, L) || L.numel * L.es != bytes) return false;
  // Every chunk written. The dataset's own dataspace, not H5S_ALL: libhdf5 1.10 refuses
  // H5S_ALL here ("invalid dataspace identifier"), which would send every read to H5Dread.
  Hid fsp = space_id(H5Dget_space(dset));
  hsize_t stored = 0;
  if (H5Dget_num_chunks(dset, fsp, &stored) < 0 || stored != L.nchunks) return false;

  // Every chunk, in grid order.
  unsigned char* dst = static_cast<unsigned char*>(out);
  const size_t es = L.es;
  // A chunk inside the extent whose rows are whole dataset rows (every dimension but the first
  // spanned) is one contiguous run of the output: decoded straight into it.
  bool whole_rows = true;
  const uint64_t row_elems = row_elems_of(L, whole_rows);
  return decode_chunks(
      L.nchunks, threads, trouble,
      [&](uint64_t k, std::vector<hsize_t>& off) {
        L.offset_of(k, off);
        return std::pair<hid_t, const Layout*>(dset, &L);
      },
      [&](uint64_t, const RawChunk& c, Worker& w) {
        if (whole_rows && !is_edge(L, c.offset))
          return w.into(c, L, dst + c.offset[0] * row_elems * es);
        const unsigned char* plain = w.buffered(c, L);
        if (!plain) return false;
        for_each_row(L, c.offset, [&](size_t src, size_t at, size_t n) {
          std::memcpy(dst + at * es, plain + src * es, n * es);
        });
        return true;
      });
}

namespace {

// What read_rows_parallel reads of one dataset. Chunks span every dimension but the first:
// the grid is 1-D along rows, chunk j holding rows [j * R, (j + 1) * R) (the last one cut by
// the extent). Each range is cut at chunk edges into pieces; a chunk's pieces are contiguous
// in `pieces`, chunks in row order.
struct RowPlan {
  hid_t dset = -1;
  std::shared_ptr<const Layout> L_;  // the caller's (RowsRead::layout), or looked up here
  const Layout& L() const { return *L_; }
  uint64_t R = 0, row_bytes = 0;
  struct Piece {
    uint64_t row, n;  // rows [row, row + n) of the chunk
    uint64_t at;      // where they go in `out`, in bytes
  };
  std::vector<uint64_t> chunks;     // grid index of each chunk read
  std::vector<size_t> first_piece;  // chunk k's pieces: [first_piece[k], first_piece[k + 1])
  std::vector<Piece> pieces;
  unsigned char* dst = nullptr;

  bool make(const RowsRead& r) {
    dset = r.dset;
    dst = static_cast<unsigned char*>(r.out);
    L_ = r.layout ? r.layout : readable_layout(dset);
    if (!L_) return false;
    const Layout& L = *L_;
    bool whole_rows = true;
    row_bytes = row_elems_of(L, whole_rows) * L.es;
    if (!whole_rows) return false;
    R = L.chunk[0];
    const uint64_t nrows = L.dims[0];
    uint64_t at = 0, end = 0;
    for (const auto& rg : r.ranges) {
      // The caller checks; a range out of order or outside the extent is declined, not read.
      if (rg.first >= rg.second || rg.first < end || rg.second > nrows) return false;
      end = rg.second;
      for (uint64_t row = rg.first; row < rg.second;) {
        const uint64_t j = row / R, n = std::min(rg.second, (j + 1) * R) - row;
        if (chunks.empty() || chunks.back() != j) {
          chunks.push_back(j);
          first_piece.push_back(pieces.size());
        }
        pieces.push_back({row - j * R, n, at});
        at += n * row_bytes;
        row += n;
      }
    }
    first_piece.push_back(pieces.size());
    return true;
  }

  // Chunk k of this plan decoded by `w` and its pieces put in place.
  bool place(uint64_t k, const RawChunk& c, Worker& w) const {
    const Piece* p = pieces.data() + first_piece[size_t(k)];
    const size_t np = first_piece[size_t(k) + 1] - first_piece[size_t(k)];
    // A whole chunk inside the extent for one piece is one run of `out`.
    if (np == 1 && p->n == R) return w.into(c, L(), dst + p->at);
    const unsigned char* plain = w.buffered(c, L());
    if (!plain) return false;
    for (size_t i = 0; i < np; ++i)
      std::memcpy(dst + p[i].at, plain + p[i].row * row_bytes, p[i].n * row_bytes);
    return true;
  }
};

}  // namespace

bool read_rows_parallel(hid_t dset, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                        void* out, int threads, ChunkTrouble* trouble) {
  return read_rows_parallel({RowsRead{dset, ranges, out, nullptr}}, threads, trouble);
}

bool read_rows_parallel(const std::vector<RowsRead>& reads, int threads, ChunkTrouble* trouble) {
  std::vector<RowPlan> plans(reads.size());
  std::vector<uint64_t> base{0};  // plan i's chunks are [base[i], base[i + 1]) of the stream
  for (size_t i = 0; i < reads.size(); ++i) {
    if (!plans[i].make(reads[i])) return false;
    base.push_back(base.back() + plans[i].chunks.size());
  }
  const auto plan_of = [&](uint64_t k) {
    return size_t(std::upper_bound(base.begin(), base.end(), k) - base.begin()) - 1;
  };
  // No H5Dget_num_chunks (it walks the whole chunk index, where a few rows may be wanted):
  // decode_chunks declines a needed chunk that is not stored.
  return decode_chunks(
      base.back(), threads, trouble,
      [&](uint64_t k, std::vector<hsize_t>& off) {
        const RowPlan& p = plans[plan_of(k)];
        off.assign(p.L().dims.size(), 0);
        off[0] = p.chunks[size_t(k - base[plan_of(k)])] * p.R;
        return std::pair<hid_t, const Layout*>(p.dset, &p.L());
      },
      [&](uint64_t k, const RawChunk& c, Worker& w) {
        const size_t i = plan_of(k);
        return plans[i].place(k - base[i], c, w);
      });
}

std::string filters_trouble(hid_t dset) {
  Hid dcpl = plist_id(H5Dget_create_plist(dset));
  if (!dcpl.valid()) return "unreadable creation properties: " + last_error();
  return filters_trouble_of(dcpl);
}

std::string filters_trouble_of(hid_t dcpl) {
  if (H5Pget_layout(dcpl) != H5D_CHUNKED) return "";  // filters need chunks
  Pipeline p;
  if (pipeline_of(dcpl, p)) return "";
  const int n = H5Pget_nfilters(dcpl);
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, conf = 0, cd[4] = {0, 0, 0, 0};
    size_t nelem = 4;
    char name[64] = {0};
    const H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nelem, cd,
                                           sizeof name, name, &conf);
    if (id == H5Z_FILTER_SHUFFLE || id == H5Z_FILTER_DEFLATE) continue;
    const std::string known = id == 32000 ? "lzf" : name[0] ? name : "unnamed";
    // An available one (fletcher32, scaleoffset, ...) is refused too: this reader checks
    // each chunk before libhdf5 decodes it, and only knows shuffle's and deflate's sizes.
    const htri_t avail = H5Zfilter_avail(id);
    last_error();
    return fmt::format(
        "filter {} (id {}) {}: a capture's chunks use shuffle and deflate only "
        "(gzip; h5py: compression=\"gzip\", shuffle=True)",
        known, static_cast<long>(id),
        avail > 0 ? "is not read by dynemb-dist" : "cannot be decoded");
  }
  return fmt::format("{} filters in an order this reader does not undo (shuffle, then deflate)", n);
}

bool check_chunks(hid_t dset, std::string& why, bool decode_too, uint64_t max_grid) {
  Hid dcpl = plist_id(H5Dget_create_plist(dset));
  if (!dcpl.valid()) return why = "unreadable creation properties: " + last_error(), false;
  return check_chunks(dset, dcpl, why, decode_too, max_grid);
}

bool check_chunks(hid_t dset, hid_t dcpl, std::string& why, bool decode_too, uint64_t max_grid) {
  if (why = filters_trouble_of(dcpl); !why.empty()) return false;
  Layout L;
  if (!layout_of(dset, L, dcpl)) return true;  // not chunked, or nothing stored to check
  if (L.nchunks > max_grid) return true;
  // Decoding needs a decompressor and a chunk's buffer; checking records alone needs neither.
  std::optional<Inflater> inflater;
  std::vector<unsigned char> plain, tmp;
  if (decode_too) {
    inflater.emplace();
    plain.resize(size_t(L.chunk_bytes()));
  }
  RawChunk c;
  for (uint64_t i = 0; i < L.nchunks; ++i) {
    L.offset_of(i, c.offset);
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    if (H5Dget_chunk_info_by_coord(dset, c.offset.data(), &mask, &addr, &size) < 0)
      return why = chunk_name(i, c.offset) + ": unreadable chunk index: " + last_error(), false;
    if (addr == HADDR_UNDEF) continue;  // never written: fill values
    why = record_trouble(L.pipe, L.nfilters, mask, size, L.chunk_bytes());
    if (why.empty() && decode_too) {
      c.bytes.resize(size_t(size));
      uint32_t mask2 = 0;
      if (H5Dread_chunk(dset, H5P_DEFAULT, c.offset.data(), &mask2, c.bytes.data()) < 0)
        return why = chunk_name(i, c.offset) + ": unreadable: " + last_error(), false;
      c.mask = mask2;
      why = decode(c, L.pipe, L.es, *inflater, plain.data(), plain.size(), tmp);
    }
    if (!why.empty()) return why = chunk_name(i, c.offset) + ": " + why, false;
  }
  return true;
}

namespace {
herr_t collect_hard_links(hid_t, const char* name, const h5::LinkInfo* info, void* data) {
  if (info && info->type == H5L_TYPE_HARD)
    static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

bool hard_link_names(hid_t file, std::vector<std::string>& names, std::string& why) {
  names.clear();
  if (H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, collect_hard_links, &names) < 0)
    return why = "cannot list its objects: " + last_error(), false;
  return true;
}

bool check_chunks_under(hid_t file, std::string& path, std::string& why, bool decode_too,
                        uint64_t max_grid) {
  std::vector<std::string> names;
  if (!hard_link_names(file, names, why)) return path = "/", false;
  for (const std::string& name : names) {
    Hid obj(H5Oopen(file, name.c_str(), H5P_DEFAULT), H5Oclose);
    if (!obj.valid()) {
      last_error();
      continue;  // not an object this walk can open: the reader reports it where it reads
    }
    if (H5Iget_type(obj) != H5I_DATASET) continue;
    if (!check_chunks(obj, why, decode_too, max_grid)) return path = "/" + name, false;
  }
  return true;
}

namespace {

// Whether chunk-by-chunk writing yields exactly H5Dwrite's file for this dataset; its layout
// in L.
bool parallel_write_applies(hid_t dset, hid_t mem_type, uint64_t bytes, Layout& L) {
  if (!layout_of(dset, L) || L.numel * L.es != bytes) return false;
  // Deflate is what makes this worth it, and compress2 at the filter's level is what makes
  // the bytes H5Dwrite's.
  if (L.pipe.deflate_at < 0 || L.pipe.level < 0) return false;
  const H5T_class_t cls = H5Tget_class(L.type);
  if (cls != H5T_INTEGER && cls != H5T_FLOAT && cls != H5T_STRING) return false;
  if (H5Tis_variable_str(L.type) != 0 || H5Tequal(L.type, mem_type) <= 0) return false;
  // H5Dwrite fills what an edge chunk holds outside the extent with the fill value: zeros
  // unless one was set.
  H5D_fill_value_t fill = H5D_FILL_VALUE_ERROR;
  if (H5Pfill_value_defined(L.dcpl, &fill) < 0 || fill == H5D_FILL_VALUE_USER_DEFINED) return false;
  // H5Dwrite leaves chunks in HDF5's chunk cache and allocates their file space when the
  // cache lets them go, preferring chunks written whole over partial edge chunks: with several
  // chunks in the cache at once, the file order is the cache's. One chunk, or chunks larger
  // than half the cache (our writer's, of ~1 MiB, with the default 1 MiB cache), leave it in
  // grid order; anything else is declined.
  {
    Hid dapl = plist_id(H5Dget_access_plist(dset));
    size_t slots = 0, cache_bytes = 0;
    double w0 = 0;
    if (!dapl.valid() || H5Pget_chunk_cache(dapl, &slots, &cache_bytes, &w0) < 0) return false;
    if (L.nchunks > 1 && 2 * L.chunk_bytes() <= cache_bytes) return false;
  }
  // A chunk already written would have H5Dwrite merge into it: only fresh datasets (no
  // storage yet; H5Dget_num_chunks fails on those).
  if (H5Dget_storage_size(dset) != 0) return false;
  return true;
}

}  // namespace

// long: the compressing workers (a lambda) and the writing loop share one ring of slots, its
// lock and its two conditions; read top to bottom they are one protocol.
ChunkWrite write_chunks_parallel(hid_t dset, hid_t mem_type, const void* data, uint64_t bytes,
                                 int threads, std::string& error) {
  if (serial_write_forced()) return ChunkWrite::declined;
  Layout L;
  if (!parallel_write_applies(dset, mem_type, bytes, L)) return ChunkWrite::declined;
  if (threads <= 0) threads = hardware_threads();
  const size_t chunk_bytes = size_t(L.chunk_bytes());
  const uLong bound = compressBound(static_cast<uLong>(chunk_bytes));
  const size_t es = L.es;
  const auto* src = static_cast<const unsigned char*>(data);

  // A ring of `window` compressed chunks: chunk i is compressed into slot i % window once
  // chunk i - window has been written, so at most `window` wait for the caller's writes.
  const uint64_t window = uint64_t(2 * threads);
  struct Slot {
    std::vector<unsigned char> z;
    size_t n = 0;
    bool ready = false;
  };
  std::vector<Slot> slots(size_t(std::min<uint64_t>(window, L.nchunks)));
  std::mutex m;
  std::condition_variable cv_ready, cv_free;
  uint64_t written = 0;  // chunks the caller has written, under m
  bool stop = false;     // a failure: everyone leaves, under m
  std::string why;       // the first failure, under m
  std::atomic<uint64_t> next{0};

  auto fail = [&](std::string msg) {
    std::lock_guard<std::mutex> lk(m);
    if (!stop) why = std::move(msg);
    stop = true;
  };
  auto worker = [&] {
    try {
      std::vector<unsigned char> plain(chunk_bytes), shuf;
      std::vector<hsize_t> off;
      while (true) {
        const uint64_t i = next.fetch_add(1);
        if (i >= L.nchunks) return;
        {
          std::unique_lock<std::mutex> lk(m);
          cv_free.wait(lk, [&] { return stop || i < written + window; });
          if (stop) return;
        }
        L.offset_of(i, off);
        if (is_edge(L, off)) std::memset(plain.data(), 0, chunk_bytes);
        for_each_row(L, off, [&](size_t at_chunk, size_t at, size_t n) {
          std::memcpy(plain.data() + at_chunk * es, src + at * es, n * es);
        });
        const unsigned char* in = plain.data();
        if (shuffles(L.pipe, 0, es, chunk_bytes)) {
          shuf.resize(chunk_bytes);
          shuffle(plain.data(), chunk_bytes, es, shuf.data());
          in = shuf.data();
        }
        Slot& s = slots[size_t(i % slots.size())];  // free: chunk i - window is written
        s.z.resize(bound);
        uLongf n = bound;
        const int rc = compress2(s.z.data(), &n, in, static_cast<uLong>(chunk_bytes), L.pipe.level);
        if (rc != Z_OK) {
          fail(fmt::format("zlib compress2 failed ({}) (the chunk at {})", rc, offset_str(off)));
          cv_ready.notify_all();
          return;
        }
        {
          std::lock_guard<std::mutex> lk(m);
          s.n = size_t(n);
          s.ready = true;
        }
        cv_ready.notify_all();
      }
    } catch (const std::exception& e) {
      fail(fmt::format("compressing chunks: {}", e.what()));
      cv_ready.notify_all();
    }
  };

  std::vector<std::thread> pool;
  auto join_all = [&] {
    {
      std::lock_guard<std::mutex> lk(m);
      if (written < L.nchunks) stop = true;
    }
    cv_free.notify_all();
    for (std::thread& t : pool) t.join();
    pool.clear();
  };
  // Threads that cannot be started (no memory for a stack) leave the work to the others; with
  // none, H5Dwrite does it.
  const uint64_t nworkers = std::min<uint64_t>(uint64_t(threads), L.nchunks);
  for (uint64_t w = 0; w < nworkers; ++w) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;
    }
  }
  if (pool.empty()) return ChunkWrite::declined;

  // libhdf5 on this thread only, in grid order.
  std::vector<hsize_t> off;
  for (uint64_t i = 0; i < L.nchunks; ++i) {
    Slot& s = slots[size_t(i % slots.size())];
    {
      std::unique_lock<std::mutex> lk(m);
      cv_ready.wait(lk, [&] { return stop || s.ready; });
      if (stop) break;
    }
    L.offset_of(i, off);
    if (H5Dwrite_chunk(dset, H5P_DEFAULT, 0, off.data(), s.n, s.z.data()) < 0) {
      fail(fmt::format("{} (the chunk at {})", last_error(), offset_str(off)));
      break;
    }
    {
      std::lock_guard<std::mutex> lk(m);
      s.ready = false;
      written = i + 1;
    }
    cv_free.notify_all();
  }
  join_all();
  if (written == L.nchunks) return ChunkWrite::written;
  std::lock_guard<std::mutex> lk(m);
  error = why.empty() ? std::string("chunked write stopped early") : why;
  return ChunkWrite::failed;
}

}  // namespace dynemb::h5
