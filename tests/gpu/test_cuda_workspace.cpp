// The CUDA backend's workspace (backends/cuda/workspace.hpp) and pinned staging
// (backends/cuda/staging.hpp): a warm backend allocates nothing, and reusing buffers changes
// no result. Each preset batch runs bucketize, lookup and its output dist twice through the
// Backend interface; the second round must make no device or pinned allocation, and both
// rounds must equal the CPU reference bit for bit. The staging ring is also checked on its
// own with transfers larger than a half (chunked, wrapping). Exits 77 when no GPU is present.
#include <doctest/doctest.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/staging.hpp"
#include "cuda_check.hpp"
#include "device_buffer.hpp"
#include "engine/embedding_source.hpp"
#include "engine/input_dist.hpp"
#include "gpu_test_support.hpp"
#include "synth/synth.hpp"

using namespace dynemb;
using test::cpu;
using test::same_bits;

namespace {

void require_gpu() {
  test::skip_unless(cuda_device_available());
}

// The allocations made so far, of both kinds.
struct Allocs {
  int64_t device, device_bytes, pinned, pinned_bytes;
};
Allocs allocs() {
  const cuda::AllocCounters& d = cuda::device_alloc_counters();
  const cuda::AllocCounters& p = cuda::pinned_alloc_counters();
  return {d.allocations.load(), d.bytes_held.load(), p.allocations.load(), p.bytes_held.load()};
}
void print_allocs(const char* when, const Allocs& a) {
  std::printf("%s: %" PRId64 " device allocations (%" PRId64 " bytes held), %" PRId64
              " pinned allocations (%" PRId64 " bytes held)\n",
              when, a.device, a.device_bytes, a.pinned, a.pinned_bytes);
  std::fflush(stdout);
}

struct PresetBatch {
  std::string name;
  Plan plan;
  std::vector<Kjt> kjts;
  // Dense weights for the plan's continuous tables (the oracle for the others): one source for
  // both rounds, so its tables are uploaded in the first only.
  std::shared_ptr<const EmbeddingSource> dense;
};
PresetBatch preset_batch(const std::string& preset, bool vbe_weighted) {
  PresetBatch b;
  b.name = preset + (vbe_weighted ? " (vbe, weighted)" : "");
  b.plan = preset_plan(preset);
  SynthOptions opt = preset_workload(preset);
  opt.seed = 26;
  opt.vbe = opt.weighted = vbe_weighted;
  check_synth_options(b.plan, opt);
  b.kjts = synth_kjts(b.plan, opt, 0);
  std::vector<std::optional<std::vector<float>>> w(b.plan.tables.size());
  std::mt19937_64 rng(26);
  for (size_t t = 0; t < w.size(); ++t) {
    const TableConfig& tc = b.plan.tables[t];
    if (tc.dist_type != DistType::continuous) continue;
    w[t].emplace(static_cast<size_t>(tc.num_embeddings * tc.embedding_dim));
    for (float& x : *w[t]) x = static_cast<float>(static_cast<int>(rng() % 256) - 128) / 64.0f;
  }
  b.dense = std::make_shared<DenseSource>(b.plan, std::move(w),
                                          std::make_shared<OracleSource>(0x27, b.plan));
  return b;
}

// Bucketize, lookup and the output dist of one batch on `gpu`, then the dist of lookups made
// from dense weights and kept on the device for it, each compared with the CPU reference bit for
// bit; returns the number of mismatching stages (0 when all agree).
int run_and_compare(Backend& gpu, const PresetBatch& b) {
  INFO(b.name);
  const Plan& plan = b.plan;
  const int64_t W = plan.world_size;
  std::vector<const Kjt*> kp;
  for (const Kjt& k : b.kjts) kp.push_back(&k);
  int bad = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++bad;
      std::printf("MISMATCH %s: %s\n", b.name.c_str(), what.c_str());
    }
    CHECK_MESSAGE(ok, what);
  };
  for (int64_t r = 0; r < W; ++r) {
    const BucketizedKjt want = cpu().bucketize(plan, *kp[r]);
    const BucketizedKjt got = gpu.bucketize(plan, *kp[r]);
    const std::string at = "bucketize rank " + std::to_string(r);
    expect(got.new_lengths == want.new_lengths, at + " new_lengths");
    expect(got.new_values == want.new_values, at + " new_values");
    expect(same_bits(got.new_weights, want.new_weights), at + " new_weights");
    // Sent back only where the host reads it next: a sequence context's permute, no dest_rank.
    const bool seq = plan.module == ModuleKind::sequence;
    expect(got.unbucketize_permute == (seq ? want.unbucketize_permute : std::vector<int64_t>{}),
           at + " unbucketize_permute");
    expect(got.dest_rank.empty(), at + " dest_rank");
  }
  const DerivedBatch derived = derive_input_dist(plan, kp);
  const OracleSource source(0x26, plan);
  const std::vector<EmbTensor> local = derive_local_embs(plan, derived, source, cpu(), 0);
  for (int64_t r = 0; r < W; ++r) {
    const Tensor g =
        gpu.lookup(plan, static_cast<int>(r), derived.ranks[r].lookup_kjt, source, Place::host);
    const std::string at = "lookup rank " + std::to_string(r);
    expect(g.t.shape == local[r].shape, at + " shape");
    expect(same_bits(g.t.data, local[r].data), at + " data");
  }
  const std::vector<EmbTensor> want = test::run_output_dist(cpu(), plan, derived, local);
  const std::vector<EmbTensor> got = test::run_output_dist(gpu, plan, derived, local);
  for (int64_t r = 0; r < W; ++r) {
    const std::string at = "output dist rank " + std::to_string(r);
    expect(got[r].shape == want[r].shape && got[r].dtype == want[r].dtype, at + " shape/dtype");
    expect(same_bits(got[r].data, want[r].data), at + " data");
  }
  // The captured lookups kept on the device (keep()), compared there with the lookups made and
  // kept there, then the dist's inputs, its outputs kept and compared there too: every kept slot.
  std::vector<Tensor> inputs(static_cast<size_t>(W));
  for (int64_t r = 0; r < W; ++r) {
    const std::string at = "kept input rank " + std::to_string(r);
    inputs[r].t = EmbTensor{local[r].dtype, local[r].shape, {}};
    inputs[r].kept = gpu.keep(local[r], int(r));
    expect(inputs[r].kept.has_value(), at + " kept");
    const Tensor made = gpu.lookup(plan, int(r), derived.ranks[r].lookup_kjt, source, Place::kept);
    const auto d = gpu.comparator().compare(inputs[r], made, TileCompare{});
    expect(d && d->empty(), at + " against the kept lookup");
  }
  const std::vector<Tensor> kept_out =
      test::run_output_dist(gpu, plan, derived, test::refs_of(inputs), Place::kept);
  for (int64_t r = 0; r < W; ++r) {
    const auto d = gpu.comparator().compare(kept_out[r], want[r], TileCompare{});
    expect(d && d->empty(), "kept output rank " + std::to_string(r));
  }
  // The lookups made for the dist only (Place::kept), from the dense weights on the device,
  // kept there for the dist.
  const std::vector<EmbTensor> dense_local = derive_local_embs(plan, derived, *b.dense, cpu(), 0);
  std::vector<Tensor> kept;
  for (int64_t r = 0; r < W; ++r)
    kept.push_back(gpu.lookup(plan, int(r), derived.ranks[r].lookup_kjt, *b.dense, Place::kept));
  const std::vector<EmbTensor> want_dense =
      test::run_output_dist(cpu(), plan, derived, dense_local);
  const std::vector<Tensor> got_dense =
      test::run_output_dist(gpu, plan, derived, test::refs_of(kept), Place::host);
  for (int64_t r = 0; r < W; ++r) {
    const std::string at = "dense lookups kept for the dist, rank " + std::to_string(r);
    expect(kept[r].kept.has_value() && kept[r].t.data.empty() &&
               kept[r].t.shape == dense_local[r].shape,
           at + " kept");
    expect(same_bits(got_dense[r].t.data, want_dense[r].data), at + " output");
  }
  return bad;
}

}  // namespace

