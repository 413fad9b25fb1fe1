// Host dispatch of the CUDA backend: validates the contexts exactly as the CPU reference does
// (same ranks, fields and failures), builds the small index tables (offsets, recat segments,
// splits prefixes), uploads, launches the kernels of gather.hpp and pooled.hpp and hands each
// rank's output to the sink (or keeps it on the device for the replay's checks: Place::kept), which
// its comparator (device_comparator.hpp) compares there. Device buffers and the pinned staging
// of the copies are the backend's workspace (workspace.hpp), kept across calls. Lookups and
// unsharded references are made on the device from each table's rows (the hash64 oracle, or dense
// weights uploaded once and kept), whole tables or column slices of them; the host only resolves
// ids to rows. What the device cannot make (rows only a source's row() knows, dense weights past
// the device's share, errors to report) runs on the host through the CPU backend, whose words the
// errors then are.
#include "cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <optional>
#include <string>
#include <thread>

#include "common/hash.hpp"
#include "common/parallel.hpp"
#include "common/trace.hpp"
#include "cuda_check.hpp"
#include "device_buffer.hpp"
#include "device_comparator.hpp"
#include "engine/dist_checks.hpp"
#include "engine/input_dist.hpp"
#include "engine/ops.hpp"
#include "engine/reference.hpp"
#include "gather.hpp"
#include "pooled.hpp"
#include "workspace.hpp"

namespace dynemb {
namespace cuda {

bool device_available(int device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return false;
  }
  return device >= 0 && device < n;
}

namespace {

// dev <- host on s: through the pinned staging when there is one, else from pageable memory.
template <typename T>
void put(DeviceBuffer<T>& dev, const std::vector<T>& host, cudaStream_t s, PinnedStaging* st) {
  if (st)
    st->upload(dev, host, s);
  else
    dev.upload(host, s);
}

// n elements host -> dev on s, as put() sends them.
template <typename T>
void put_at(T* dev, const T* host, size_t n, cudaStream_t s, PinnedStaging* st) {
  if (n == 0) return;
  if (st)
    st->upload(dev, host, sizeof(T) * n, s);
  else
    CUDA_CHECK(cudaMemcpyAsync(dev, host, sizeof(T) * n, cudaMemcpyHostToDevice, s));
}

}  // namespace

}  // namespace cuda

