// Capture format v1 writer (docs/capture-format.md) over the HDF5 C API: one batch at a time
// into a temporary that commit() renames onto the target.
#include "capture/capture.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "capture/capture_internal.hpp"
#include "capture/h5chunks.hpp"
#include "capture/h5util.hpp"

namespace dynemb {

using capture_detail::shape_str;
using h5::Hid;

struct CaptureWriter::Impl {
  std::string target;
  WriterOptions opt;
  Hid fid, batches, half;
  // The batch and rank being written a rank at a time; `next` says which call may come next.
  Hid batch_group, rank_group;
  std::string batch_path;
  int64_t rank = 0;
  enum class Next : uint8_t { batch, inputs, outputs } next = Next::batch;

  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw CaptureError(target, path, "cannot write: " + msg);
  }

  // A 1-D or 2-D dataset; large ones chunked (<= 1 MiB) with shuffle + deflate.
  void dataset(hid_t loc, const std::string& where, const char* name, hid_t file_type,
               hid_t mem_type, const std::vector<int64_t>& dims, const void* data) {
    std::vector<hsize_t> hd(dims.begin(), dims.end());
    Hid sp = h5::space_id(H5Screate_simple(static_cast<int>(hd.size()), hd.data(), nullptr));
    int64_t numel = 1;
    for (int64_t d : dims) numel *= d;
    const int64_t es = static_cast<int64_t>(H5Tget_size(file_type));
    Hid dcpl = h5::plist_id(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_obj_track_times(dcpl, false);  // no timestamps: same input, same bytes
    if (numel > 0 && numel * es >= opt.chunk_threshold_bytes) {
      constexpr int64_t kChunkBytes = 1 << 20;
      std::vector<hsize_t> chunk(hd.size());
      if (hd.size() == 1) {
        chunk[0] = static_cast<hsize_t>(std::min(numel, kChunkBytes / es));
      } else {
        const int64_t cols = dims[1];
        const int64_t ccols = std::min(cols, kChunkBytes / es);
        chunk[1] = static_cast<hsize_t>(std::max<int64_t>(1, ccols));
        chunk[0] = static_cast<hsize_t>(std::max<int64_t>(
            1, std::min(dims[0], kChunkBytes / (es * std::max<int64_t>(1, ccols)))));
      }
      H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
      H5Pset_shuffle(dcpl);
      H5Pset_deflate(dcpl, static_cast<unsigned>(opt.deflate_level));
    }
    const std::string path = where + "/" + name;
    Hid d = h5::dset_id(H5Dcreate2(loc, name, file_type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    if (!d.valid()) fail(path, h5::last_error());
    // Chunked ones are compressed on every core, to the bytes H5Dwrite stores (h5chunks.hpp).
    std::string why;
    const h5::ChunkWrite w =
        numel > 0 ? h5::write_chunks_parallel(d, mem_type, data, uint64_t(numel * es), 0, why)
                  : h5::ChunkWrite::declined;
    if (w == h5::ChunkWrite::failed) fail(path, why);
    if (numel > 0 && w == h5::ChunkWrite::declined &&
        H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
      fail(path, h5::last_error());
  }

  void ints(hid_t loc, const std::string& where, const char* name, const std::vector<int64_t>& v,
            IndexType t, std::vector<int64_t> dims = {}) {
    if (dims.empty()) dims = {static_cast<int64_t>(v.size())};
    if (t == IndexType::i64) {
      dataset(loc, where, name, H5T_STD_I64LE, H5T_NATIVE_INT64, dims, v.data());
      return;
    }
    std::vector<int32_t> n(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] < std::numeric_limits<int32_t>::min() || v[i] > std::numeric_limits<int32_t>::max())
        fail(where + "/" + name, fmt::format("[{}] = {} does not fit int32", i, v[i]));
      n[i] = static_cast<int32_t>(v[i]);
    }
    dataset(loc, where, name, H5T_STD_I32LE, H5T_NATIVE_INT32, dims, n.data());
  }

  void floats(hid_t loc, const std::string& where, const char* name, const EmbTensor& e) {
    if (static_cast<int64_t>(e.data.size()) != e.numel())
      fail(where + "/" + name,
           fmt::format("tensor shape {} but {} values", shape_str(e.shape), e.data.size()));
    if (e.dtype == DType::f32) {
      dataset(loc, where, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, e.shape, e.data.data());
      return;
    }
    std::vector<uint16_t> bits(e.data.size());
    for (size_t i = 0; i < bits.size(); ++i)
      bits[i] = e.dtype == DType::f16 ? f32_to_f16_bits(e.data[i]) : f32_to_bf16_bits(e.data[i]);
    if (e.dtype == DType::f16) {
      dataset(loc, where, name, half, half, e.shape, bits.data());
    } else {
      dataset(loc, where, name, H5T_STD_U16LE, H5T_NATIVE_UINT16, e.shape, bits.data());
      Hid d = h5::dset_id(H5Dopen2(loc, name, H5P_DEFAULT));
      str_attr(d, where + "/" + name, "dtype", "bfloat16");
    }
  }

  void str_attr(hid_t obj, const std::string& where, const char* name, const std::string& value) {
    Hid t = h5::type_id(H5Tcopy(H5T_C_S1));
    H5Tset_cset(t, H5T_CSET_UTF8);
    Hid sp = h5::space_id(H5Screate(H5S_SCALAR));
    if (opt.fixed_length_strings) {
      H5Tset_size(t, std::max<size_t>(1, value.size()));
      H5Tset_strpad(t, H5T_STR_NULLPAD);
      Hid a = h5::attr_id(H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT));
      std::vector<char> buf(std::max<size_t>(1, value.size()), '\0');
      std::copy(value.begin(), value.end(), buf.begin());
      if (!a.valid() || H5Awrite(a, t, buf.data()) < 0) fail(where, h5::last_error());
    } else {
      H5Tset_size(t, H5T_VARIABLE);
      Hid a = h5::attr_id(H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT));
      const char* p = value.c_str();
      if (!a.valid() || H5Awrite(a, t, &p) < 0) fail(where, h5::last_error());
    }
  }

