// Host dispatch of the NCCL backend. W ranks on G GPUs, k = W/G consecutive ranks per GPU; in one
// process every GPU is local, across processes (make_nccl_backend with a NcclProcessGroup) this
// process holds the global GPUs [q0, q1) and so the ranks [q0*k, q1*k): it uploads, sends,
// receives and hands out only those, while the tables of all W ranks (small, made from the
// contexts and shapes every process has) are built in every process alike.
// Contexts are validated exactly as the CPU reference does (the sequence tables come from
// the CUDA backend's build_seq_dist_tables, the pooled layout from check_pooled_dist), so a
// bad context is the same OutputDistFailure (rank, field) on every backend, and in every process
// before any collective.
//
// Sequence (docs/semantics.md §6), per local GPU g: upload the k local_embs [N_local_r, D] back to
// back, forward recat into the send buffer (launch_seq_recat over the k ranks), codec encode in
// place, then ONE all-to-all of the W*W blocks (r -> s: output_splits_r[s] rows) into the receive
// buffers [sum_r input_splits_s[r], D] of each destination s, then out_s = recv_s[perm_s]
// (launch_gather_rows).
// Pooled (docs/semantics.md §7), per local GPU g: upload the k local_embs [n] (n = sum_s B_s *
// sum_D, or the 1-D VBE length; equal on every rank), codec encode; then either
//   reduce-scatter (fp32 reduce dtype): local sum of the k buffers, ncclReduceScatter over G (chunk
//     g = the outputs of ranks g*k..g*k+k-1, equal because batch sizes are), or
//   all-to-all + reduce: GPU g receives, from every source d, the contiguous run of chunks
//     of its k ranks ([W][M_g]) and sums them in rank order d = 0..W-1 (launch_reduce, with
//     the low-precision rounding of a codec or of fp16/bf16 data): the CPU reference's
//     order, bit for bit.
// Then the download of each local rank's output, in rank order (MEAN tables stay sums here).
#include "nccl_backend.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <numeric>
#include <optional>
#include <string>

#include "cuda/cuda_backend.hpp"
#include "cuda_check.hpp"
#include "device_buffer.hpp"
#include "engine/dist_checks.hpp"
#include "engine/ops.hpp"
#include "gather.hpp"
#include "nccl_check.hpp"
#include "nccl_comm.hpp"
#include "pooled.hpp"

namespace dynemb {
namespace {

using cuda::DeviceBuffer;

// Host -> device copy of `n` floats on a stream (pageable memory: synchronous for the host).
void h2d(float* dst, const float* src, int64_t n, cudaStream_t s) {
  if (n > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(float) * n, cudaMemcpyHostToDevice, s));
}

// The pooled chunk layout after validation: destination r's output is chunk r of every
// source buffer, chunk_off[d][r] .. + chunk_len[r] (elements).
struct PooledLayout {
  std::vector<std::vector<int64_t>> chunk_off;  // [W][W+1]
  std::vector<int64_t> chunk_len;               // [W]
  bool equal = true;                            // every chunk_len equal (and non-VBE)
};

// Checks through the shared check_pooled_dist (engine/dist_checks.hpp: same rank, field and
// words as the other backends).
PooledLayout pooled_layout(const Plan& plan, bool variable_batch,
                           const std::vector<const EmbTensor*>& local_embs,
                           const std::vector<const ShardingContext*>& ctx) {
  PooledDistCheck c = check_pooled_dist(plan, variable_batch, local_embs, ctx);
  PooledLayout L;
  L.chunk_off = std::move(c.chunk_off);
  L.chunk_len = std::move(c.chunk_len);
  L.equal = !variable_batch && std::all_of(L.chunk_len.begin(), L.chunk_len.end(),
                                           [&](int64_t x) { return x == L.chunk_len[0]; });
  return L;
}

// Declared after a dist's device buffers, so that it runs before they are freed while an
// exception leaves the dist: it aborts the communicators, which stops NCCL kernels waiting on a
// peer that failed (cudaFree would otherwise wait for them forever). Disarmed once the
// collective has completed (done()): what the sink throws afterwards (a caller's check) leaves
// the communicators as they are, every process having finished its part.
class AbortOnThrow {
 public:
  explicit AbortOnThrow(nccl::World& w) : w_(w) {}
  ~AbortOnThrow() {
    if (armed_ && std::uncaught_exceptions() > pending_) w_.abort();
  }
  void done() { armed_ = false; }
  AbortOnThrow(const AbortOnThrow&) = delete;
  AbortOnThrow& operator=(const AbortOnThrow&) = delete;

