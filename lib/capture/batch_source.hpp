// The batches of a capture as a replay reads them: a batch whole, keeping going past a rank
// whose optional parts cannot be read; the next batch read on another thread while this one is
// replayed; a batch's shapes without its float data; rows of its captured tensors.
//
// libhdf5 is not thread-safe: a BatchSource lets at most one thread call it at a time (a read
// in flight is waited for before any other read of the source starts: one read_ahead and one
// shapes_ahead may be in flight, taking turns), and turns libhdf5's error printing off on every
// thread it reads on. While a read is in flight nothing else may
// call libhdf5 (another CaptureReader, a CaptureWriter): a replay that writes reads nothing
// ahead.
#pragma once

#include <cstdint>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "capture/capture.hpp"

namespace dynemb {

// One piece of trouble met reading a batch.
struct ReadTrouble {
  int64_t batch = 0;
  int rank = -1;                  // -1: the batch as a whole (the KJTs, or a check across ranks)
  std::string stage = "capture";  // the report's stage
  std::string message;            // "file:/batches/3/rank1/local_embs: ... (this rank's ...)"
};

struct BatchRead {
  std::optional<Batch> batch;  // nullopt: the KJTs (or keys, mean_divisor, module_output) of
                               // some rank cannot be read, and nothing of the batch is replayed
  std::vector<ReadTrouble> troubles;
};

// The rank a capture path names: "/batches/3/rank1/ctx/x" -> 1; -1 for a path of no rank
// ("/batches/3", "/").
int rank_of_h5path(const std::string& h5path);

class BatchSource {
 public:
  struct Options {
    int read_ahead = 1;  // 0: read_ahead and shapes_ahead do nothing
    bool fail_fast = false;
  };

  // `reader` must outlive the source; `read_plan` is copied (the plan the capture is read
  // under: the capture's own when --plan re-shards).
  BatchSource(const CaptureReader& reader, const Plan& read_plan, Options options);
  ~BatchSource();  // waits for any read in flight
  BatchSource(const BatchSource&) = delete;
  BatchSource& operator=(const BatchSource&) = delete;

  // Batch k whole. A rank whose ctx/, local_embs or output cannot be read keeps its KJT alone
  // (one trouble each, in rank order: "<what()> (this rank's ctx/, local_embs and output are
  // left out of the replay)"); batch nullopt, with one trouble, when a KJT (or a rank's keys,
  // mean_divisor, module_output) cannot be read. fail_fast: throws the first Error instead
  // (out of memory: an Error saying so). Takes the read_ahead of k when there is one.
  BatchRead read(int64_t k);
  // Batch k, as read(k) gives it, on another thread; a read_ahead of another batch still in
  // flight is waited for and dropped. Nothing when Options::read_ahead is 0 or no thread can
  // be started (read(k) then reads in turn). Two batches are in memory meanwhile.
  void read_ahead(int64_t k);

  // Batch k's KJTs and contexts, its float tensors with dtype and shape (checked) but no data
  // (ReadParts::float_data = false); nullopt on any error. Takes the shapes_ahead of k.
  std::optional<Batch> read_shapes(int64_t k);
  void shapes_ahead(int64_t k);

  // CaptureReader::read_rows and read_rows_concat of a batch read_shapes has checked; callable
  // from any thread (a replay reading its next unit ahead), one at a time with every other read.
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  std::vector<float> read_rows(int64_t k, int64_t rank, const char* name, DType dtype,
                               const Ranges& ranges, std::vector<float> reuse = {});
  std::vector<std::vector<float>> read_rows(int64_t k, const char* name, DType dtype,
                                            const std::vector<Ranges>& ranges,
                                            std::vector<std::vector<float>> reuse = {});
  std::vector<float> read_rows_concat(int64_t k, const char* name, DType dtype,
                                      const std::vector<Ranges>& ranges,
                                      std::vector<int64_t>& offsets, std::vector<float> reuse = {});

  // Waits for every read in flight (their results are kept for read / read_shapes): after it,
  // this thread may call reader() until the next read_ahead or shapes_ahead.
  void settle();
  const CaptureReader& reader() const { return reader_; }
  const Plan& plan() const { return plan_; }

 private:
  struct Ahead {
    BatchRead read;
    bool redo = false;  // out of memory with two batches held: read again in turn
  };
  const CaptureReader& reader_;
  const Plan plan_;
  const Options opt_;
  std::mutex h5_;  // held by the thread calling libhdf5
  int64_t ahead_k_ = -1;
  std::future<Ahead> ahead_;
  int64_t shapes_k_ = -1;
  std::future<std::optional<Batch>> shapes_;

  // With h5_ held; out_of_memory: set when a read ran out of memory (troubles or Error say so).
  BatchRead read_now(int64_t k, bool& out_of_memory);
  std::optional<Batch> read_shapes_now(int64_t k);
  std::string oom(int64_t k, const char* what, int rank) const;
};

}  // namespace dynemb
