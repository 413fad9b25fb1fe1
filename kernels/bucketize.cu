// The bucketize dispatch: picks the one-pass kernel or the three passes for each launch and
// is the only public launch of the stage (kernels/bucketize.hpp). The kernels it launches are
// in kernels/bucketize/ (bucketize.hpp lists them and what each path is for).
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <initializer_list>

#include "bucketize.hpp"
#include "bucketize/config.cuh"
#include "bucketize/one_pass.cuh"
#include "bucketize/partition.cuh"
#include "bucketize/partition_resident.cuh"
#include "bucketize/three_pass.cuh"
#include "cuda_check.hpp"

namespace dynemb::cuda {
namespace {

using namespace bucketize;

// The instance for a ballot count (4 or 8 bits, peers()), whether a bag may exceed kChunk,
// and whether it records the step trace.
template <bool Trace>
const void* one_pass_instance(int bits, bool long_bags) {
  if (bits == 4)
    return long_bags ? reinterpret_cast<const void*>(one_pass_kernel<4, true, Trace>)
                     : reinterpret_cast<const void*>(one_pass_kernel<4, false, Trace>);
  return long_bags ? reinterpret_cast<const void*>(one_pass_kernel<8, true, Trace>)
                   : reinterpret_cast<const void*>(one_pass_kernel<8, false, Trace>);
}

// The partition's one launch for a ballot count (4 or 8 bits) and whether every tile holds at
// most one chunk (the counts-first instance, 4 bits only), and whether it records the trace.
template <bool Trace>
const void* resident_instance(int bits, bool one_chunk) {
  if (bits == 4)
    return one_chunk ? reinterpret_cast<const void*>(partition_resident_kernel<4, Trace, true>)
                     : reinterpret_cast<const void*>(partition_resident_kernel<4, Trace>);
  return reinterpret_cast<const void*>(partition_resident_kernel<8, Trace>);
}

// Blocks of these kernels (kThreads threads, static shared memory only) that the current device
// keeps resident at once: SMs x the fewest blocks per SM any of them keeps (every instance a
// launch may take must fit); 0 without cooperative launch. Cached per device in `cache`.
struct DeviceCache {
  int dev = -1;
  int64_t value = 0;
};
int64_t resident_blocks(DeviceCache& cache, std::initializer_list<const void*> kernels) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (cache.dev == dev) return cache.value;
  int coop = 0, sms = 0, per_sm = 1 << 30;
  CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  for (const void* k : kernels) {
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kThreads, 0));
    per_sm = std::min(per_sm, n);
  }
  cache.value = coop ? static_cast<int64_t>(sms) * per_sm : 0;
  cache.dev = dev;
  return cache.value;
}

// Resident blocks of one_pass_kernel, at most kMaxOnePassBags. Every untraced instance: the
// capacity must hold for whichever a batch takes. (A traced launch that does not fit falls
// back to the three passes and records nothing.)
int64_t one_pass_capacity() {
  static DeviceCache cache;
  return std::min<int64_t>(
      resident_blocks(cache,
                      {one_pass_instance<false>(4, false), one_pass_instance<false>(4, true),
                       one_pass_instance<false>(8, false), one_pass_instance<false>(8, true)}),
      kMaxOnePassBags);
}

// Resident blocks of partition_resident_kernel: the partition takes one launch when its grid
// (R x tiles_per_rank) is no larger.
int64_t resident_capacity() {
  static DeviceCache cache;
  return resident_blocks(cache,
                         {resident_instance<false>(4, false), resident_instance<false>(4, true),
                          resident_instance<false>(8, false)});
}

bool one_pass_eligible(const BucketizeArgs& a, const BucketizeOnePass& ws) {
  if (!ws.scratch || a.total_bags == 0 || a.world_size > kMaxSharedW || a.num_ranks > kMaxSharedW ||
      a.total_ids >= (int64_t{1} << 31) || ws.max_rank_bags * a.world_size > kMaxRankEntries ||
      ws.scratch_bytes < static_cast<size_t>(8 * a.world_size * a.total_bags))
    return false;
  // A block per bag, all resident.
  return a.total_bags <= one_pass_capacity();
}

bool block_per_bag(const BucketizeArgs& a) {
  using P = BucketizeArgs::BagPath;
  return a.world_size <= kMaxSharedW &&
         (a.bag_path == P::block ||
          (a.bag_path == P::automatic && a.total_ids >= kBlockPerBagMinAvg * a.total_bags));
}

// The partition path's launch geometry for these arguments; tiles == 0: not possible.
struct PartitionPlan {
  int tile_bags = 0;                                   // bags of the largest tile
  int64_t tiles_per_rank = 0, tiles = 0, entries = 0;  // entries: R x W x tiles_per_rank
};