TEST_CASE("a warm CUDA backend makes no allocation and matches the CPU reference") {
  require_gpu();
  // A sequence dist, a pooled one, a pooled VBE one with weights: every role of the
  // workspace, and batches of different sizes sharing its slots.
  const std::vector<PresetBatch> batches{preset_batch("unit-seq-w8", false),
                                         preset_batch("unit-pooled-w8", false),
                                         preset_batch("unit-pooled-w8", true)};
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
  const Allocs start = allocs();
  print_allocs("before round 1", start);
  for (const PresetBatch& b : batches) CHECK(run_and_compare(*gpu, b) == 0);
  const Allocs warm = allocs();
  print_allocs("after round 1 ", warm);
  for (const PresetBatch& b : batches) CHECK(run_and_compare(*gpu, b) == 0);
  const Allocs end = allocs();
  print_allocs("after round 2 ", end);
  std::printf("round 1 made %" PRId64 " device and %" PRId64
              " pinned allocations; round 2 made %" PRId64 " device and %" PRId64
              " pinned allocations (want 0 and 0)\n",
              warm.device - start.device, warm.pinned - start.pinned, end.device - warm.device,
              end.pinned - warm.pinned);
  std::fflush(stdout);
  CHECK(warm.device > start.device);  // round 1 did allocate (the counter counts)
  CHECK(end.device - warm.device == 0);
  CHECK(end.device_bytes == warm.device_bytes);
  CHECK(end.pinned - warm.pinned == 0);
  CHECK(end.pinned_bytes == warm.pinned_bytes);
  gpu.reset();
  const Allocs gone = allocs();
  print_allocs("backend destroyed", gone);
  CHECK(gone.device_bytes == start.device_bytes);  // the workspace freed what it held
  CHECK(gone.pinned_bytes == start.pinned_bytes);
}