 private:
  nccl::World& w_;
  int pending_ = std::uncaught_exceptions();
  bool armed_ = true;
};

class NcclBackend final : public Backend {
 public:
  // `pg` null: every GPU in this process. Otherwise one process of pg->size (collective: every
  // process constructs at the same time).
  NcclBackend(std::vector<int> devices, const NcclOptions& opt, const NcclProcessGroup* pg)
      : Backend("nccl"), devices_(devices), opt_(opt) {
    // Local failures (a missing device) first, before this process enters anything collective.
    for (int d : devices_) cuda_.push_back(make_cuda_backend(d));  // throws when missing
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, devices_[0]));
    desc_ = std::to_string(devices_.size()) + " x " + p.name + " (sm_" + std::to_string(p.major) +
            std::to_string(p.minor) + ")";
    if (pg) {
      spanning_ = join(*pg);
      desc_ += " in process " + std::to_string(pg->index) + " of " + std::to_string(pg->size) +
               " (" + std::to_string(spanning_->size()) + " GPUs)";
    } else {
      worlds_.emplace(static_cast<int>(devices_.size()), std::make_unique<nccl::World>(devices_));
    }
    desc_ += ", NCCL " + nccl_version();
  }
  std::string device() const override { return desc_; }

  // Input dist and lookup are per rank: the CUDA backend of the rank's GPU runs them.
  using Backend::bucketize;
  std::vector<BucketizedKjt> bucketize(const Plan& plan,
                                       const std::vector<const Kjt*>& kjts) override {
    return cuda_[0]->bucketize(plan, kjts);
  }
  // This backend keeps nothing (a rank's lookup kept by its GPU's CUDA backend is not where the
  // dists read): every tensor it makes is on the host, whatever `place` asks.
  Tensor lookup(const Plan& plan, int rank, const LookupKjt& kjt, const EmbeddingSource& source,
                Place /*place*/) override {
    // The rank's GPU when it is local (any rank's lookup runs on any GPU: it reads only the
    // rank's KJT and the tables), else this process's first GPU.
    const int64_t W = std::max<int64_t>(1, plan.world_size);
    const nccl::World& w = world(W);
    const int g = static_cast<int>(rank / (W / w.size()));
    return cuda_[w.is_local(g) ? g - w.first() : 0]->lookup(plan, rank, kjt, source, Place::host);
  }
  std::optional<Kept> keep(const EmbTensor& /*host*/, int /*rank*/) override {
    return std::nullopt;
  }
  void sequence_output_dist(const Plan& plan, const std::vector<TensorRef>& local_embs,
                            const std::vector<const ShardingContext*>& ctx, Place place,
                            const OutputSink& sink) override;
  void pooled_output_dist(const Plan& plan, bool variable_batch,
                          const std::vector<TensorRef>& local_embs,
                          const std::vector<const ShardingContext*>& ctx, Place place,
                          const OutputSink& sink) override;
  Comparator& comparator() override { return host_comparator(); }

 private:
  // Across processes: the one World of all processes' GPUs, joined at construction. Process 0
  // makes the unique id and broadcasts it with its GPU count; every process then checks it has
  // as many (NCCL would otherwise wait for ranks that never come) and joins.
  std::unique_ptr<nccl::World> join(const NcclProcessGroup& pg) {
    const int g = static_cast<int>(devices_.size());
    std::string msg(sizeof(ncclUniqueId) + sizeof(int32_t), '\0');  // [id][int32 GPUs of 0]
    if (pg.index == 0) {
      ncclUniqueId id{};
      NCCL_CHECK(ncclGetUniqueId(&id));
      const int32_t g32 = g;
      std::memcpy(&msg[0], &id, sizeof id);
      std::memcpy(&msg[sizeof id], &g32, sizeof g32);
    }
    pg.broadcast(msg);
    if (msg.size() != sizeof(ncclUniqueId) + sizeof(int32_t))
      throw Error("nccl backend: the process group's broadcast changed the message's length");
    ncclUniqueId id{};
    int32_t g0 = 0;
    std::memcpy(&id, msg.data(), sizeof id);
    std::memcpy(&g0, msg.data() + sizeof id, sizeof g0);
    if (g0 != g)
      throw UsageError("--backend nccl across processes: process " + std::to_string(pg.index) +
                       " has " + std::to_string(g) + " GPU(s), process 0 has " +
                       std::to_string(g0) + "; every process needs the same number");
    return std::make_unique<nccl::World>(id, pg.size * g, pg.index * g, devices_, pg.timeout_s);
  }
  // The World for W ranks. Across processes: the one of all processes' GPUs, whose count must
  // divide W (the same UsageError in every process, before any collective). In one process: the
  // first G' devices, G' the largest divisor of W <= #devices, created on first use (the one over
  // all devices is made up front), and made again after an error aborted it.
  nccl::World& world(int64_t W) {
    if (spanning_) {
      if (W % spanning_->size() != 0)
        throw UsageError("--backend nccl across processes: the plan's " + std::to_string(W) +
                         " ranks cannot be spread evenly over the " +
                         std::to_string(spanning_->size()) +
                         " GPUs of all processes (their number must divide world_size)");
      return *spanning_;
    }
    int g = static_cast<int>(std::min<int64_t>(W, static_cast<int64_t>(devices_.size())));
    while (g > 1 && W % g != 0) --g;
    g = std::max(g, 1);
    std::unique_ptr<nccl::World>& slot = worlds_[g];
    if (!slot || slot->aborted()) {
      slot.reset();  // an aborted one first: its streams go before the new ones come
      slot =
          std::make_unique<nccl::World>(std::vector<int>(devices_.begin(), devices_.begin() + g));
    }
    return *slot;
  }
  // The data of ranks [r0, r1) (this process's) on the host: this backend keeps nothing, so no
  // local_embs may name a kept tensor (it would be another backend's).
  static void host_inputs(const std::vector<TensorRef>& local_embs, int64_t r0, int64_t r1) {
    for (int64_t s = r0; s < r1; ++s)
      if (local_embs[s].kept || (local_embs[s].n > 0 && !local_embs[s].host))
        throw Error("output dist: local_embs of rank " + std::to_string(s) +
                    " has no data on the host (the nccl backend keeps no tensors)");
  }
  void download(const nccl::World& w, int g, const float* src, int64_t n, EmbTensor& out) {
    out.data.resize(static_cast<size_t>(n));
    if (n <= 0) return;
    w.set_device(g);
    CUDA_CHECK(cudaMemcpyAsync(out.data.data(), src, sizeof(float) * n, cudaMemcpyDeviceToHost,
                               w.stream(g)));
    CUDA_CHECK(cudaStreamSynchronize(w.stream(g)));
  }

  std::vector<int> devices_;
  NcclOptions opt_;
  std::vector<std::unique_ptr<Backend>> cuda_;
  std::map<int, std::unique_ptr<nccl::World>> worlds_;  // one process: by GPU count
  std::unique_ptr<nccl::World> spanning_;               // across processes
  std::string desc_;
};