PartitionPlan partition_plan(const BucketizeArgs& a) {
  PartitionPlan pp;
  const int64_t W = a.world_size, T = a.tiles_per_rank, nb = a.tile_max_bags;
  // W <= 256 (the 8-bit bucket of the ranking keys); a tiling from plan_partition_tiles within
  // the kernels' shared arrays; a bag < 2^31 ids (int32 per-bag counts), and tile-relative id
  // indices int32: a tile's ids plus one chunk stay below 2^31.
  if (a.total_bags == 0 || W > kMaxSharedW || !a.tile_j0 || !a.tile_id0 || !a.tile_feat || T <= 0 ||
      nb < 1 || nb > kPartMaxTileBags || W * nb > kPartMaxCells || a.num_ranks <= 0 ||
      !a.new_offsets || a.max_bag_len >= (int64_t{1} << 31) ||
      nb > ((int64_t{1} << 31) - 1 - kChunk) / std::max<int64_t>(1, a.max_bag_len))
    return pp;
  const int64_t tiles = a.num_ranks * T, entries = tiles * W;
  // tile_cnt and tile_base live in new_offsets (W x total_bags entries), the grid is one
  // dimension of blocks, and the scan's scratch is the three passes' own.
  if (2 * entries > W * a.total_bags || tiles > int64_t{0x7fffffff} ||
      bucketize_scan_temp_bytes(entries) > a.scan_temp_bytes)
    return pp;
  pp.tile_bags = static_cast<int>(nb);
  pp.tiles_per_rank = T;
  pp.tiles = tiles;
  pp.entries = entries;
  return pp;
}

// Batches the partition takes: beyond the one-pass kernel (the dispatch asks that first), when
// forced, or short bags with BagPath::automatic (long bags keep a block per bag, whose chunks
// are full).
bool partition_wanted(const BucketizeArgs& a) {
  using P = BucketizeArgs::BagPath;
  return a.bag_path == P::partition || (a.bag_path == P::automatic && !block_per_bag(a));
}

// Whether a partition plan takes one cooperative launch: a workspace (its scratch words and
// epoch), not turned off, and every tile resident with its W words in the scratch.
bool resident_eligible(const BucketizeArgs& a, const BucketizeOnePass& ws,
                       const PartitionPlan& pp) {
  return pp.tiles > 0 && a.partition_one_launch && ws.scratch && pp.tiles <= resident_capacity() &&
         ws.scratch_bytes >= static_cast<size_t>(8 * pp.entries);
}

// The workspace's next epoch (its words carry the last one): after 2^32 launches on this
// scratch, start over from zeroed words.
unsigned next_epoch(BucketizeOnePass& ws, cudaStream_t s) {
  if (++ws.epoch == 0) {
    bucketize_one_pass_scratch_init(ws.scratch, ws.scratch_bytes, s);
    ws.epoch = 1;
  }
  return ws.epoch;
}

// offsets[0] = 0, offsets[i+1] = lengths[0] + ... + lengths[i].
void offsets_from_lengths(const int64_t* lengths, int64_t n, int64_t* offsets, void* temp,
                          size_t temp_bytes, cudaStream_t s) {
  CUDA_CHECK(cudaMemsetAsync(offsets, 0, sizeof(int64_t), s));
  if (n == 0) return;
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, temp_bytes, lengths, offsets + 1, n, s));
}

// The three passes over a.bag_offsets: per-(bag, bucket) counts, one cub exclusive scan over
// all new_lengths, placement.
void launch_three_passes(const BucketizeArgs& a, cudaStream_t s) {
  const int64_t nl = a.world_size * a.total_bags;
  if (a.total_bags == 0) return;
  const FastDivU64 wd = FastDivU64::make(static_cast<uint64_t>(a.world_size));
  const bool shared_path = a.world_size <= kMaxSharedW;
  const bool long_bags = block_per_bag(a);
  if (!shared_path) {
    const unsigned blocks = static_cast<unsigned>((a.total_bags + 127) / 128);
    count_thread_kernel<<<blocks, 128, 0, s>>>(a, wd);
  } else if (long_bags) {
    count_block_kernel<<<static_cast<unsigned>(a.total_bags), kThreads, 0, s>>>(a, wd);
  } else {
    count_warp_kernel<<<static_cast<unsigned>((a.total_bags + kBagsPerBlock - 1) / kBagsPerBlock),
                        kThreads, 0, s>>>(a, wd);
  }
  CUDA_CHECK_LAUNCH();
  size_t tb = a.scan_temp_bytes;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(a.scan_temp, tb, a.new_lengths, a.new_offsets, nl, s));
  if (a.total_ids == 0) return;
  if (!shared_path) {
    const unsigned blocks = static_cast<unsigned>((a.total_bags + 127) / 128);
    place_thread_kernel<<<blocks, 128, 0, s>>>(a, wd);
  } else if (long_bags) {
    if (a.world_size <= kSmallW)
      place_block_kernel<4><<<static_cast<unsigned>(a.total_bags), kThreads, 0, s>>>(a, wd);
    else
      place_block_kernel<8><<<static_cast<unsigned>(a.total_bags), kThreads, 0, s>>>(a, wd);
  } else {
    place_warp_kernel<<<static_cast<unsigned>((a.total_bags + kBagsPerBlock - 1) / kBagsPerBlock),
                        kThreads, 0, s>>>(a, wd);
  }
  CUDA_CHECK_LAUNCH();
}

