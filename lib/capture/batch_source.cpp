#include "capture/batch_source.hpp"

#include <fmt/format.h>

#include <new>
#include <system_error>

#include "capture/h5util.hpp"
#include "common/error.hpp"
#include "common/memory.hpp"

namespace dynemb {

int rank_of_h5path(const std::string& h5path) {
  // "/batches/<digits>/rank<digits>" then the end or '/'.
  const std::string head = "/batches/";
  if (h5path.compare(0, head.size(), head) != 0) return -1;
  size_t i = head.size();
  const auto digits = [&](size_t& at, size_t most) {
    const size_t from = at;
    while (at < h5path.size() && at - from < most && h5path[at] >= '0' && h5path[at] <= '9') ++at;
    return at > from;
  };
  if (!digits(i, 20) || h5path.compare(i, 5, "/rank") != 0) return -1;
  i += 5;
  const size_t from = i;
  if (!digits(i, 9) || (i < h5path.size() && h5path[i] != '/')) return -1;
  return std::stoi(h5path.substr(from, i - from));
}

namespace {

// The rank an error of a batch read names, -1 for the batch as a whole.
int rank_of(const Error& e) {
  const auto* c = dynamic_cast<const CaptureError*>(&e);
  return c ? rank_of_h5path(c->h5path()) : -1;
}

}  // namespace

BatchSource::BatchSource(const CaptureReader& reader, const Plan& read_plan, Options options)
    : reader_(reader), plan_(read_plan), opt_(options) {}

BatchSource::~BatchSource() {
  settle();
}

void BatchSource::settle() {
  if (ahead_.valid()) ahead_.wait();
  if (shapes_.valid()) shapes_.wait();
}

std::string BatchSource::oom(int64_t k, const char* what, int rank) const {
  return fmt::format("{}:/batches/{}{}: {} while reading {}", reader_.path(), k,
                     rank >= 0 ? fmt::format("/rank{}", rank) : std::string(), out_of_memory_text(),
                     what);
}

// One read of every part of batch k (CaptureReader::read_batch_by_rank); the troubles of a
// replay that keeps going, or the first Error (fail_fast).
BatchRead BatchSource::read_now(int64_t k, bool& out_of_memory) {
  h5::quiet();  // libhdf5's error printing is per thread: errors are reported, not dumped
  BatchRead out;
  std::vector<ReadTrouble> ranks;  // troubles of single ranks: dropped when the batch fails
  // Out of memory reading a rank's parts is the batch's trouble, not the rank's: with the ranks
  // before it held, the rest of the batch would not fit either. The batch is dropped, once.
  bool batch_oom = false;
  const auto rank_failed = [&](int64_t r) {
    try {
      throw;
    } catch (const Error& e) {
      if (opt_.fail_fast) throw;
      ranks.push_back({k, int(r), "capture",
                       std::string(e.what()) + " (this rank's ctx/, local_embs and output are "
                                               "left out of the replay)"});
    } catch (const std::bad_alloc&) {
      out_of_memory = true;
      if (opt_.fail_fast) throw Error(oom(k, "the batch", -1));
      batch_oom = true;
    }
  };
  try {
    out.batch = reader_.read_batch_by_rank(plan_, k, rank_failed);
    out.troubles = std::move(ranks);
    if (batch_oom) {
      out.batch.reset();
      out.troubles = {{k, -1, "capture", oom(k, "the batch", -1)}};
    }
  } catch (const Error& e) {
    if (opt_.fail_fast) throw;
    out.troubles = {{k, rank_of(e), "capture", e.what()}};
  } catch (const std::bad_alloc&) {
    out_of_memory = true;
    if (opt_.fail_fast) throw Error(oom(k, "the batch", -1));
    out.batch.reset();
    out.troubles = {{k, -1, "capture", oom(k, "the KJTs", -1)}};
  }
  return out;
}

BatchRead BatchSource::read(int64_t k) {
  if (ahead_.valid()) {
    std::future<Ahead> f = std::move(ahead_);
    if (ahead_k_ == k) {
      Ahead a = f.get();  // the Error of a fail_fast read comes from here
      if (!a.redo) return std::move(a.read);
    } else {
      f.wait();  // another batch's: dropped, Error and all
    }
  }
  const std::lock_guard<std::mutex> lock(h5_);
  bool out_of_memory = false;
  return read_now(k, out_of_memory);
}

void BatchSource::read_ahead(int64_t k) {
  if (opt_.read_ahead <= 0) return;
  if (ahead_.valid()) {
    if (ahead_k_ == k) return;
    ahead_.wait();
  }
  try {
    ahead_ = std::async(std::launch::async, [this, k] {
      const std::lock_guard<std::mutex> lock(h5_);
      // Out of memory beside the batch being replayed: read again in turn, once it is gone.
      Ahead a;
      try {
        a.read = read_now(k, a.redo);
      } catch (const Error&) {  // fail_fast
        if (!a.redo) throw;
      } catch (const std::bad_alloc&) {
        a.redo = true;
      }
      if (a.redo) a.read = BatchRead{};
      return a;
    });
    ahead_k_ = k;
  } catch (const std::system_error&) {  // no thread to be had: batch k is read in turn
    ahead_ = {};
  }
}

std::optional<Batch> BatchSource::read_shapes_now(int64_t k) {
  h5::quiet();
  ReadParts shapes;  // the KJTs and contexts; local_embs and outputs checked, not read
  shapes.float_data = false;
  try {
    return reader_.read_batch(plan_, k, shapes);
  } catch (const std::exception&) {  // Error, bad_alloc: read(k) says what and where
    return std::nullopt;
  }
}

std::optional<Batch> BatchSource::read_shapes(int64_t k) {
  if (shapes_.valid()) {
    std::future<std::optional<Batch>> f = std::move(shapes_);
    std::optional<Batch> got = f.get();
    if (shapes_k_ == k && got) return got;  // nullopt: read again, in turn
  }
  const std::lock_guard<std::mutex> lock(h5_);
  return read_shapes_now(k);
}

void BatchSource::shapes_ahead(int64_t k) {
  if (opt_.read_ahead <= 0) return;
  if (shapes_.valid()) {
    if (shapes_k_ == k) return;
    shapes_.wait();
  }
  try {
    shapes_ = std::async(std::launch::async, [this, k] {
      const std::lock_guard<std::mutex> lock(h5_);
      return read_shapes_now(k);
    });
    shapes_k_ = k;
  } catch (const std::system_error&) {  // no thread to be had: read in turn
    shapes_ = {};
  }
}

std::vector<float> BatchSource::read_rows(int64_t k, int64_t rank, const char* name, DType dtype,
                                          const Ranges& ranges, std::vector<float> reuse) {
  const std::lock_guard<std::mutex> lock(h5_);
  h5::quiet();
  return reader_.read_rows(k, rank, name, dtype, ranges, std::move(reuse));
}

std::vector<std::vector<float>> BatchSource::read_rows(int64_t k, const char* name, DType dtype,
                                                       const std::vector<Ranges>& ranges,
                                                       std::vector<std::vector<float>> reuse) {
  const std::lock_guard<std::mutex> lock(h5_);
  h5::quiet();
  return reader_.read_rows(k, name, dtype, ranges, std::move(reuse));
}

std::vector<float> BatchSource::read_rows_concat(int64_t k, const char* name, DType dtype,
                                                 const std::vector<Ranges>& ranges,
                                                 std::vector<int64_t>& offsets,
                                                 std::vector<float> reuse) {
  const std::lock_guard<std::mutex> lock(h5_);
  h5::quiet();
  return reader_.read_rows_concat(k, name, dtype, ranges, offsets, std::move(reuse));
}

}  // namespace dynemb
