// HDF5 capture format v1 (docs/capture-format.md): reader (capture_reader.cpp), writer
// (capture_writer.cpp) and the whole-file check behind `validate --capture` (capture_plan.cpp);
// the open watchdog and the name of the capture being read live in watchdog.cpp.
//
//   /  attrs format="dynemb-dist-capture", format_version=1, world_size=W, num_batches=nb
//   /plan                          the plan YAML (scalar string, fixed- or variable-length)
//   /oracle                        attrs kind="hash64", seed (uint64)          (optional)
//   /tables/<name>/weight          [num_embeddings, D] in the table's data_type (optional)
//   /batches/<k>/rank<r>/          lengths, values, weights?, stride_per_feature?, keys?,
//                                  ctx/*?, local_embs?, output?, module_output?,
//                                  inverse_indices?
//
// Everything is read one batch at a time, and every shape is checked against the plan before
// anything is allocated from it; the first inconsistency is a CaptureError naming the file,
// the HDF5 path and the index ("/batches/3/rank1/lengths: sum 812 != len(values) 811").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.hpp"
#include "common/error.hpp"
#include "common/output_file.hpp"
#include "engine/embedding_source.hpp"
#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

inline constexpr const char* kCaptureFormat = "dynemb-dist-capture";
inline constexpr int kCaptureFormatVersion = 1;

// Which parts of a batch read_batch loads. The KJT (lengths, values, weights, strides) is
// always read and checked; the optional parts are checked whenever present, and their data
// loaded only when asked.
struct ReadParts {
  bool ctx = true;
  bool local_embs = true;
  bool output = true;
  bool module_output = true;
  // false: float tensors come back with shape and dtype but empty `data` (shape checks only).
  bool float_data = true;
  // Non-empty: the optional parts of rank r are read (and checked) only when ranks[r] != 0,
  // so that a damaged part of one rank need not cost the others theirs.
  std::vector<char> ranks;
};

// Size of one dataset, for `inspect`.
struct DatasetStat {
  std::string path;
  std::string dtype;          // "int64", "float32", "bfloat16", ...
  std::vector<int64_t> dims;  // extent
  int64_t logical_bytes = 0;  // elements x element size
  int64_t stored_bytes = 0;   // on disk (after compression)
};

// libhdf5 1.10 can loop forever inside a metadata read of a damaged file (a damaged global
// heap under /plan's string, docs/robustness.md); nothing can interrupt it from outside. When
// armed, opening a capture from a file (superblock, root attributes, /plan) that takes longer
// than `seconds` calls `on_timeout(path)` from a watchdog thread: the CLI reports the file and
// exits 2 there. seconds <= 0 disarms (the default).
void set_capture_open_watchdog(double seconds,
                               std::function<void(const std::string& path)> on_timeout);

// The path of the capture file opened last by a CaptureReader still alive ("" when none), in a
// fixed NUL-terminated buffer: safe to read from a signal handler. The CLI's crash handler
// names it when libhdf5 crashes on a damaged file (docs/robustness.md).
const char* capture_being_read() noexcept;

// Turns off libhdf5's automatic error printing on the calling thread (printing is per thread;
// its errors become CaptureErrors that say what and where). For main() and any thread that
// reads or writes a capture outside a BatchSource (batch_source.hpp), which does it itself.
void quiet_hdf5_errors();

// libhdf5 for the tool's process, called first in main(): its closing of every open file at
// exit is not registered (a file whose close already failed, its last write on a full disk,
// crashes libhdf5 1.10 there; every handle is closed by its owner and every close that matters
// is checked), and its error printing is off on this thread.
void prepare_hdf5_library();

// The library that undoes deflate on the read path, with its version ("libdeflate 1.14",
// "zlib 1.2.13"), for --version.
std::string inflate_library_name();

class BatchSource;  // batch_source.hpp