  // A 1-D dataset of fixed-length, NUL-padded UTF-8 strings (no global heap).
  void strings(hid_t loc, const std::string& where, const char* name,
               const std::vector<std::string>& v) {
    size_t width = 1;
    for (const std::string& x : v) width = std::max(width, x.size());
    std::vector<char> buf(width * v.size(), '\0');
    for (size_t i = 0; i < v.size(); ++i) std::copy(v[i].begin(), v[i].end(), &buf[i * width]);
    Hid t = h5::type_id(H5Tcopy(H5T_C_S1));
    H5Tset_cset(t, H5T_CSET_UTF8);
    H5Tset_size(t, width);
    H5Tset_strpad(t, H5T_STR_NULLPAD);
    dataset(loc, where, name, t, t, {static_cast<int64_t>(v.size())}, buf.data());
  }

  void int_attr(hid_t obj, const std::string& where, const char* name, int64_t v) {
    Hid sp = h5::space_id(H5Screate(H5S_SCALAR));
    Hid a = h5::attr_id(H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT));
    if (!a.valid() || H5Awrite(a, H5T_NATIVE_INT64, &v) < 0) fail(where, h5::last_error());
  }

  Hid group(hid_t loc, const std::string& path, const char* name) {
    Hid gcpl = h5::plist_id(H5Pcreate(H5P_GROUP_CREATE));
    H5Pset_obj_track_times(gcpl, false);
    Hid g = h5::group_id(H5Gcreate2(loc, name, H5P_DEFAULT, gcpl, H5P_DEFAULT));
    if (!g.valid()) fail(path, h5::last_error());
    return g;
  }
};