namespace {

using cuda::DeviceBuffer;
using ToHost = cuda::PinnedStaging::ToHost;

// The download of a whole device buffer into v (resized to it).
template <typename T>
ToHost into(std::vector<T>& v, const DeviceBuffer<T>& d) {
  v.resize(static_cast<size_t>(d.size()));
  return {v.data(), d.data(), sizeof(T) * v.size()};
}

// A lookup once the host has resolved every id to its row, ready to be made on the device: what a
// rank's lookup and the unsharded reference of its KJT have in common. N ids, F features.
struct ResolvedRuns {
  std::vector<int64_t> shape;     // of the output
  std::vector<int64_t> off;       // [bags+1] id offsets of the bags
  std::vector<int64_t> bag0;      // [F+1] first bag of each feature
  std::vector<int64_t> dst;       // pooled: [bags] first output element of each bag's run
  std::vector<int32_t> bag_feat;  // [bags] the bag's feature
  std::vector<uint64_t> g;        // [N] unsharded row of each id
  std::vector<uint8_t> valid;     // [N] 1 when the id's row is looked up
};

// Where each feature's table rows are for the device (EmbeddingSource::TableRows resolved): F
// features. An id whose row is past a dense table's rows is row()'s error, given by the host.
struct FeatureRows {
  std::vector<cuda::DeviceRows> rows;  // [F]
  // [F] rows of the dense weights; nullopt for the oracle, which makes every key's row (a raw
  // key of -1 is row 2^64-1: no sentinel value can stand for "no limit").
  std::vector<std::optional<uint64_t>> limit;
};

// Dense weights kept on the device take at most this share of its memory; past it, lookups of
// those tables are the host's (the device still runs the dists and the checks).
constexpr double kDenseShare = 0.25;

class CudaBackend final : public Backend, public HostLending, private cuda::DeviceTensors {
 public:
  explicit CudaBackend(int device) : Backend("cuda"), device_(device) {
    if (!cuda::device_available(device))
      throw DeviceError("CUDA device " + std::to_string(device) + " is not available");
    CUDA_CHECK(cudaSetDevice(device_));
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, device_));
    desc_ = std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ")";
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    dense_budget_ = static_cast<int64_t>(kDenseShare * static_cast<double>(p.totalGlobalMem));
    ws_ = std::make_unique<cuda::BackendWorkspace>();
    cuda::DeviceTensors& tensors = *this;
    comparator_ = std::make_unique<cuda::DeviceComparator>(tensors, *ws_, stream_, device_);
  }
  ~CudaBackend() override {
    comparator_.reset();
    ws_.reset();  // waits for the staging's pending copies on stream_
    cudaStreamDestroy(stream_);
  }
  std::string device() const override { return desc_; }

  using Backend::bucketize;
  std::vector<BucketizedKjt> bucketize(const Plan& plan,
                                       const std::vector<const Kjt*>& kjts) override;
  Tensor lookup(const Plan& plan, int rank, const LookupKjt& kjt, const EmbeddingSource& source,
                Place place) override;
  std::optional<Kept> keep(const EmbTensor& host, int rank) override;
  void sequence_output_dist(const Plan& plan, const std::vector<TensorRef>& local_embs,
                            const std::vector<const ShardingContext*>& ctx, Place place,
                            const OutputSink& sink) override;
  void pooled_output_dist(const Plan& plan, bool variable_batch,
                          const std::vector<TensorRef>& local_embs,
                          const std::vector<const ShardingContext*>& ctx, Place place,
                          const OutputSink& sink) override;
  Comparator& comparator() override { return *comparator_; }
  bool lend(void* p, size_t bytes) override {
    CUDA_CHECK(cudaSetDevice(device_));
    return ws_->staging.lend(p, bytes);
  }
  void unlend(void* p) override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // the one stream that uploads from it
    ws_->staging.unlend(p);
  }
  void forget(void* p) override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    ws_->staging.forget(p);
  }
  // What the device has free now: the workspace is allocated already, and kept tensors grow
  // into the rest.
  uint64_t device_memory_for_kept() const override {
    CUDA_CHECK(cudaSetDevice(device_));
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
  }

 private:
  // cuda::DeviceTensors: the memory of each kept tensor (workspace.hpp says where), and the
  // reference made on the device for the comparator.
  std::optional<const float*> kept_data(const Kept& k, int64_t n) const override;
  std::optional<std::vector<int64_t>> reference_on_device(const Plan& plan, const Kjt& kjt,
                                                          const EmbeddingSource& source) override;
  std::optional<std::vector<int64_t>> lookup_into_rows_out(const Plan& plan, int rank,
                                                           const LookupKjt& kjt,
                                                           const EmbeddingSource& source) override {
    return lookup_on_device(plan, rank, kjt, source);
  }

  // The lookup made on the device into `out` (the workspace's rows_out unless given; left queued
  // on the stream); its shape, or nullopt when it is the host's to make (rows the device cannot
  // make, malformed input, errors to report).
  std::optional<std::vector<int64_t>> lookup_on_device(const Plan& plan, int rank,
                                                       const LookupKjt& kjt,
                                                       const EmbeddingSource& source,
                                                       DeviceBuffer<float>* out = nullptr);
  // Rank `rank`'s ids resolved on the device (resolve.hpp) into the workspace's lookup_g and
  // lookup_tab (sequence) or lookup_valid (pooled); r.bag_feat made here. False when some id is
  // refused: the host's lookup gives the error.
  bool resolve_on_device(const Plan& plan, int rank, const std::vector<int64_t>& values,
                         const FeatureRows& rows, ResolvedRuns& r);
  // What the host resolved (r.g, r.valid) up to lookup_g and lookup_tab or lookup_valid.
  void upload_resolved(const Plan& plan, const ResolvedRuns& r);
  // The rows of the ids resolved above made into `out`: left queued on the stream.
  void make_on_device(const Plan& plan, const FeatureRows& rows, const ResolvedRuns& r,
                      const std::vector<float>& weights, DeviceBuffer<float>& out);
  // Where each feature's table rows are on the device, uploading dense weights not there yet;
  // nullopt when some table's rows are the host's to make (see FeatureRows).
  std::optional<FeatureRows> resolve_rows(const Plan& plan, const EmbeddingSource& source);
  // The device copy of a table's dense weights (uploaded on first use), or nullptr when they do
  // not fit the backend's share of the device.
  const float* device_rows(const EmbeddingSource::TableRows& t);
  // Rank s's input of an output dist to `dst` (t.n floats): uploaded from the host, or copied on
  // the device from the tensor kept under t.kept. Throws Error when t has neither.
  void put_local(float* dst, const TensorRef& t, int64_t s);
  // Where rank r's kept input of n floats goes in the workspace's `kept`, which grows (and its
  // stride widens) as needed, the inputs kept so far moving with it.
  float* input_slot(int r, int64_t n);
  // True when every local_embs[d] is the input kept for rank d (keep()), all of n elements: the
  // pooled dist reads them where they are, one every input_stride_ floats.
  bool all_kept_inputs(const std::vector<TensorRef>& local_embs, int64_t n) const;
  // Place::kept: the dists' outputs go to held_out and each rank's lies at held_[r].
  DeviceBuffer<float>& output_buffer(Place place, int64_t W);

  // What the host makes: rows the device cannot make, errors in the reference's words.
  std::unique_ptr<Backend> host_ = make_cpu_backend(hardware_threads());
  // The outputs kept (Kept::Role::output): where the last kept dist's output of each rank lies in
  // the workspace's held_out ([W] of {first element, elements}; first < 0: none).
  std::vector<std::pair<int64_t, int64_t>> held_;
  // The shape of the lookup kept for each rank (Kept::Role::lookup; workspace's kept_lookups).
  std::vector<std::optional<std::vector<int64_t>>> kept_lookup_shape_;
  // The inputs kept (Kept::Role::input): rank r's, of input_n_[r] floats (-1: none), at
  // r * input_stride_ of the workspace's `kept`.
  std::vector<int64_t> input_n_;
  int64_t input_stride_ = 0;
  // Dense weights stay on the device up to this many bytes (kDenseShare of its memory).
  int64_t dense_budget_ = 0;

  int device_;
  std::string desc_;
  cudaStream_t stream_ = nullptr;
  // Device buffers and pinned staging of every call, kept across calls (workspace.hpp).
  std::unique_ptr<cuda::BackendWorkspace> ws_;
  std::unique_ptr<cuda::DeviceComparator> comparator_;  // on ws_ and stream_
};

// Resolves every id on every core (the host's share: a per-id table walk): row_of(f, p) is id
// p's RowRef (lookup_row, the reference's rule). False when an id is out of bounds under
// bounds_check=error, or its row is past feature f's dense rows (limit[f]): the caller leaves
// those to the CPU reference, whose error text is the one to give.
template <class RowOf>
bool resolve_ids(const Plan& plan, const std::vector<std::optional<uint64_t>>& limit,
                 ResolvedRuns& r, RowOf&& row_of) {
  const TraceSpan span("resolve ids");
  const std::vector<int64_t>& bag0 = r.bag0;
  r.g.resize(size_t(r.off.back()));
  r.valid.resize(size_t(r.off.back()));
  r.bag_feat.resize(size_t(bag0.back()));
  std::atomic<bool> oob_error{false};
  parallel_for(
      hardware_threads(), bag0.back(),
      [&](int64_t j0, int64_t j1) {
        each_bag(bag0, j0, j1, [&](int64_t f, int64_t j) {
          r.bag_feat[j] = static_cast<int32_t>(f);
          for (int64_t p = r.off[j]; p < r.off[j + 1]; ++p) {
            const RowRef ref = row_of(f, p);
            if ((ref.oob && plan.bounds_check == BoundsCheck::error) ||
                (ref.valid && limit[size_t(f)] && ref.g >= *limit[size_t(f)]))
              oob_error = true;
            r.g[p] = ref.g;
            r.valid[p] = ref.valid ? 1 : 0;
          }
        });
      },
      /*grain=*/1024);
  return !oob_error;
}