class CaptureReader {
 public:
  // Opens the file and checks the root attributes and /plan; throws CaptureError.
  explicit CaptureReader(const std::string& path);
  // Reads an in-memory HDF5 file image (HDF5's core driver, no file on disk; the bytes are
  // copied). `name` stands for the file in messages. Used by the fuzz target; same checks.
  CaptureReader(const std::string& name, const void* image, size_t size);
  ~CaptureReader();
  CaptureReader(const CaptureReader&) = delete;
  CaptureReader& operator=(const CaptureReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t world_size() const { return world_size_; }
  int64_t num_batches() const { return num_batches_; }
  const std::string& plan_text() const { return plan_text_; }
  // The seed of /oracle (kind "hash64"), nullopt when the group is absent.
  std::optional<uint64_t> oracle_seed() const { return oracle_seed_; }

  // Names under /tables that hold a `weight` dataset, in HDF5 (alphabetical) order.
  std::vector<std::string> weight_tables() const;
  // /tables/<name>/weight as [num_embeddings * D] row-major floats, checked against `table`.
  std::vector<float> read_table_weight(const TableConfig& table) const;
  // The dtype and shape checks of read_table_weight, without reading the data.
  void check_table_weight(const TableConfig& table) const;

  // Batch k (0 <= k < num_batches) for all W ranks, checked against `plan` (world size, F,
  // dims, every length sum and shape). Kjt::lengths_type / values_type record the on-disk
  // dtypes.
  Batch read_batch(const Plan& plan, int64_t k, const ReadParts& parts = {}) const;

  // Rows of one float tensor of batch k, rank `rank` ("local_embs" or "output"), whose dtype
  // and shape read_batch has checked (a read with float_data = false): rows
  // [ranges[i].first, ranges[i].second) of its first dimension (elements of a 1-D tensor),
  // whole in the other, concatenated in the order given; ranges sorted, disjoint, inside the
  // extent. For a replay that holds one destination rank's rows at a time (replay.cpp). The
  // stored chunks those rows touch are inflated on every core; throws CaptureError naming
  // the dataset and the rows when they cannot be read.
  // `reuse`: a buffer to read into (see below).
  std::vector<float> read_rows(int64_t k, int64_t rank, const char* name, DType dtype,
                               const std::vector<std::pair<int64_t, int64_t>>& ranges,
                               std::vector<float> reuse = {}) const;
  // read_rows of the same tensor of every rank r with non-empty ranges[r], at once: the
  // chunks of all of them are inflated as one stream (a few rows of each rank's tensor still
  // keep every core busy). [W] results, empty where ranges[r] is.
  using RankRows = std::vector<std::pair<int64_t, int64_t>>;
  // `reuse`: buffers to read into. A buffer is resized to what it receives, so only elements
  // past its current size are zeroed: a caller reading many pieces of about one size hands the
  // last ones back, and their memory is neither zeroed nor faulted in again.
  std::vector<std::vector<float>> read_rows(int64_t k, const char* name, DType dtype,
                                            const std::vector<RankRows>& ranges,
                                            std::vector<std::vector<float>> reuse = {}) const;
  // The same rows in one buffer, rank after rank (what a sequence all-to-all receives);
  // offsets [W + 1]: where each rank's rows start in it, in elements.
  std::vector<float> read_rows_concat(int64_t k, const char* name, DType dtype,
                                      const std::vector<RankRows>& ranges,
                                      std::vector<int64_t>& offsets,
                                      std::vector<float> reuse = {}) const;

  // Every dataset under /batches/<k> and /tables with its extent and bytes (no data read).
  std::vector<DatasetStat> dataset_stats(int64_t k) const;
  std::vector<DatasetStat> table_stats() const;

 private:
  struct Impl;
  std::string path_;
  int64_t world_size_ = 0;
  int64_t num_batches_ = 0;
  std::string plan_text_;
  std::optional<uint64_t> oracle_seed_;
  std::unique_ptr<Impl> impl_;
  void read_root();  // root attributes, /plan, /oracle (after the file is open)
  // The checks of batch k and every rank's KJT (read_batch's first pass).
  Batch read_kjts(const Plan& plan, int64_t k) const;
  // The long int64 datasets read_batch(k, parts) reads, decoded at once on every core first.
  void prefetch_batch(int64_t k, const ReadParts& parts) const;
  // read_batch of every part, keeping going past a rank whose ctx/, local_embs or output cannot
  // be read (BatchSource::read): rank_failed(r) is called inside the handler of that Error or
  // bad_alloc (it may rethrow), and rank r keeps its KJT alone. Any other failure throws, the
  // same error read_batch throws first.
  Batch read_batch_by_rank(const Plan& plan, int64_t k,
                           const std::function<void(int64_t rank)>& rank_failed) const;
  friend class BatchSource;
  void read_rank_rows(int64_t k, const char* name, DType dtype, const std::vector<RankRows>& ranges,
                      std::vector<int64_t>& elements,
                      const std::function<float*(size_t)>& out) const;
};

// The KJT keys of a rank-batch (`path`, e.g. "/batches/0/rank1/keys") against the plan's
// feature order; throws CaptureError naming both orders and the likely cause.
void check_kjt_keys(const Plan& plan, const std::vector<std::string>& keys, const std::string& file,
                    const std::string& path);

// The plan of a capture: `override_plan` when given (after checking that it agrees with the
// capture's world size), else /plan parsed as "<file>:/plan" (capture_plan.cpp).
Plan capture_plan(const CaptureReader& reader, const Plan* override_plan = nullptr);

// `validate --capture`: checks the whole capture against the plan without running anything:
// world size, features and dims (override vs embedded plan), /tables shapes, /oracle, and
// every batch's and rank's shapes and length sums. Throws CaptureError on the first problem.
void check_capture(const std::string& path, const Plan* override_plan = nullptr);
// The same checks on an already open reader (an in-memory image, for the fuzz target).
void check_capture(const CaptureReader& reader, const Plan* override_plan = nullptr);

// The rows of a capture (capture_source.cpp): dense weights for the tables under /tables,
// the hash64 oracle for the others. nullptr when the capture has neither (a replay can still
// run the output dist on captured local_embs); throws CaptureError when some tables have
// weights, others do not, and there is no oracle.
std::shared_ptr<const EmbeddingSource> open_embedding_source(const CaptureReader& reader,
                                                             const Plan& plan);

struct WriterOptions {
  int deflate_level = 4;
  // Datasets of at least this many bytes are chunked (<= 1 MiB chunks) + shuffle + deflate.
  int64_t chunk_threshold_bytes = 4096;
  // Write /plan and string attributes as fixed-length strings (the default) or as h5py's
  // variable-length ones. Fixed-length keeps the file free of HDF5's global heap, whose
  // reader in libhdf5 1.10 can crash on a corrupted heap instead of returning an error.
  bool fixed_length_strings = true;
};

// Writes a capture one batch at a time into its temporary; finish() writes num_batches and
// closes the file, commit() finishes and renames it onto `target`. Destroyed before either:
// every HDF5 handle is closed and the temporary is removed. The temporary is an OutputFile
// (common/output_file.hpp): made here from `target` (replacing an existing file), or handed
// over by a caller that created it up front and that, after finish(), commits it together
// with its other outputs (commit_outputs).
class CaptureWriter {
 public:
  CaptureWriter(const std::string& target, const Plan& plan, std::optional<uint64_t> oracle_seed,
                const WriterOptions& options = {});
  CaptureWriter(std::shared_ptr<OutputFile> out, const Plan& plan,
                std::optional<uint64_t> oracle_seed, const WriterOptions& options = {});
  ~CaptureWriter();
  CaptureWriter(const CaptureWriter&) = delete;
  CaptureWriter& operator=(const CaptureWriter&) = delete;