CaptureWriter::CaptureWriter(const std::string& target, const Plan& plan,
                             std::optional<uint64_t> oracle_seed, const WriterOptions& options)
    : CaptureWriter(std::make_shared<OutputFile>(target), plan, oracle_seed, options) {}

CaptureWriter::CaptureWriter(std::shared_ptr<OutputFile> out, const Plan& plan,
                             std::optional<uint64_t> oracle_seed, const WriterOptions& options)
    : target_(out->target()),
      temp_(out->temp_path()),
      world_size_(plan.world_size),
      out_(std::move(out)),
      impl_(new Impl) {
  const std::string& target = target_;
  h5::quiet();
  Impl& I = *impl_;
  I.target = target;
  I.opt = options;
  I.half = h5::make_f16_type();
  // Through the open descriptor: a name swapped into the directory meanwhile is not followed.
  I.fid =
      h5::file_id(H5Fcreate(out_->open_path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!I.fid.valid())
    throw CaptureError(target, "/",
                       "cannot create temporary file " + temp_ + ": " + h5::last_error());
  Hid root = h5::group_id(H5Gopen2(I.fid, "/", H5P_DEFAULT));
  I.str_attr(root, "/", "format", kCaptureFormat);
  I.int_attr(root, "/", "format_version", kCaptureFormatVersion);
  I.int_attr(root, "/", "world_size", plan.world_size);

  // /plan: the plan text, a scalar string.
  {
    Hid t = h5::type_id(H5Tcopy(H5T_C_S1));
    H5Tset_cset(t, H5T_CSET_UTF8);
    Hid sp = h5::space_id(H5Screate(H5S_SCALAR));
    const std::string& text = plan.source_text;
    if (options.fixed_length_strings) {
      H5Tset_size(t, std::max<size_t>(1, text.size()));
      H5Tset_strpad(t, H5T_STR_NULLPAD);
    } else {
      H5Tset_size(t, H5T_VARIABLE);
    }
    Hid dcpl = h5::plist_id(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_obj_track_times(dcpl, false);
    Hid d = h5::dset_id(H5Dcreate2(I.fid, "plan", t, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    std::vector<char> buf(std::max<size_t>(1, text.size()) + 1, '\0');
    std::copy(text.begin(), text.end(), buf.begin());
    const char* p = buf.data();
    const void* src = options.fixed_length_strings ? static_cast<const void*>(buf.data())
                                                   : static_cast<const void*>(&p);
    if (!d.valid() || H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, src) < 0)
      I.fail("/plan", h5::last_error());
  }
  if (oracle_seed) {
    Hid og = I.group(I.fid, "/oracle", "oracle");
    I.str_attr(og, "/oracle", "kind", "hash64");
    Hid sp = h5::space_id(H5Screate(H5S_SCALAR));
    Hid a = h5::attr_id(H5Acreate2(og, "seed", H5T_STD_U64LE, sp, H5P_DEFAULT, H5P_DEFAULT));
    const uint64_t s = *oracle_seed;
    if (!a.valid() || H5Awrite(a, H5T_NATIVE_UINT64, &s) < 0) I.fail("/oracle", h5::last_error());
  }
  I.batches = I.group(I.fid, "/batches", "batches");
}

CaptureWriter::~CaptureWriter() {
  if (committed_ || finished_) return;
  // Close every handle before removing the half-written temp (the OutputFile removes it).
  impl_->rank_group.reset();
  impl_->batch_group.reset();
  impl_->batches.reset();
  impl_->half.reset();
  impl_->fid.reset();
  out_->discard();
}

void CaptureWriter::write_table_weight(const std::string& table, DType dtype, int64_t rows,
                                       int64_t dim, const std::vector<float>& data) {
  Impl& I = *impl_;
  if (!h5::exists(I.fid, "/tables")) I.group(I.fid, "/tables", "tables");
  Hid tg = h5::group_id(H5Gopen2(I.fid, "/tables", H5P_DEFAULT));
  Hid g = I.group(tg, "/tables/" + table, table.c_str());
  EmbTensor e;
  e.dtype = dtype;
  e.shape = {rows, dim};
  e.data = data;
  I.floats(g, "/tables/" + table, "weight", e);
}

void CaptureWriter::write_batch(const Batch& batch) {
  const std::string bp = fmt::format("/batches/{}", batches_);
  if (static_cast<int64_t>(batch.ranks.size()) != world_size_)
    impl_->fail(bp, fmt::format("{} ranks, want world_size {}", batch.ranks.size(), world_size_));
  begin_batch(batch.index);
  for (int64_t r = 0; r < world_size_; ++r) {
    write_rank_inputs(r, batch.ranks[r]);
    write_rank_outputs(r, batch.ranks[r]);
  }
  end_batch();
}

void CaptureWriter::begin_batch(int64_t index) {
  Impl& I = *impl_;
  const std::string bp = fmt::format("/batches/{}", batches_);
  if (I.next != Impl::Next::batch) I.fail(bp, "a batch begun before the last one ended");
  if (index != batches_) I.fail(bp, fmt::format("batch {} written out of order", index));
  I.batch_group = I.group(I.batches, bp, std::to_string(batches_).c_str());
  I.batch_path = bp;
  I.rank = 0;
  I.next = Impl::Next::inputs;
}

void CaptureWriter::write_rank_inputs(int64_t r, const RankBatch& rb) {
  Impl& I = *impl_;
  const std::string& bp = I.batch_path;
  if (I.next != Impl::Next::inputs || r != I.rank)
    I.fail(bp, fmt::format("rank {} inputs written out of order", r));
  const Kjt& kjt = rb.kjt;
  const std::string rp = fmt::format("{}/rank{}", bp, r);
  I.rank_group = I.group(I.batch_group, rp, fmt::format("rank{}", r).c_str());
  const hid_t rg = I.rank_group;
  I.ints(rg, rp, "lengths", kjt.lengths, kjt.lengths_type);
  I.ints(rg, rp, "values", kjt.values, kjt.values_type);
  if (kjt.weighted) {
    EmbTensor w;
    w.shape = {static_cast<int64_t>(kjt.weights.size())};
    w.data = kjt.weights;
    I.floats(rg, rp, "weights", w);
  }
  if (kjt.is_vbe()) I.ints(rg, rp, "stride_per_feature", kjt.stride_per_feature, IndexType::i64);
  if (rb.ctx) {
    const ShardingContext& c = *rb.ctx;
    const std::string cp = rp + "/ctx";
    Hid cg = I.group(rg, cp, "ctx");
    auto vec = [&](const char* name, const std::optional<std::vector<int64_t>>& v) {
      if (v) I.ints(cg, cp, name, *v, IndexType::i64);
    };
    vec("input_splits", c.input_splits);
    vec("output_splits", c.output_splits);
    vec("batch_size_per_rank", c.batch_size_per_rank);
    if (c.batch_size_per_rank_per_feature) {
      const auto& m = *c.batch_size_per_rank_per_feature;
      std::vector<int64_t> flat;
      const int64_t cols = m.empty() ? 0 : static_cast<int64_t>(m[0].size());
      for (const auto& row : m) {
        if (static_cast<int64_t>(row.size()) != cols)
          I.fail(cp + "/batch_size_per_rank_per_feature", "ragged rows");
        flat.insert(flat.end(), row.begin(), row.end());
      }
      I.ints(cg, cp, "batch_size_per_rank_per_feature", flat, IndexType::i64,
             {static_cast<int64_t>(m.size()), cols});
    }
    if (c.sparse_features_recat) {
      const auto& v = *c.sparse_features_recat;
      I.dataset(cg, cp, "sparse_features_recat", H5T_STD_I32LE, H5T_NATIVE_INT32,
                {static_cast<int64_t>(v.size())}, v.data());
    }
    vec("unbucketize_permute", c.unbucketize_permute);
    if (c.lengths_after_input_dist) {
      const auto& v = *c.lengths_after_input_dist;
      const int64_t cols = c.lengths_after_input_dist_cols;
      const int64_t rows = cols > 0 ? static_cast<int64_t>(v.size()) / cols : kjt.num_features;
      if (rows * cols != static_cast<int64_t>(v.size()))
        I.fail(cp + "/lengths_after_input_dist",
               fmt::format("{} values do not fill {} columns", v.size(), cols));
      I.ints(cg, cp, "lengths_after_input_dist", v, IndexType::i64, {rows, cols});
    }
    if (c.variable_batch_per_feature)
      I.int_attr(cg, cp, "variable_batch_per_feature", *c.variable_batch_per_feature ? 1 : 0);
  }
  if (rb.keys) I.strings(rg, rp, "keys", *rb.keys);
  if (!rb.kjt.mean_divisor.empty()) {
    std::vector<std::string> md;
    for (MeanDivisor d : rb.kjt.mean_divisor)
      md.emplace_back(d == MeanDivisor::weights ? "weights" : "count");
    I.strings(rg, rp, "mean_divisor", md);
  }
  if (rb.local_embs) I.floats(rg, rp, "local_embs", *rb.local_embs);
  I.next = Impl::Next::outputs;
}

void CaptureWriter::write_rank_outputs(int64_t r, const RankBatch& rb) {
  Impl& I = *impl_;
  if (I.next != Impl::Next::outputs || r != I.rank)
    I.fail(I.batch_path, fmt::format("rank {} outputs written out of order", r));
  const Kjt& kjt = rb.kjt;
  const std::string rp = fmt::format("{}/rank{}", I.batch_path, r);
  const hid_t rg = I.rank_group;
  if (rb.output) I.floats(rg, rp, "output", *rb.output);
  if (rb.inverse_indices) {
    const int64_t F = kjt.num_features, n = static_cast<int64_t>(rb.inverse_indices->size());
    if (F <= 0 || n % F != 0)
      I.fail(rp + "/inverse_indices", fmt::format("{} values do not fill {} rows", n, F));
    I.ints(rg, rp, "inverse_indices", *rb.inverse_indices, IndexType::i64, {F, n / F});
  }
  if (rb.module_output) I.floats(rg, rp, "module_output", *rb.module_output);
  I.rank_group.reset();  // closed before the next rank's group, as write_batch always did
  ++I.rank;
  I.next = I.rank < world_size_ ? Impl::Next::inputs : Impl::Next::batch;
}

void CaptureWriter::end_batch() {
  Impl& I = *impl_;
  if (I.next != Impl::Next::batch || I.rank != world_size_)
    I.fail(I.batch_path, fmt::format("batch ended after {} of {} ranks", I.rank, world_size_));
  I.batch_group.reset();
  ++batches_;
}

void CaptureWriter::finish() {
  if (finished_) return;
  Impl& I = *impl_;
  if (I.next != Impl::Next::batch)
    I.fail(I.batch_path, fmt::format("committed after {} of {} ranks", I.rank, world_size_));
  {
    Hid root = h5::group_id(H5Gopen2(I.fid, "/", H5P_DEFAULT));
    I.int_attr(root, "/", "num_batches", batches_);
  }
  I.batches.reset();
  I.half.reset();
  if (H5Fflush(I.fid, H5F_SCOPE_GLOBAL) < 0) I.fail("/", h5::last_error());
  // A close that fails (the last metadata write on a full disk) is an error, not a success.
  if (H5Fclose(I.fid.release()) < 0) I.fail("/", h5::last_error());
  finished_ = true;
}

void CaptureWriter::commit() {
  finish();
  try {
    out_->commit();
  } catch (const Error& e) {
    throw CaptureError(target_, "/", e.what());
  }
  committed_ = true;
}

}  // namespace dynemb