// Many uploads through a ring of two 1 MiB halves (odd sizes, some several halves long, so the
// ring wraps and chunks), then downloads the same way: every byte must come back. A host
// write into a half whose earlier copy is still pending would corrupt a buffer here.
TEST_CASE("pinned staging: chunked and wrapping transfers round-trip exactly") {
  require_gpu();
  CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    cuda::PinnedStaging st(size_t{1} << 20);
    std::mt19937_64 rng(26);
    const std::vector<int64_t> sizes{1,       255,       256,       257, 262'144,   262'145,
                                     700'001, 1'048'576, 3'000'003, 17,  5'000'000, 4};
    std::vector<std::vector<uint32_t>> host(sizes.size());
    std::vector<cuda::DeviceBuffer<uint32_t>> dev(sizes.size());
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        host[i].resize(static_cast<size_t>(sizes[i]));
        for (uint32_t& x : host[i]) x = static_cast<uint32_t>(rng());
        st.upload(dev[i], host[i], s);
      }
      std::vector<std::vector<uint32_t>> back(sizes.size());
      std::vector<cuda::PinnedStaging::ToHost> parts;
      for (size_t i = 0; i < sizes.size(); ++i) {
        back[i].resize(host[i].size());
        parts.push_back({back[i].data(), dev[i].data(), 4 * back[i].size()});
      }
      st.download(parts, s);
      int bad = 0;
      for (size_t i = 0; i < sizes.size(); ++i)
        if (back[i] != host[i]) {
          ++bad;
          std::printf("MISMATCH staging round %d: transfer %zu (%" PRId64 " words)\n", round, i,
                      sizes[i]);
        }
      std::printf("staging round %d: %zu transfers through halves of %zu bytes, %d wrong\n", round,
                  sizes.size(), st.half_bytes(), bad);
      CHECK(bad == 0);
      CHECK(st.half_bytes() == (size_t{1} << 20));  // capped: large transfers were chunked
      // One more download of a single large buffer, alone.
      CHECK(st.download(dev[10], s) == host[10]);
    }
  }
  CUDA_CHECK(cudaStreamDestroy(s));
}