std::vector<BucketizedKjt> CudaBackend::bucketize(const Plan& plan,
                                                  const std::vector<const Kjt*>& kjts) {
  CUDA_CHECK(cudaSetDevice(device_));
  for (const Kjt* k : kjts) {
    const int64_t N = k->num_ids();
    int64_t sum = 0;
    for (int64_t l : k->lengths) sum += l;
    if (sum != N)
      throw Error("bucketize: lengths sum to " + std::to_string(sum) + " but the KJT has " +
                  std::to_string(N) + " values");
    if (k->weighted != kjts.front()->weighted ||
        (k->weighted && static_cast<int64_t>(k->weights.size()) != N))
      throw Error("bucketize: " + std::to_string(k->weights.size()) + " weights for " +
                  std::to_string(N) + " values");
  }
  std::vector<BucketizedKjt> out(kjts.size());
  // One launch routes all its ids as int32 or as int64 values: KJTs of both types (ranks whose
  // captures differ) go one launch each.
  for (const Kjt* k : kjts)
    if (k->values_type != kjts.front()->values_type) {
      for (size_t q = 0; q < kjts.size(); ++q) out[q] = std::move(bucketize(plan, {kjts[q]})[0]);
      return out;
    }
  cuda::BatchedBucketize& bb = ws_->bucketize;
  {
    const TraceSpan span("bucketize upload");
    bb.assign(plan, kjts, /*with_dest_rank=*/false, stream_, &ws_->staging);
    bb.enable_one_pass(stream_);  // one bag per resident block: the one-kernel path (bucketize.cu)
    if (!bb.lengths.empty()) bb.launch(stream_);
  }
  const TraceSpan span("bucketize download");
  // Rank q's outputs: its W x L_q new_lengths from W * rank_bag_off[q], its ids' from
  // rank_id_off[q] (unbucketize_permute holds rank-local positions already). Only what the host
  // reads next comes back: no dest_rank, and unbucketize_permute for a sequence plan's context.
  const int64_t W = plan.world_size;
  const bool perm = plan.module == ModuleKind::sequence;
  std::vector<ToHost> parts;
  const auto slice = [&](auto& v, const auto& d, int64_t at, int64_t n) {
    v.resize(static_cast<size_t>(n));
    if (n > 0) parts.push_back({v.data(), d.data() + at, sizeof(v[0]) * static_cast<size_t>(n)});
  };
  for (size_t q = 0; q < kjts.size(); ++q) {
    BucketizedKjt& o = out[q];
    const int64_t b0 = bb.rank_bag_off[q], L = bb.rank_bag_off[q + 1] - b0;
    const int64_t i0 = bb.rank_id_off[q], N = bb.rank_id_off[q + 1] - i0;
    slice(o.new_lengths, bb.d_new_lengths, W * b0, W * L);
    slice(o.new_values, bb.d_new_values, i0, N);
    if (perm) slice(o.unbucketize_permute, bb.d_perm, i0, N);
    if (kjts[q]->weighted) slice(o.new_weights, bb.d_new_weights, i0, N);
  }
  ws_->staging.download(parts, stream_);
  return out;
}

Tensor CudaBackend::lookup(const Plan& plan, int rank, const LookupKjt& k,
                           const EmbeddingSource& source, Place place) {
  if (place == Place::kept && rank >= 0) {
    // Made into the rank's kept slot: nothing comes back but the shape, and the work is left
    // queued on the stream (what reads it is ordered after it).
    const size_t r = size_t(rank);
    if (r < kept_lookup_shape_.size()) kept_lookup_shape_[r].reset();  // until made again
    std::vector<DeviceBuffer<float>>& kept = ws_->kept_lookups;
    if (kept.size() <= r) kept.resize(r + 1);
    const std::optional<std::vector<int64_t>> shape =
        lookup_on_device(plan, rank, k, source, &kept[r]);
    if (!shape) return host_->lookup(plan, rank, k, source, Place::host);
    if (kept_lookup_shape_.size() <= r) kept_lookup_shape_.resize(r + 1);
    kept_lookup_shape_[r] = *shape;
    Tensor out;
    out.t.dtype = plan.data_type();
    out.t.shape = *shape;
    out.kept = Kept{Kept::Role::lookup, rank};
    return out;
  }
  const std::optional<std::vector<int64_t>> shape = lookup_on_device(plan, rank, k, source);
  if (!shape) return host_->lookup(plan, rank, k, source, Place::host);
  Tensor out;
  out.t.dtype = plan.data_type();
  out.t.shape = *shape;
  ws_->staging.download({into(out.t.data, ws_->rows_out)}, stream_);
  return out;
}

// Rank r's slot of the kept inputs (input_slot). A rank's slot is its own: keeping rank r
// replaces rank r's input only.
std::optional<Kept> CudaBackend::keep(const EmbTensor& host, int rank) {
  if (rank < 0) return std::nullopt;
  const int64_t n = host.numel();
  if (int64_t(host.data.size()) != n)
    throw Error("keep: a tensor of " + std::to_string(n) + " elements has " +
                std::to_string(host.data.size()) + " values");
  CUDA_CHECK(cudaSetDevice(device_));
  const size_t r = size_t(rank);
  if (input_n_.size() <= r) input_n_.resize(r + 1, -1);
  input_n_[r] = -1;  // until uploaded
  float* slot = input_slot(rank, n);
  {
    const TraceSpan span("upload", n);
    ws_->staging.upload(slot, host.data.data(), sizeof(float) * size_t(n), stream_);
  }
  input_n_[r] = n;
  return Kept{Kept::Role::input, rank};
}

// The kept inputs lie at r * input_stride_ of the workspace's `kept`, so that a pooled dist whose
// W inputs they all are reads them in place (launch_reduce takes the stride). A slot larger than
// the stride moves every kept slot to a wider stride (a quarter more, as a sequence batch's ranks
// differ a little); the buffer grows by doubling as ranks come (a replay keeps rank 0, 1, ... in
// turn). Either way the slots kept so far move with it, copied on the device.
float* CudaBackend::input_slot(int r, int64_t n) {
  DeviceBuffer<float>& buf = ws_->kept;
  const int64_t old = input_stride_;
  // Widened to a multiple of 4 floats: the reduce's vector loads take aligned slots.
  const int64_t stride = n <= old ? old : old == 0 ? n : (std::max(n, old + old / 4) + 3) / 4 * 4;
  if (stride == old && (int64_t(r) + 1) * stride <= buf.size()) return buf.data() + r * stride;
  const int64_t have = old > 0 ? buf.size() / old : 0;  // slots the buffer holds now
  const int64_t slots = std::max<int64_t>(r + 1, stride == old ? 2 * have : have);
  DeviceBuffer<float> next(slots * stride);
  for (size_t i = 0; i < input_n_.size(); ++i)
    if (input_n_[i] > 0)
      CUDA_CHECK(cudaMemcpyAsync(next.data() + int64_t(i) * stride, buf.data() + int64_t(i) * old,
                                 sizeof(float) * size_t(input_n_[i]), cudaMemcpyDeviceToDevice,
                                 stream_));
  buf = std::move(next);  // cudaFree of the old one waits for the copies
  input_stride_ = stride;
  return buf.data() + r * stride;
}