void NcclBackend::sequence_output_dist(const Plan& plan, const std::vector<TensorRef>& local_embs,
                                       const std::vector<const ShardingContext*>& ctx,
                                       Place /*place*/, const OutputSink& sink) {
  // long: one collective's host side, kept in one piece: the local GPUs' buffers (declared before
  // the abort guard), their uploads and tables, the blocks of all W*W pairs, then the outputs.
  const int64_t W = plan.world_size, D = plan.seq_dim();
  // Checks of all W ranks (shapes and contexts, identical in every process), then the World
  // (its UsageError too): all before any collective.
  const std::vector<EmbTensor> shapes = shape_stand_ins(local_embs);
  const cuda::SeqDistTables t = cuda::build_seq_dist_tables(plan, tensor_pointers(shapes), ctx);
  nccl::World& w = world(W);
  const int G = w.size(), q0 = w.first(), q1 = w.first() + w.local_size();
  const int64_t k = W / G;
  // Receive rows of destination s (sum of its input_splits) and its base row in its GPU's
  // receive buffer; output rows of s are t.out_row_off (perm sizes). Buffers are indexed by
  // global GPU; only the local GPUs' are allocated.
  std::vector<int64_t> recv_rows(W), recv_base(W);
  for (int64_t s = 0; s < W; ++s) recv_rows[s] = t.recv_off[s * (W + 1) + W];
  std::vector<DeviceBuffer<float>> d_local(G), d_send(G), d_recv(G), d_out(G);
  std::vector<DeviceBuffer<int64_t>> d_lro(G), d_sb(G), d_so(G), d_ss(G), d_idx(G);
  AbortOnThrow guard(w);
  // A caller's error, local to this process (its peers are entering the collective): under the
  // guard, so that the abort ends their wait.
  host_inputs(local_embs, q0 * k, q1 * k);
  for (int g = q0; g < q1; ++g) {
    w.set_device(g);
    cudaStream_t st = w.stream(g);
    const int64_t r0 = g * k, r1 = r0 + k;
    const int64_t lo = t.local_row_off[r0], hi = t.local_row_off[r1];
    d_local[g].resize((hi - lo) * D);
    for (int64_t r = r0; r < r1; ++r)
      h2d(d_local[g].data() + (t.local_row_off[r] - lo) * D, local_embs[r].host, local_embs[r].n,
          st);
    // The recat tables of ranks r0..r1-1, rebased to this GPU's buffer (seg_* are rank-local).
    std::vector<int64_t> lro(t.local_row_off.begin() + r0, t.local_row_off.begin() + r1 + 1);
    for (int64_t& x : lro) x -= lo;
    std::vector<int64_t> sb(t.seg_base.begin() + r0, t.seg_base.begin() + r1 + 1);
    const int64_t s0 = sb.front(), s1 = sb.back();
    for (int64_t& x : sb) x -= s0;
    d_lro[g].upload(lro, st);
    d_sb[g].upload(sb, st);
    d_so[g].upload(t.seg_out.data() + s0, s1 - s0, st);
    d_ss[g].upload(t.seg_src.data() + s0, s1 - s0, st);
    cuda::SeqDistArgs a;
    a.world_size = k;
    a.dim = D;
    a.total_local_rows = hi - lo;
    a.local = d_local[g].data();
    a.local_row_off = d_lro[g].data();
    a.seg_base = d_sb[g].data();
    a.seg_out_off = d_so[g].data();
    a.seg_src = d_ss[g].data();
    d_send[g].resize((hi - lo) * D);
    cuda::launch_seq_recat(a, d_send[g].data(), st);
    // Codec (docs/semantics.md §8): every element rounded once, on the send buffer; fp32 on the
    // wire.
    cuda::launch_codec(d_send[g].data(), (hi - lo) * D, cuda::precision(plan.comm_precision), st);
    // Receive buffers of the k destinations back to back, and the unbucketize gather index
    // in this GPU's receive-buffer rows: idx[i] = recv_base[s] + perm_s[i].
    int64_t rb = 0;
    for (int64_t s = r0; s < r1; ++s) {
      recv_base[s] = rb;
      rb += recv_rows[s];
    }
    d_recv[g].resize(rb * D);
    const int64_t o0 = t.out_row_off[r0], o1 = t.out_row_off[r1];
    std::vector<int64_t> idx(t.perm.begin() + o0, t.perm.begin() + o1);
    for (int64_t s = r0; s < r1; ++s)
      for (int64_t i = t.out_row_off[s] - o0; i < t.out_row_off[s + 1] - o0; ++i)
        idx[i] += recv_base[s];
    d_idx[g].upload(idx, st);
    d_out[g].resize((o1 - o0) * D);
  }
  // The exchange: block r -> s is rows send_off_r[s].. of r's send buffer into rows
  // recv_off_s[r].. of s's receive buffer (validated equal in count by the tables). Every
  // process lists all W*W blocks in the same order; pointers exist on the local sides only.
  std::vector<nccl::Block> blocks;
  blocks.reserve(static_cast<size_t>(W * W));
  for (int64_t r = 0; r < W; ++r)
    for (int64_t s = 0; s < W; ++s) {
      nccl::Block b;
      b.src_gpu = static_cast<int>(r / k);
      b.dst_gpu = static_cast<int>(s / k);
      const int64_t* so = t.send_off.data() + r * (W + 1);
      const int64_t* ro = t.recv_off.data() + s * (W + 1);
      b.count = (so[s + 1] - so[s]) * D;
      if (w.is_local(b.src_gpu))
        b.send = d_send[b.src_gpu].data() +
                 (t.local_row_off[r] - t.local_row_off[b.src_gpu * k] + so[s]) * D;
      if (w.is_local(b.dst_gpu)) b.recv = d_recv[b.dst_gpu].data() + (recv_base[s] + ro[r]) * D;
      blocks.push_back(b);
    }
  nccl::alltoallv(w, blocks, opt_.intra_gpu_via_nccl);
  for (int g = q0; g < q1; ++g) {
    w.set_device(g);
    const int64_t o0 = t.out_row_off[g * k], o1 = t.out_row_off[(g + 1) * k];
    cuda::launch_gather_rows(d_recv[g].data(), d_idx[g].data(), o1 - o0, D, d_out[g].data(),
                             w.stream(g));
  }
  w.synchronize();
  guard.done();
  for (int64_t s = q0 * k; s < q1 * k; ++s) {
    const int g = static_cast<int>(s / k);
    const int64_t n = t.out_row_off[s + 1] - t.out_row_off[s];
    Tensor out;
    out.t.dtype = output_dist_dtype(plan);
    out.t.shape = {n, D};
    download(w, g, d_out[g].data() + (t.out_row_off[s] - t.out_row_off[g * k]) * D, n * D, out.t);
    sink(static_cast<int>(s), std::move(out));
  }
}