// The partition path (partition.cuh) from the bag lengths: the count kernel (bag offsets from
// the host's first id of each tile, tile counts, new_lengths); a cub exclusive scan over the
// tile counts only when a rank has more than kPartDirectBaseEntries of them (else the place
// kernel sums them); the stable placement. Two launches for most batches.
void launch_partition(const BucketizeArgs& a, const int64_t* lengths, const PartitionPlan& pp,
                      cudaStream_t s) {
  PartitionArgs p;
  p.a = a;
  p.lengths = lengths;
  p.wd = FastDivU64::make(static_cast<uint64_t>(a.world_size));
  p.tile_j0 = a.tile_j0;
  p.tile_id0 = a.tile_id0;
  p.tile_feat = a.tile_feat;
  p.tiles_per_rank = pp.tiles_per_rank;
  p.tile_cnt = a.new_offsets;
  p.tile_base = a.new_offsets + pp.entries;
  const unsigned grid = static_cast<unsigned>(pp.tiles);
  partition_count_kernel<<<grid, kThreads, 0, s>>>(p);
  CUDA_CHECK_LAUNCH();
  if (a.world_size * pp.tiles_per_rank <= kPartDirectBaseEntries) {
    p.tile_base = nullptr;  // the place kernel sums its rank's counts: no scan launches
  } else {
    size_t tb = a.scan_temp_bytes;
    CUDA_CHECK(
        cub::DeviceScan::ExclusiveSum(a.scan_temp, tb, p.tile_cnt, p.tile_base, pp.entries, s));
  }
  if (a.total_ids == 0) return;
  if (a.world_size <= kSmallW)
    partition_place_kernel<4><<<grid, kThreads, 0, s>>>(p);
  else
    partition_place_kernel<8><<<grid, kThreads, 0, s>>>(p);
  CUDA_CHECK_LAUNCH();
}

// The partition in one cooperative launch (partition_resident.cuh). False when the driver
// refuses it for lack of room (SMs shared under MPS or a green context): the caller takes the
// two kernels, which need no co-residency.
bool launch_partition_resident(const BucketizeArgs& a, const int64_t* lengths,
                               const PartitionPlan& pp, BucketizeOnePass& ws,
                               unsigned long long* trace, cudaStream_t s) {
  ResidentPartitionArgs r;
  r.p.a = a;
  r.p.lengths = lengths;
  r.p.wd = FastDivU64::make(static_cast<uint64_t>(a.world_size));
  r.p.tile_j0 = a.tile_j0;
  r.p.tile_id0 = a.tile_id0;
  r.p.tile_feat = a.tile_feat;
  r.p.tiles_per_rank = pp.tiles_per_rank;
  r.p.tile_cnt = nullptr;
  r.p.tile_base = nullptr;
  r.words = static_cast<unsigned long long*>(ws.scratch);
  r.epoch = next_epoch(ws, s);
  r.trace = trace;
  void* params[] = {&r};
  // W <= 16 with every tile of at most one chunk: the counts-first instance.
  const int bits = a.world_size <= kSmallW ? 4 : 8;
  const bool one_chunk = a.tile_max_ids <= kChunk;
  const void* kernel =
      trace ? resident_instance<true>(bits, one_chunk) : resident_instance<false>(bits, one_chunk);
  const cudaError_t err = cudaLaunchCooperativeKernel(kernel, dim3(static_cast<unsigned>(pp.tiles)),
                                                      dim3(kThreads), params, 0, s);
  if (err == cudaErrorCooperativeLaunchTooLarge) {
    (void)cudaGetLastError();
    return false;
  }
  if (err != cudaSuccess)
    throw_cuda(err, "cudaLaunchCooperativeKernel(partition_resident_kernel)", __FILE__, __LINE__);
  return true;
}