std::optional<const float*> CudaBackend::kept_data(const Kept& k, int64_t n) const {
  const size_t r = size_t(k.rank);
  if (k.rank < 0) return std::nullopt;
  switch (k.role) {
    case Kept::Role::lookup:
      if (r >= kept_lookup_shape_.size() || !kept_lookup_shape_[r] ||
          shape_numel(*kept_lookup_shape_[r]) != n)
        return std::nullopt;
      return ws_->kept_lookups[r].data();
    case Kept::Role::output:
      if (r >= held_.size() || held_[r].first < 0 || held_[r].second != n) return std::nullopt;
      return ws_->held_out.data() + held_[r].first;
    case Kept::Role::input:
      if (r >= input_n_.size() || input_n_[r] != n) return std::nullopt;
      return ws_->kept.data() + int64_t(r) * input_stride_;
  }
  return std::nullopt;
}

// Any malformed input, a bounds_check=error hit or a row past dense weights goes to the CPU
// reference, so the error text is the reference's; so do tables whose rows the device cannot
// make (resolve_rows).
std::optional<std::vector<int64_t>> CudaBackend::lookup_on_device(const Plan& plan, int rank,
                                                                  const LookupKjt& k,
                                                                  const EmbeddingSource& source,
                                                                  DeviceBuffer<float>* out) {
  ResolvedRuns r;
  r.off = complete_cumsum(k.lengths);
  if (r.off.back() != static_cast<int64_t>(k.values.size())) return std::nullopt;
  const std::optional<FeatureRows> rows = resolve_rows(plan, source);
  if (!rows) return std::nullopt;
  LookupOutputLayout L = lookup_output_layout(plan, k);
  r.shape = std::move(L.shape);
  r.bag0 = std::move(L.bag0);
  r.dst = std::move(L.dst);
  if (!resolve_on_device(plan, rank, k.values, *rows, r)) return std::nullopt;
  make_on_device(plan, *rows, r, k.weights, out ? *out : ws_->rows_out);
  return r.shape;
}

bool CudaBackend::resolve_on_device(const Plan& plan, int rank, const std::vector<int64_t>& values,
                                    const FeatureRows& rows, ResolvedRuns& r) {
  const TraceSpan span("resolve ids on device");
  CUDA_CHECK(cudaSetDevice(device_));
  const int64_t F = plan.num_features(), N = r.off.back();
  std::vector<int64_t> feat_ids(static_cast<size_t>(F + 1));
  std::vector<cuda::RowRule> rules(static_cast<size_t>(F));
  bool can_refuse = false;  // else nothing need come back before the rows are made
  for (int64_t f = 0; f <= F; ++f) feat_ids[size_t(f)] = r.off[size_t(r.bag0[size_t(f)])];
  for (int64_t f = 0; f < F; ++f) {
    const FeatureInfo& fi = plan.features[size_t(f)];
    cuda::RowRule& u = rules[size_t(f)];
    if (fi.dist_type == DistType::continuous) {
      const RankRows rr = rank_rows(fi, rank);
      u.continuous = 1;
      u.first = static_cast<uint64_t>(rr.first);
      u.rows = static_cast<uint64_t>(rr.rows);
      can_refuse |= plan.bounds_check == BoundsCheck::error;
    }
    if (const std::optional<uint64_t>& limit = rows.limit[size_t(f)]) {
      u.has_limit = 1;
      u.limit = *limit;
      can_refuse = true;
    }
  }
  const bool sequence = plan.module == ModuleKind::sequence;
  if (!sequence) {  // the pooled kernel reads a bag's feature
    r.bag_feat.resize(size_t(r.bag0.back()));
    for (int64_t f = 0; f < F; ++f)
      std::fill(r.bag_feat.begin() + r.bag0[size_t(f)], r.bag_feat.begin() + r.bag0[size_t(f + 1)],
                static_cast<int32_t>(f));
  }
  cuda::BackendWorkspace& ws = *ws_;
  ws.staging.upload(ws.lookup_values, values, stream_);
  ws.staging.upload(ws.lookup_feat_ids, feat_ids, stream_);
  ws.staging.upload(ws.lookup_rules, rules, stream_);
  ws.lookup_g.resize(N);
  if (sequence)
    ws.lookup_tab.resize(N);
  else
    ws.lookup_valid.resize(N);
  cuda::ResolveArgs a;
  a.n = N;
  a.values = ws.lookup_values.data();
  a.num_features = F;
  a.feat_id_off = ws.lookup_feat_ids.data();
  a.rules = ws.lookup_rules.data();
  a.bounds_error = plan.bounds_check == BoundsCheck::error ? 1 : 0;
  a.g = ws.lookup_g.data();
  a.feat = sequence ? ws.lookup_tab.data() : nullptr;
  a.valid = sequence ? nullptr : ws.lookup_valid.data();
  ws.lookup_refused.resize(1);
  a.refused = ws.lookup_refused.data();
  if (can_refuse) CUDA_CHECK(cudaMemsetAsync(a.refused, 0, sizeof(int32_t), stream_));
  cuda::launch_resolve_rows(a, stream_);
  if (!can_refuse) return true;
  return ws.staging.download(ws.lookup_refused, stream_)[0] == 0;
}