  const std::string& temp_path() const { return temp_; }
  // /tables/<name>/weight, [rows, dim] row-major, values exact in `dtype`.
  void write_table_weight(const std::string& table, DType dtype, int64_t rows, int64_t dim,
                          const std::vector<float>& data);
  // Batches must come in order 0, 1, ...; batch.ranks.size() must be the plan's W.
  void write_batch(const Batch& batch);
  // write_batch a rank at a time, for a producer that has rank r's inputs before its outputs
  // (synth: every rank's lookup precedes the first output): begin_batch(index), then for
  // r = 0..W-1 write_rank_inputs(r, ..) and write_rank_outputs(r, ..), then end_batch(). Same
  // calls, same file as write_batch, byte for byte.
  void begin_batch(int64_t index);
  void write_rank_inputs(int64_t rank, const RankBatch& rb);   // KJT, ctx, keys, local_embs
  void write_rank_outputs(int64_t rank, const RankBatch& rb);  // output, inverse indices, module
  void end_batch();
  int64_t batches_written() const { return batches_; }
  void finish();
  void commit();

 private:
  struct Impl;
  std::string target_, temp_;
  int64_t world_size_ = 0;
  int64_t batches_ = 0;
  bool committed_ = false;
  bool finished_ = false;
  std::shared_ptr<OutputFile> out_;
  std::unique_ptr<Impl> impl_;
};

// Destination rank of every id of `kjt` (docs/semantics.md §3.2, §10.2), no bucketize needed:
// counts[d] = ids routed to rank d. Used for the shape of sequence local_embs and by inspect.
std::vector<int64_t> routed_id_counts(const Plan& plan, const Kjt& kjt);

}  // namespace dynemb