// The dispatch. trace: null, or the step stamps of the one-pass kernel or the partition's one
// launch, whichever runs (bucketize.hpp).
void dispatch(const BucketizeArgs& a, const int64_t* lengths, BucketizeOnePass& ws,
              unsigned long long* trace, cudaStream_t s) {
  // Every path but the one-pass kernel: the partition (its count kernel writes the bag
  // offsets), or bag offsets by a cub scan and the three passes.
  const auto other_paths = [&] {
    const PartitionPlan pp = partition_wanted(a) ? partition_plan(a) : PartitionPlan{};
    if (pp.tiles > 0) {
      // Both write the bag offsets themselves.
      if (!resident_eligible(a, ws, pp) || !launch_partition_resident(a, lengths, pp, ws, trace, s))
        launch_partition(a, lengths, pp, s);
    } else {
      offsets_from_lengths(lengths, a.total_bags, a.bag_offsets, a.scan_temp, a.scan_temp_bytes, s);
      launch_three_passes(a, s);
    }
  };
  if (!one_pass_eligible(a, ws)) return other_paths();
  OnePassArgs p;
  p.a = a;
  p.lengths = lengths;
  p.words = static_cast<unsigned long long*>(ws.scratch);
  p.epoch = next_epoch(ws, s);
  p.wd = FastDivU64::make(static_cast<uint64_t>(a.world_size));
  p.trace = trace;
  void* params[] = {&p};
  const int bits = a.world_size <= kSmallW ? 4 : 8;
  const bool long_bags = a.max_bag_len > kChunk;
  const void* kernel =
      trace ? one_pass_instance<true>(bits, long_bags) : one_pass_instance<false>(bits, long_bags);
  const cudaError_t err = cudaLaunchCooperativeKernel(
      kernel, dim3(static_cast<unsigned>(a.total_bags)), dim3(kThreads), params, 0, s);
  if (err == cudaErrorCooperativeLaunchTooLarge) {
    // Fewer blocks fit than the occupancy query promised (SMs shared under MPS or a green
    // context): the other paths need no co-residency.
    (void)cudaGetLastError();
    return other_paths();
  }
  if (err != cudaSuccess)
    throw_cuda(err, "cudaLaunchCooperativeKernel(one_pass_kernel)", __FILE__, __LINE__);
}

}  // namespace

size_t bucketize_scan_temp_bytes(int64_t n) {
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const int64_t*>(nullptr),
                                           static_cast<int64_t*>(nullptr), n > 0 ? n : 1));
  return bytes;
}

size_t bucketize_one_pass_scratch_bytes() {
  // One word per (bucket, bag) of the largest eligible batch: W <= 256, bags <= capacity.
  return static_cast<size_t>(8 * kMaxSharedW * one_pass_capacity());
}

void bucketize_one_pass_scratch_init(void* scratch, size_t bytes, cudaStream_t s) {
  if (scratch && bytes) CUDA_CHECK(cudaMemsetAsync(scratch, 0, bytes, s));
}

int64_t bucketize_one_pass_capacity() {
  return one_pass_capacity();
}

int64_t bucketize_partition_resident_capacity() {
  return resident_capacity();
}

BucketizeChoice bucketize_choice(const BucketizeArgs& a, const BucketizeOnePass& ws) {
  BucketizeChoice c;
  if (one_pass_eligible(a, ws)) {
    c.path = BucketizePath::one_pass;
    c.grid = a.total_bags;
    c.capacity = one_pass_capacity();
    c.ids_cached = a.max_bag_len <= kChunk;
  } else if (partition_wanted(a) && partition_plan(a).tiles > 0) {
    const PartitionPlan pp = partition_plan(a);
    c.path =
        resident_eligible(a, ws, pp) ? BucketizePath::partition_resident : BucketizePath::partition;
    c.grid = pp.tiles;
    c.tile_bags = pp.tile_bags;
    if (c.path == BucketizePath::partition_resident) c.capacity = resident_capacity();
  } else if (a.world_size > kMaxSharedW) {
    c.path = BucketizePath::thread_per_bag;
  } else {
    c.path = block_per_bag(a) ? BucketizePath::block_per_bag : BucketizePath::warp_per_bag;
  }
  return c;
}

const char* to_string(BucketizePath p) {
  switch (p) {
    case BucketizePath::one_pass:
      return "one pass";
    case BucketizePath::block_per_bag:
      return "3 passes, block per bag";
    case BucketizePath::warp_per_bag:
      return "3 passes, warp per bag";
    case BucketizePath::thread_per_bag:
      return "3 passes, thread per bag";
    case BucketizePath::partition:
      return "partition by rank, tiles of bags";
    case BucketizePath::partition_resident:
      return "partition by rank, tiles of bags, one launch";
  }
  return "?";
}

void launch_bucketize(const BucketizeArgs& a, const int64_t* lengths, BucketizeOnePass& ws,
                      cudaStream_t s) {
  dispatch(a, lengths, ws, nullptr, s);
}

void launch_bucketize_traced(const BucketizeArgs& a, const int64_t* lengths, BucketizeOnePass& ws,
                             unsigned long long* trace, cudaStream_t s) {
  dispatch(a, lengths, ws, trace, s);
}

}  // namespace dynemb::cuda