void CudaBackend::upload_resolved(const Plan& plan, const ResolvedRuns& r) {
  cuda::BackendWorkspace& ws = *ws_;
  ws.staging.upload(ws.lookup_g, r.g, stream_);
  if (plan.module != ModuleKind::sequence) {
    ws.staging.upload(ws.lookup_valid, r.valid, stream_);
    return;
  }
  const int64_t N = r.off.back(), nbags = r.bag0.back();
  std::vector<int32_t> tab(static_cast<size_t>(N));
  for (int64_t j = 0; j < nbags; ++j)
    for (int64_t p = r.off[j]; p < r.off[j + 1]; ++p) tab[p] = r.valid[p] ? r.bag_feat[j] : -1;
  ws.staging.upload(ws.lookup_tab, tab, stream_);
}

// The unsharded reference (reference_output): every id routed as the input dist routes it,
// then looked up on the rank it lands on.
std::optional<std::vector<int64_t>> CudaBackend::reference_on_device(
    const Plan& plan, const Kjt& kjt, const EmbeddingSource& source) {
  try {
    check_kjt(plan, kjt, "");
  } catch (const Error&) {
    return std::nullopt;
  }
  const std::optional<FeatureRows> rows = resolve_rows(plan, source);
  if (!rows) return std::nullopt;
  const int64_t F = plan.num_features(), W = plan.world_size;
  ResolvedRuns r;
  r.shape = reference_shape(plan, kjt);
  r.off = kjt.offsets();
  r.bag0.resize(size_t(F + 1));
  for (int64_t f = 0; f <= F; ++f) r.bag0[size_t(f)] = f < F ? kjt.bag_begin(f) : kjt.num_bags();
  if (plan.module == ModuleKind::pooled) {
    r.dst.resize(size_t(kjt.num_bags()));
    int64_t e1d = 0;  // VBE 1-D [f][b][d]: where feature f's slices start
    for (int64_t f = 0; f < F; ++f) {
      const int64_t D = plan.features[f].dim;
      for (int64_t b = 0; b < kjt.batch_size(f); ++b)
        r.dst[size_t(r.bag0[f] + b)] =
            kjt.is_vbe() ? e1d + b * D : b * plan.sum_dim + plan.features[f].column_offset;
      e1d += kjt.batch_size(f) * D;
    }
  }
  const auto row_of = [&](int64_t f, int64_t i) {
    const FeatureInfo& fi = plan.features[f];
    const Route rt = route_feature(fi, kjt.values[i], kjt.values_type, W);
    return lookup_row(plan, f, rt.dest, rt.local);
  };
  if (!resolve_ids(plan, rows->limit, r, row_of)) return std::nullopt;
  CUDA_CHECK(cudaSetDevice(device_));
  upload_resolved(plan, r);
  make_on_device(plan, *rows, r, kjt.weighted ? kjt.weights : std::vector<float>{}, ws_->rows_out);
  return r.shape;
}

// The table rows of each feature: the oracle's seed, or dense weights on the device (uploaded
// here the first time), from the slice's first column on. nullopt: some table's rows only the
// source's row() knows, or its weights are past the device's share.
std::optional<FeatureRows> CudaBackend::resolve_rows(const Plan& plan,
                                                     const EmbeddingSource& source) {
  const size_t F = size_t(plan.num_features());
  std::vector<std::optional<std::pair<cuda::DeviceRows, std::optional<uint64_t>>>> table(
      plan.tables.size());
  FeatureRows out;
  out.rows.resize(F);
  out.limit.resize(F);
  for (size_t f = 0; f < F; ++f) {
    const size_t t = size_t(plan.features[f].table);
    if (!table[t]) {
      const EmbeddingSource::TableRows tr = source.table_rows(int(t));
      cuda::DeviceRows d;
      d.col0 = tr.col0;
      std::optional<uint64_t> limit;
      if (tr.weights) {
        if (tr.stride <= 0) return std::nullopt;
        d.dense = device_rows(tr);
        if (!d.dense) return std::nullopt;
        d.stride = tr.stride;
        limit = tr.weights->size() / static_cast<size_t>(tr.stride);
      } else if (tr.oracle_table_seed) {
        d.seed = *tr.oracle_table_seed;
      } else {
        return std::nullopt;
      }
      table[t] = std::make_pair(d, limit);
    }
    out.rows[f] = table[t]->first;
    out.limit[f] = table[t]->second;
  }
  return out;
}

// A source's tables are uploaded once and kept while they fit the share (a replay has one source
// at a time, a test several). When another table would not fit, the tables of other sources go
// first; what still does not fit is the host's to look up.
const float* CudaBackend::device_rows(const EmbeddingSource::TableRows& t) {
  std::vector<cuda::BackendWorkspace::DenseTable>& kept = ws_->dense_tables;
  int64_t in_use = 0;
  for (const auto& d : kept) {
    if (d.owner == t.weights_owner && d.host == t.weights) return d.dev.data();
    in_use += static_cast<int64_t>(sizeof(float)) * d.dev.size();
  }
  const int64_t bytes = static_cast<int64_t>(sizeof(float) * t.weights->size());
  if (in_use + bytes > dense_budget_) {
    kept.erase(std::remove_if(kept.begin(), kept.end(),
                              [&](const auto& d) { return d.owner != t.weights_owner; }),
               kept.end());
    in_use = 0;
    for (const auto& d : kept) in_use += static_cast<int64_t>(sizeof(float)) * d.dev.size();
    if (in_use + bytes > dense_budget_) return nullptr;
  }
  CUDA_CHECK(cudaSetDevice(device_));
  kept.push_back({t.weights_owner, t.weights, DeviceBuffer<float>()});
  ws_->staging.upload(kept.back().dev, *t.weights, stream_);
  return kept.back().dev.data();
}