void NcclBackend::pooled_output_dist(const Plan& plan, bool variable_batch,
                                     const std::vector<TensorRef>& local_embs,
                                     const std::vector<const ShardingContext*>& ctx,
                                     Place /*place*/, const OutputSink& sink) {
  // long: one collective's host side, as sequence_output_dist's: local buffers, the abort guard,
  // then one of the two exchanges and the outputs of the local ranks.
  const int64_t W = plan.world_size;
  // Checks of all W ranks and the World, in every process alike, before any collective.
  const std::vector<EmbTensor> shapes = shape_stand_ins(local_embs);
  const PooledLayout L = pooled_layout(plan, variable_batch, tensor_pointers(shapes), ctx);
  nccl::World& w = world(W);
  const int G = w.size(), q0 = w.first(), q1 = w.first() + w.local_size();
  const int64_t k = W / G;
  const DType rd = pooled_reduce_dtype(plan);
  const bool codec = plan.comm_precision != DType::f32;
  const int64_t n = W ? shapes[0].numel() : 0;  // equal on every rank (checked)
  // fp16/bf16 data (no codec) is reduced in that dtype too, rounded after every add, as the
  // reduce-scatter of a bf16 tensor is: only an fp32 reduce may go to ncclReduceScatter.
  const bool rs = opt_.pooled_reduce_scatter && L.equal && rd == DType::f32;
  // out_base[r]: element offset of rank r's output in its GPU's output buffer.
  std::vector<int64_t> out_base(W), gpu_len(G, 0);
  for (int64_t r = 0; r < W; ++r) {
    out_base[r] = gpu_len[r / k];
    gpu_len[r / k] += L.chunk_len[r];
  }
  // Indexed by global GPU; only the local GPUs' are allocated.
  std::vector<DeviceBuffer<float>> d_in(G), d_part(G), d_out(G);
  AbortOnThrow guard(w);
  host_inputs(local_embs, q0 * k, q1 * k);  // under the guard, as in sequence_output_dist
  for (int g = q0; g < q1; ++g) {
    w.set_device(g);
    cudaStream_t st = w.stream(g);
    d_in[g].resize(k * n);
    for (int64_t j = 0; j < k; ++j) h2d(d_in[g].data() + j * n, local_embs[g * k + j].host, n, st);
    if (codec) cuda::launch_codec(d_in[g].data(), k * n, cuda::precision(rd), st);
    d_out[g].resize(gpu_len[g]);
  }
  if (rs) {
    // Sum the k local buffers of each GPU (rank order), then reduce-scatter the G partials.
    std::vector<const float*> send(G, nullptr);
    std::vector<float*> recv(G, nullptr);
    for (int g = q0; g < q1; ++g) {
      w.set_device(g);
      if (k > 1) {
        d_part[g].resize(n);
        cuda::launch_reduce(d_in[g].data(), k, n, n, cuda::Precision::f32, d_part[g].data(),
                            w.stream(g));
        send[g] = d_part[g].data();
      } else {
        send[g] = d_in[g].data();
      }
      recv[g] = d_out[g].data();
    }
    nccl::reduce_scatter(w, send, recv, n / G);
  } else {
    // All-to-all of chunk runs: GPU g gets [W][M_g], M_g = gpu_len[g], from every source d
    // (its chunks g*k..g*k+k-1 are contiguous in d's buffer), then sums in rank order.
    for (int g = q0; g < q1; ++g) {
      w.set_device(g);
      d_part[g].resize(W * gpu_len[g]);
    }
    std::vector<nccl::Block> blocks;
    for (int64_t d = 0; d < W; ++d)
      for (int g = 0; g < G; ++g) {
        nccl::Block b;
        b.src_gpu = static_cast<int>(d / k);
        b.dst_gpu = g;
        b.count = gpu_len[g];
        if (w.is_local(b.src_gpu))
          b.send = d_in[b.src_gpu].data() + (d % k) * n + L.chunk_off[d][g * k];
        if (w.is_local(g)) b.recv = d_part[g].data() + d * gpu_len[g];
        blocks.push_back(b);
      }
    nccl::alltoallv(w, blocks, opt_.intra_gpu_via_nccl);
    for (int g = q0; g < q1; ++g) {
      w.set_device(g);
      cuda::launch_reduce(d_part[g].data(), W, gpu_len[g], gpu_len[g], cuda::precision(rd),
                          d_out[g].data(), w.stream(g));
    }
  }
  w.synchronize();
  guard.done();
  for (int64_t r = q0 * k; r < q1 * k; ++r) {
    const int64_t len = L.chunk_len[r];
    Tensor out;
    out.t.dtype = output_dist_dtype(plan);
    out.t.shape = variable_batch ? std::vector<int64_t>{len}
                                 : std::vector<int64_t>{len / std::max<int64_t>(1, plan.sum_dim),
                                                        plan.sum_dim};
    download(w, static_cast<int>(r / k), d_out[r / k].data() + out_base[r], len, out.t);
    sink(static_cast<int>(r), std::move(out));
  }
}

}  // namespace