// Lent host memory (HostLending): an upload from inside it is one copy by the device from its
// whole pages, the bytes around them staged; once unlent, the host may rewrite it and the next
// upload is staged again; a lend overlapping an earlier registration (memory freed and reused)
// replaces it. Every byte must come back whichever way it went.
TEST_CASE("pinned staging: uploads from lent host memory") {
  require_gpu();
  CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    cuda::PinnedStaging st(size_t{1} << 20);
    std::mt19937_64 rng(27);
    std::vector<uint32_t> host(size_t{3} << 20);  // 12 MiB, wherever the heap put it
    for (uint32_t& x : host) x = static_cast<uint32_t>(rng());
    cuda::DeviceBuffer<uint32_t> dev;
    dev.resize(int64_t(host.size()));
    // [first, first + n) of host uploaded to dev and read back
    const auto round_trip = [&](size_t first, size_t n) {
      CUDA_CHECK(cudaMemsetAsync(dev.data(), 0, 4 * host.size(), s));
      st.upload(dev.data(), host.data() + first, 4 * n, s);
      std::vector<uint32_t> back(n);
      st.download({{back.data(), dev.data(), 4 * n}}, s);
      return std::equal(back.begin(), back.end(), host.begin() + long(first));
    };
    CHECK_FALSE(st.lend(host.data(), size_t{512} << 10));  // under 1 MiB: not worth pinning
    REQUIRE(st.lend(host.data(), 4 * host.size()));
    const size_t pinned = st.lent_bytes();
    CHECK(pinned > 4 * host.size() - 8192);  // its whole pages
    CHECK(pinned <= 4 * host.size());
    uint64_t direct = 0;
    // whole; a head and a tail outside its pages; inside; a few bytes at the start only: all
    // but the bytes outside its pages go direct
    for (auto [first, n] : std::vector<std::pair<size_t, size_t>>{
             {0, host.size()}, {1, host.size() - 2}, {1000, 700'001}, {0, 3}}) {
      CHECK(round_trip(first, n));
      const uint64_t went = st.direct_bytes() - direct;
      std::printf("lent upload [%zu, +%zu): %" PRIu64 " bytes direct\n", first, n, went);
      CHECK(went + (n > 3 ? 8192 : 12) >= 4 * n);
      CHECK(went <= 4 * n);
      direct = st.direct_bytes();
    }
    // Unlent: written again, staged again, the new bytes arrive.
    CUDA_CHECK(cudaStreamSynchronize(s));
    st.unlend(host.data());
    for (size_t i = 0; i < host.size(); i += 4099) host[i] ^= 0x5a5a5a5au;
    CHECK(round_trip(0, host.size()));
    CHECK(st.direct_bytes() == direct);
    // Lent again: the same registration, direct again.
    REQUIRE(st.lend(host.data(), 4 * host.size()));
    CHECK(st.lent_bytes() == pinned);
    CHECK(round_trip(5, host.size() - 5));
    CHECK(st.direct_bytes() > direct);
    // A lend overlapping it (the tail of the buffer, as memory reused would be) replaces it.
    CUDA_CHECK(cudaStreamSynchronize(s));
    st.unlend(host.data());
    REQUIRE(st.lend(host.data() + (size_t{1} << 20), 4 * (host.size() - (size_t{1} << 20))));
    CHECK(st.lent_bytes() < pinned);
    direct = st.direct_bytes();
    CHECK(round_trip(size_t{1} << 20, host.size() - (size_t{1} << 20)));
    CHECK(st.direct_bytes() > direct);
    CUDA_CHECK(cudaStreamSynchronize(s));
    st.forget(host.data() + (size_t{1} << 20));
    CHECK(st.lent_bytes() == 0);
    CHECK(round_trip(0, host.size()));  // staged
  }
  CUDA_CHECK(cudaStreamDestroy(s));
}