// Makes the runs of the ids resolved in the workspace (resolve_on_device, upload_resolved) into
// d_out: table rows per id (sequence) or the pooled sums per bag, rounded to the TBE dtype.
// Leaves the work queued on the stream.
void CudaBackend::make_on_device(const Plan& plan, const FeatureRows& rows, const ResolvedRuns& r,
                                 const std::vector<float>& weights, DeviceBuffer<float>& d_out) {
  CUDA_CHECK(cudaSetDevice(device_));
  const int64_t F = plan.num_features(), N = r.off.back(), nbags = r.bag0.back();
  std::vector<int64_t> feat_dim(static_cast<size_t>(F));
  for (int64_t f = 0; f < F; ++f) feat_dim[size_t(f)] = plan.features[f].dim;
  cuda::BackendWorkspace& ws = *ws_;
  cuda::PinnedStaging& st = ws.staging;
  st.upload(ws.lookup_rows, rows.rows, stream_);
  const int64_t numel = shape_numel(r.shape);
  d_out.resize(numel);
  if (plan.module == ModuleKind::sequence) {
    cuda::launch_lookup_rows(ws.lookup_g.data(), ws.lookup_tab.data(), ws.lookup_rows.data(), N,
                             plan.seq_dim(), d_out.data(), stream_);
    return;
  }
  st.upload(ws.lookup_bag_off, r.off, stream_);
  st.upload(ws.lookup_bag_out, r.dst, stream_);
  st.upload(ws.lookup_feat_dim, feat_dim, stream_);
  st.upload(ws.lookup_bag_feat, r.bag_feat, stream_);
  const bool weighted = !weights.empty();
  if (weighted) st.upload(ws.lookup_weights, weights, stream_);
  // Every output element belongs to exactly one bag, but zero first anyway (F == 0 etc.).
  if (numel > 0) CUDA_CHECK(cudaMemsetAsync(d_out.data(), 0, sizeof(float) * numel, stream_));
  cuda::PooledLookupArgs a;
  a.num_bags = nbags;
  a.bag_offsets = ws.lookup_bag_off.data();
  a.bag_out = ws.lookup_bag_out.data();
  a.bag_feat = ws.lookup_bag_feat.data();
  a.g = ws.lookup_g.data();
  a.valid = ws.lookup_valid.data();
  a.weights = weighted ? ws.lookup_weights.data() : nullptr;
  a.feat_dim = ws.lookup_feat_dim.data();
  a.rows = ws.lookup_rows.data();
  a.out_dtype = cuda::precision(plan.data_type());
  a.out = d_out.data();
  cuda::launch_pooled_lookup(a, stream_);
}

}  // namespace

namespace cuda {

SeqDistTables build_seq_dist_tables(const Plan& plan,
                                    const std::vector<const EmbTensor*>& local_embs,
                                    const std::vector<const ShardingContext*>& ctx) {
  const int64_t W = plan.world_size;
  // Forward recat as segments per owner s: send segment k copies seg_len rows from local
  // row seg_src (what permute_2D/1D_sparse_data(invert(recat), lengths*D, local) does).
  SeqDistTables t;
  std::vector<int64_t>& seg_base = t.seg_base;
  std::vector<int64_t>& seg_out = t.seg_out;
  std::vector<int64_t>& seg_src = t.seg_src;
  std::vector<int64_t>& local_row_off = t.local_row_off;
  seg_base = {0};
  const SequenceDistCheck chk = check_sequence_dist(plan, local_embs, ctx);
  local_row_off = {0};
  for (int64_t s = 0; s < W; ++s) {
    const SequenceSendPlan& sp = chk.senders[s];
    local_row_off.push_back(local_row_off.back() + sp.rows);
    const std::vector<int64_t>& fwd = sp.forward_recat;
    const std::vector<int64_t> in_off = complete_cumsum(sp.segment_lengths);
    int64_t o = 0;
    for (size_t k2 = 0; k2 < fwd.size(); ++k2) {
      seg_out.push_back(o);
      seg_src.push_back(in_off[fwd[k2]]);
      o += sp.segment_lengths[fwd[k2]];
    }
    if (fwd.empty()) {  // F == 0: keep a well-formed (empty) segment table
      seg_out.push_back(0);
      seg_src.push_back(0);
    }
    seg_base.push_back(static_cast<int64_t>(seg_out.size()));
  }
  std::vector<int64_t>& recv_flat = t.recv_off;
  std::vector<int64_t>& send_flat = t.send_off;
  std::vector<int64_t>& out_row_off = t.out_row_off;
  std::vector<int64_t>& perm_all = t.perm;
  out_row_off = {0};
  for (int64_t d = 0; d < W; ++d) {
    const std::vector<int64_t>& ro = chk.recv_off[d];
    const std::vector<int64_t>& so = chk.senders[d].send_off;
    const std::vector<int64_t>& perm = *ctx[d]->unbucketize_permute;
    recv_flat.insert(recv_flat.end(), ro.begin(), ro.end());
    send_flat.insert(send_flat.end(), so.begin(), so.end());
    out_row_off.push_back(out_row_off.back() + static_cast<int64_t>(perm.size()));
    perm_all.insert(perm_all.end(), perm.begin(), perm.end());
  }
  return t;
}

}  // namespace cuda