int nccl_visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

namespace {

// `devices` checked against the visible GPUs; empty = all of them.
std::vector<int> checked_devices(const std::vector<int>& devices) {
  const int visible = nccl_visible_devices();
  if (visible == 0) throw DeviceError("--backend nccl: no CUDA device or driver on this machine");
  std::vector<int> devs = devices;
  if (devs.empty())
    for (int d = 0; d < visible; ++d) devs.push_back(d);
  for (size_t i = 0; i < devs.size(); ++i) {
    if (devs[i] < 0 || devs[i] >= visible)
      throw DeviceError("--devices: CUDA device " + std::to_string(devs[i]) + " does not exist (" +
                        std::to_string(visible) + " visible)");
    for (size_t j = 0; j < i; ++j)
      if (devs[j] == devs[i])
        throw UsageError("--devices: device " + std::to_string(devs[i]) +
                         " listed twice (NCCL puts one rank per GPU; ranks share a GPU by "
                         "W/G, not by repeating it)");
  }
  return devs;
}

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(const std::vector<int>& devices,
                                           const NcclOptions& opt) {
  return std::make_unique<NcclBackend>(checked_devices(devices), opt, nullptr);
}

std::unique_ptr<Backend> make_nccl_backend(const std::vector<int>& devices, const NcclOptions& opt,
                                           const NcclProcessGroup& pg) {
  if (pg.size < 1 || pg.index < 0 || pg.index >= pg.size)
    throw UsageError("nccl backend: process " + std::to_string(pg.index) + " of " +
                     std::to_string(pg.size) + " is not a place in a process group");
  if (!pg.broadcast) throw UsageError("nccl backend: the process group has no broadcast");
  return std::make_unique<NcclBackend>(checked_devices(devices), opt, &pg);
}

}  // namespace dynemb