namespace {

void CudaBackend::put_local(float* dst, const TensorRef& t, int64_t s) {
  const int64_t n = t.n;
  if (!t.kept) {
    if (n > 0 && !t.host)
      throw Error("output dist: local_embs of rank " + std::to_string(s) +
                  " has neither data nor a kept tensor");
    ws_->staging.upload(dst, t.host, sizeof(float) * static_cast<size_t>(n), stream_);
    return;
  }
  const std::optional<const float*> src = kept_data(*t.kept, n);
  if (!src)
    throw Error("output dist: local_embs of rank " + std::to_string(s) +
                " names a kept tensor (rank " + std::to_string(t.kept->rank) +
                ") that is not kept with " + std::to_string(n) + " elements");
  if (n > 0)
    CUDA_CHECK(
        cudaMemcpyAsync(dst, *src, sizeof(float) * size_t(n), cudaMemcpyDeviceToDevice, stream_));
}

bool CudaBackend::all_kept_inputs(const std::vector<TensorRef>& local_embs, int64_t n) const {
  for (size_t d = 0; d < local_embs.size(); ++d) {
    const std::optional<Kept>& k = local_embs[d].kept;
    if (!k || k->role != Kept::Role::input || size_t(k->rank) != d || !kept_data(*k, n))
      return false;
  }
  return true;
}

DeviceBuffer<float>& CudaBackend::output_buffer(Place place, int64_t W) {
  if (place == Place::host) return ws_->rows_out;
  held_.assign(size_t(W), {-1, 0});  // this dist's outputs replace the kept ones
  return ws_->held_out;
}

void CudaBackend::sequence_output_dist(const Plan& plan, const std::vector<TensorRef>& local_embs,
                                       const std::vector<const ShardingContext*>& ctx, Place place,
                                       const OutputSink& sink) {
  const int64_t W = plan.world_size, D = plan.seq_dim();
  const std::vector<EmbTensor> shapes = shape_stand_ins(local_embs);
  const cuda::SeqDistTables t = cuda::build_seq_dist_tables(plan, tensor_pointers(shapes), ctx);
  const std::vector<int64_t>& local_row_off = t.local_row_off;
  const std::vector<int64_t>& out_row_off = t.out_row_off;
  CUDA_CHECK(cudaSetDevice(device_));
  cuda::PinnedStaging& st = ws_->staging;
  DeviceBuffer<float>& d_local = ws_->rows_in;
  d_local.resize(local_row_off.back() * D);
  for (int64_t s = 0; s < W; ++s)
    put_local(d_local.data() + local_row_off[s] * D, local_embs[s], s);
  DeviceBuffer<float>& d_out = output_buffer(place, W);
  ws_->seq_tables.assign(t, stream_, &st);
  d_out.resize(out_row_off.back() * D);
  cuda::launch_seq_fused(ws_->seq_tables.args(plan, d_local.data()), d_out.data(), stream_);
  // Rank by rank, so that the caller can compare and drop each output before the next.
  for (int64_t d = 0; d < W; ++d) {
    const int64_t n = out_row_off[d + 1] - out_row_off[d];
    Tensor out;
    out.t.dtype = output_dist_dtype(plan);
    out.t.shape = {n, D};
    if (place == Place::kept) {
      held_[size_t(d)] = {out_row_off[d] * D, n * D};
      out.kept = Kept{Kept::Role::output, int(d)};
    } else {
      out.t.data.resize(static_cast<size_t>(n * D));
      st.download({{out.t.data.data(), d_out.data() + out_row_off[d] * D, sizeof(float) * n * D}},
                  stream_);
    }
    sink(static_cast<int>(d), std::move(out));
  }
}

void CudaBackend::pooled_output_dist(const Plan& plan, bool variable_batch,
                                     const std::vector<TensorRef>& local_embs,
                                     const std::vector<const ShardingContext*>& ctx, Place place,
                                     const OutputSink& sink) {
  const int64_t W = plan.world_size;
  const DType rd = pooled_reduce_dtype(plan);
  const bool codec = plan.comm_precision != DType::f32;
  const PooledDistCheck chk = check_pooled_dist(plan, variable_batch, local_embs, ctx);
  // Every rank's local_embs has the same size (the check enforces it), so the W inputs
  // are stacked back to back and chunk r of each is at the receiver's offsets.
  const std::vector<int64_t>& chunk_len = chk.chunk_len;
  CUDA_CHECK(cudaSetDevice(device_));
  const int64_t n = W ? local_embs[0].n : 0;  // all equal, checked above
  cuda::PinnedStaging& st = ws_->staging;
  // The inputs a lookup check just compared are on the device already (keep()), one every
  // input_stride_ floats: read in place, unless the codec is to round them (it works in place,
  // and they stay kept as they were).
  const float* parts = nullptr;
  int64_t stride = n;
  if (all_kept_inputs(local_embs, n) && !codec) {
    parts = ws_->kept.data();
    stride = input_stride_;
  } else {
    ws_->rows_in.resize(W * n);
    float* in = ws_->rows_in.data();
    for (int64_t d = 0; d < W; ++d) put_local(in + d * n, local_embs[d], d);
    if (codec) cuda::launch_codec(in, W * n, cuda::precision(rd), stream_);
    parts = in;
  }
  DeviceBuffer<float>& d_out = output_buffer(place, W);
  d_out.resize(n);
  cuda::launch_reduce(parts, W, stride, n, cuda::precision(rd), d_out.data(), stream_);
  int64_t base = 0;
  for (int64_t r = 0; r < W; ++r) {
    const int64_t len = chunk_len[r];
    Tensor out;
    out.t.dtype = output_dist_dtype(plan);
    out.t.shape = variable_batch ? std::vector<int64_t>{len}
                                 : std::vector<int64_t>{len / std::max<int64_t>(1, plan.sum_dim),
                                                        plan.sum_dim};
    if (place == Place::kept) {
      held_[size_t(r)] = {base, len};
      out.kept = Kept{Kept::Role::output, int(r)};
    } else {
      out.t.data.resize(static_cast<size_t>(len));
      st.download({{out.t.data.data(), d_out.data() + base, sizeof(float) * len}}, stream_);
    }
    base += len;
    sink(static_cast<int>(r), std::move(out));
  }
}

}  // namespace

namespace cuda {

void BatchedBucketize::assign(const Plan& plan, const std::vector<const Kjt*>& kjts,
                              bool with_dest_rank, cudaStream_t s, PinnedStaging* staging) {
  // R KJTs (ranks) of a plan with W buckets: the bench and the GPU test pass all W ranks,
  // the backend one (R = 1). new_lengths has W entries per bag either way.
  // The kernels route continuous ids by one block size per feature: an inference plan's uneven
  // shards (bucketize_pos) they cannot route, and a wrong split must not pass for the right one.
  for (const FeatureInfo& fi : plan.features)
    if (!fi.bucketize_pos.empty())
      throw Error("the cuda backend cannot bucketize this plan: " + engine_routing_gap(plan) +
                  "; --backend cpu can");
  const int64_t R = static_cast<int64_t>(kjts.size()), W = plan.world_size;
  const int64_t F = plan.num_features();
  std::vector<int64_t> fbo;  // [R x (F+1)] rank-local first bag of each feature
  lengths.clear();
  rank_bag_off = {0};
  rank_id_off = {0};
  max_rank_bags = 0;
  int64_t max_len = 0;
  bool weighted = false;
  for (const Kjt* k : kjts) {
    lengths.insert(lengths.end(), k->lengths.begin(), k->lengths.end());
    weighted |= k->weighted;
    for (int64_t f = 0; f < F; ++f) fbo.push_back(k->bag_begin(f));
    fbo.push_back(k->num_bags());
    rank_bag_off.push_back(rank_bag_off.back() + k->num_bags());
    rank_id_off.push_back(rank_id_off.back() + k->num_ids());
    max_rank_bags = std::max(max_rank_bags, k->num_bags());
    for (int64_t l : k->lengths) max_len = std::max(max_len, l);
  }
  const int64_t N = rank_id_off.back(), L = rank_bag_off.back();
  // The ids (and weights) go up rank by rank into one buffer: a host copy of all of them would
  // be a second batch of ids in memory.
  d_ids.resize(N);
  d_weights.resize(weighted ? N : 0);
  for (size_t q = 0; q < kjts.size(); ++q) {
    const Kjt& k = *kjts[q];
    const int64_t at = rank_id_off[q];
    put_at(d_ids.data() + at, k.values.data(), k.values.size(), s, staging);
    if (weighted) put_at(d_weights.data() + at, k.weights.data(), k.weights.size(), s, staging);
  }
  std::vector<uint64_t> blk(static_cast<size_t>(F));
  std::vector<RouteRule> dt(static_cast<size_t>(F));
  for (int64_t f = 0; f < F; ++f) {
    blk[f] = static_cast<uint64_t>(plan.features[f].block_size);
    dt[f] = route_rule(plan.features[f].dist_type);
  }
  put(d_lengths, lengths, s, staging);
  put(d_rank_bag_off, rank_bag_off, s, staging);
  put(d_feat_bag_off, fbo, s, staging);
  put(d_block_sizes, blk, s, staging);
  put(d_dist_types, dt, s, staging);
  d_bag_offsets.resize(L + 1);
  d_new_lengths.resize(W * L);
  d_new_offsets.resize(W * L);
  d_new_values.resize(N);
  d_perm.resize(N);
  // An output this batch does not have is sized 0 (its allocation, if any, is kept).
  d_dest_rank.resize(with_dest_rank ? N : 0);
  d_new_weights.resize(weighted ? N : 0);
  const size_t tb = std::max(bucketize_scan_temp_bytes(W * L), bucketize_scan_temp_bytes(L));
  d_scan_temp.resize(static_cast<int64_t>(tb));
  args = BucketizeArgs{};
  args.num_ranks = R;
  args.world_size = W;
  args.num_features = F;
  args.total_bags = L;
  args.total_ids = N;
  args.rank_bag_off = d_rank_bag_off.data();
  args.feat_bag_off = d_feat_bag_off.data();
  args.bag_offsets = d_bag_offsets.data();
  args.ids = d_ids.data();
  args.weights = weighted ? d_weights.data() : nullptr;
  args.block_sizes = d_block_sizes.data();
  args.dist_types = d_dist_types.data();
  args.ids_i32 = !kjts.empty() && kjts[0]->values_type == IndexType::i32;
  args.max_bag_len = max_len;
  args.new_lengths = d_new_lengths.data();
  args.new_offsets = d_new_offsets.data();
  args.new_values = d_new_values.data();
  args.new_weights = weighted ? d_new_weights.data() : nullptr;
  args.perm = d_perm.data();
  args.dest_rank = with_dest_rank ? d_dest_rank.data() : nullptr;
  args.scan_temp = d_scan_temp.data();
  args.scan_temp_bytes = tb;
  one_pass.max_rank_bags = max_rank_bags;  // the partition path's tiles need it too
  feat_bag_off = std::move(fbo);
  plan_tiles(0, s);
}

void BatchedBucketize::plan_tiles(int64_t tile_ids, cudaStream_t s) {
  // With a workspace, the automatic tiling keeps every tile resident where it can (the
  // partition's one-launch kernel needs it).
  const int64_t max_tiles = tile_ids <= 0 && one_pass.scratch && args.partition_one_launch
                                ? bucketize_partition_resident_capacity()
                                : 0;
  const PartitionTiling t = plan_partition_tiles(args.world_size, args.num_features, rank_bag_off,
                                                 feat_bag_off, lengths, tile_ids, max_tiles);
  args.tile_j0 = nullptr;
  args.tile_id0 = nullptr;
  args.tile_feat = nullptr;
  args.tiles_per_rank = t.tiles_per_rank;
  args.tile_max_bags = t.max_tile_bags;
  args.tile_max_ids = t.max_tile_ids;
  if (t.tile_j0.empty()) return;
  d_tile_j0.upload(t.tile_j0, s);
  d_tile_id0.upload(t.tile_id0, s);
  d_tile_feat.upload(t.tile_feat, s);
  args.tile_j0 = d_tile_j0.data();
  args.tile_id0 = d_tile_id0.data();
  args.tile_feat = d_tile_feat.data();
}

void BatchedBucketize::enable_one_pass(cudaStream_t s) {
  one_pass.max_rank_bags = max_rank_bags;
  if (one_pass.scratch) return;  // enabled by an earlier batch: same scratch, same epoch
  one_pass.scratch_bytes = bucketize_one_pass_scratch_bytes();
  if (one_pass.scratch_bytes == 0) return;  // no cooperative launch on this device
  d_one_pass_scratch.resize(static_cast<int64_t>(one_pass.scratch_bytes));
  one_pass.scratch = d_one_pass_scratch.data();
  bucketize_one_pass_scratch_init(one_pass.scratch, one_pass.scratch_bytes, s);
  plan_tiles(0, s);  // the partition's one launch may now take the batch: tiles for it
}

void SeqDistDevice::assign(const SeqDistTables& t, cudaStream_t s, PinnedStaging* staging) {
  world_size = static_cast<int64_t>(t.local_row_off.size()) - 1;
  total_local_rows = t.local_row_off.back();
  total_out_rows = t.out_row_off.back();
  put(local_row_off, t.local_row_off, s, staging);
  put(out_row_off, t.out_row_off, s, staging);
  put(perm, t.perm, s, staging);
  put(recv_off, t.recv_off, s, staging);
  put(send_off, t.send_off, s, staging);
  put(seg_base, t.seg_base, s, staging);
  put(seg_out, t.seg_out, s, staging);
  put(seg_src, t.seg_src, s, staging);
}

SeqDistArgs SeqDistDevice::args(const Plan& plan, const float* local) const {
  SeqDistArgs a;
  a.world_size = world_size;
  a.dim = plan.seq_dim();
  a.codec = precision(plan.comm_precision);
  a.total_local_rows = total_local_rows;
  a.total_out_rows = total_out_rows;
  a.local = local;
  a.local_row_off = local_row_off.data();
  a.out_row_off = out_row_off.data();
  a.perm = perm.data();
  a.recv_off = recv_off.data();
  a.send_off = send_off.data();
  a.seg_base = seg_base.data();
  a.seg_out_off = seg_out.data();
  a.seg_src = seg_src.data();
  return a;
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

bool cuda_device_available() {
  return cuda::device_available(0);
}

}  // namespace dynemb
