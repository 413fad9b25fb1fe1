// Launch wrappers of the CUDA kernels (bucketize.cu, gather.cu, pooled.cu). Plain C++ so
// host code (cuda_backend.cpp, cli/bench.cpp, tests) can call them; every pointer is a
// device pointer, every size int64. All W ranks of a batch live on one GPU: "rank buffers"
// are row ranges of one concatenated buffer, described by prefix-offset arrays [W+1].
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dynemb::cuda {

// ---------------------------------------------------------------- bucketize (§3.2, §3.3, §10.2)
// Mean bag length from which the three-pass path takes a block per bag (BucketizeArgs::bag_path).
constexpr int64_t kBlockPerBagMinAvg = 128;

// Bucketizes R KJTs (R = 1 for one rank, R = W for a whole batch) in one pass. Bags are
// numbered globally, rank-major; rank q owns bags [rank_bag_off[q], rank_bag_off[q+1]).
// new_lengths of rank q start at W*rank_bag_off[q] and are laid out [d][j] (bucket major),
// so one exclusive scan over all of them gives every id's global bucketized position.
struct BucketizeArgs {
  int64_t num_ranks = 1;                  // R
  int64_t world_size = 1;                 // W (buckets)
  int64_t num_features = 0;               // F
  int64_t total_bags = 0;                 // sum_q L_q
  int64_t total_ids = 0;                  // N
  const int64_t* rank_bag_off = nullptr;  // [R+1]
  const int64_t* feat_bag_off = nullptr;  // [R*(F+1)]: rank-local first bag of feature f
  const int64_t* bag_offsets = nullptr;   // [total_bags+1] global id offsets
  const int64_t* ids = nullptr;           // [N]
  const float* weights = nullptr;         // [N] or null
  const uint64_t* block_sizes = nullptr;  // [F] blk_f
  const int32_t* dist_types = nullptr;    // [F] 0 continuous, 1 roundrobin, 2 hash_roundrobin
  bool ids_i32 = false;                   // route by u32(id) (int32 KJT values)
  // >= every bag's length (host knows it): picks threads per bag, and the one-pass kernel's
  // instance (bags of <= 2048 ids keep their ids on chip; a longer bag there traps).
  int64_t max_bag_len = 0;
  // Three-pass path (W <= 256): a warp per bag, or a 256-thread block per bag (2048-id chunks,
  // coalesced placement through shared memory). Auto takes blocks only when bags are long on
  // average (>= kBlockPerBagMinAvg ids): with short bags a block per bag leaves
  // most of its threads idle (unit-pooled-w8 x64, bags of 0-100 ids: 3.8 ms by blocks; torch
  // 1.3 ms; BENCHMARKS.md run 21). Tests force either.
  enum class BagPath { automatic, warp, block } bag_path = BagPath::automatic;
  // Outputs.
  int64_t* new_lengths = nullptr;  // [W*total_bags]
  int64_t* new_offsets = nullptr;  // [W*total_bags] scratch: exclusive scan of new_lengths
  int64_t* new_values = nullptr;   // [N] bucketized order (global positions)
  float* new_weights = nullptr;    // [N] when weights
  int64_t* perm = nullptr;         // [N] unbucketize_permute, rank-local positions
  int64_t* dest_rank = nullptr;    // [N] or null
  void* scan_temp = nullptr;       // cub scratch, bucketize_scan_temp_bytes()
  size_t scan_temp_bytes = 0;
};
size_t bucketize_scan_temp_bytes(int64_t n);
// Three passes over precomputed bag_offsets: per-(bag, bucket) counts, one cub exclusive scan
// over all new_lengths, placement. Any W, any bag lengths.
void launch_bucketize(const BucketizeArgs& a, cudaStream_t s);
// Whether launch_bucketize takes a block per bag (else a warp per bag, or a thread per bag
// for W > 256): BucketizeArgs::bag_path.
bool bucketize_block_per_bag(const BucketizeArgs& a);
// offsets[0] = 0, offsets[i+1] = lengths[0] + ... + lengths[i] (temp: same cub scratch size).
void launch_offsets_from_lengths(const int64_t* lengths, int64_t n, int64_t* offsets, void* temp,
                                 size_t temp_bytes, cudaStream_t s);

// The whole stage from lengths: writes a.bag_offsets [total_bags+1] from `lengths`
// [total_bags], then bucketizes. A batch with at most one bag per resident block (W <= 256,
// R <= 256, W x bags of one rank <= 65536, fewer than 2^31 ids) and a workspace takes ONE
// kernel (cooperative launch, a block per bag, bucketize.cu "one-pass path"): bag offsets reduced
// by each block, counts with the ids kept on chip (read once), an exchange of epoch-tagged counts
// between the blocks of a rank, placement. Everything else: launch_offsets_from_lengths +
// launch_bucketize. Same outputs, bit for bit, either way.
struct BucketizeFused {
  void* scratch = nullptr;  // bucketize_fused_scratch_bytes(), zeroed once before first use
  size_t scratch_bytes = 0;
  int64_t max_rank_bags = 0;  // max_q (rank_bag_off[q+1] - rank_bag_off[q]), host-known
  uint32_t epoch = 0;         // launches so far on this scratch (the kernel's freshness tag)
  // Optional [kBucketizeTracePoints x total_bags]: %globaltimer (ns) per block at the end of
  // each step (0 start, 1 bag offsets, 2 counts published, 3 rank's counts seen, 4 bases,
  // 5 placed),
  // for `dynemb-dist bench`'s phase breakdown. Null: not recorded.
  unsigned long long* trace = nullptr;
};
constexpr int kBucketizeTracePoints = 6;
// 0 when the device cannot launch the one-pass kernel (no cooperative launch). One scratch
// serves one stream: launches on it must not overlap.
size_t bucketize_fused_scratch_bytes();
// Zeroes the scratch (epoch 0 = never written); do it once, with BucketizeFused::epoch = 0.
void bucketize_fused_scratch_init(void* scratch, size_t bytes, cudaStream_t s);
// Resident blocks of the one-pass kernel on the current device, at most 1024 (0: no
// cooperative launch): the one-pass path is taken when total_bags <= this.
int64_t bucketize_fused_capacity();
// Whether launch_bucketize_from_lengths takes the one-pass kernel for these arguments.
bool bucketize_fused_eligible(const BucketizeArgs& a, const BucketizeFused& f);
struct BucketizeFusedShape {
  int64_t grid = 0;         // blocks = bags; 0: not the one-pass path
  int64_t capacity = 0;     // resident blocks of the kernel on this device
  bool ids_cached = false;  // every bag <= 2048 ids: ids read once
};
BucketizeFusedShape bucketize_fused_shape(const BucketizeArgs& a, const BucketizeFused& f);
// Bumps f.epoch when it takes the one-pass kernel.
void launch_bucketize_from_lengths(const BucketizeArgs& a, const int64_t* lengths,
                                   BucketizeFused& f, cudaStream_t s);

// ---------------------------------------------------------------- benchmarking
// One thread spinning `cycles` SM clock cycles on stream s (kernels/timing.cu).
void launch_spin(int64_t cycles, cudaStream_t s);
// Floors for the bucketize stage (bench's note line): an empty kernel of blocks x threads, and
// blocks x 256 threads that only move the stage's main bytes: values[i] = ids[i], perm[i] = i
// for i < n (8N read, 16N written, no routing, no ordering).
void launch_empty(int64_t blocks, int threads, cudaStream_t s);
void launch_stream_floor(const int64_t* ids, int64_t n, int64_t* values, int64_t* perm,
                         int64_t blocks, cudaStream_t s);

// ---------------------------------------------------------------- sequence output dist (§6)
// Per owner rank r: local_embs rows [local_row_off[r], local_row_off[r+1]) in (f, s, b)
// order, and the forward recat as K_r segments: send-buffer segment k starts at send row
// seg_out_off[seg_base[r]+k] and copies local rows from seg_src[seg_base[r]+k] on (rank-
// local). Per destination rank s: output rows [out_row_off[s], out_row_off[s+1]).
struct SeqDistArgs {
  int64_t world_size = 1;
  int64_t dim = 0;               // D
  int codec = 0;                 // 0 none, 1 fp16, 2 bf16 (encode+decode around the exchange)
  int64_t total_local_rows = 0;  // sum_r N_local_r (= rows of every send buffer together)
  int64_t total_out_rows = 0;    // sum_s N_s (= rows of every recv / output buffer)
  const float* local = nullptr;  // [sum_r N_local_r, D]
  const int64_t* local_row_off = nullptr;  // [W+1]
  const int64_t* out_row_off = nullptr;    // [W+1]
  const int64_t* perm = nullptr;           // [sum_s N_s] unbucketize_permute, rank-local
  const int64_t* recv_off = nullptr;       // [W*(W+1)] dest s: prefix of input_splits_s
  const int64_t* send_off = nullptr;       // [W*(W+1)] owner r: prefix of output_splits_r
  const int64_t* seg_base = nullptr;       // [W+1]
  const int64_t* seg_out_off = nullptr;    // [sum K_r]
  const int64_t* seg_src = nullptr;        // [sum K_r]
};
// One pass: out[o] = codec(local[src(o)]) with src from perm + splits + recat.
void launch_seq_fused(const SeqDistArgs& a, float* out, cudaStream_t s);
// The three unfused steps (what TorchRec runs, each a full pass over the rows):
// send (rows laid out like local) <- recat permute of local
void launch_seq_recat(const SeqDistArgs& a, float* send, cudaStream_t s);
// recv (rows laid out like out) <- all-to-all of send (codec applied here)
void launch_seq_exchange(const SeqDistArgs& a, const float* send, float* recv, cudaStream_t s);
// out[o] = src[rowidx[o]] (the unbucketize index_select; rowidx global row numbers).
void launch_gather_rows(const float* src, const int64_t* rowidx, int64_t nrows, int64_t dim,
                        float* out, cudaStream_t s);

// Device oracle rows: out[k, c] = oracle(table_seed[table[k]], g[k], c), [n, D]; 0 where
// table[k] < 0.
void launch_oracle_rows(const uint64_t* g, const int32_t* table, const uint64_t* table_seeds,
                        int64_t n, int64_t dim, float* out, cudaStream_t s);

// ---------------------------------------------------------------- pooled (§5, §7)
// Segment sums of oracle rows: bag j (ids [bag_offsets[j], bag_offsets[j+1])) of feature
// bag_feat[j] writes D_f sums at out[bag_out[j] ...]; fp32 in id order, acc += w*v without
// FMA, then rounded to out_dtype (the TBE output cast).
struct PooledLookupArgs {
  int64_t num_bags = 0;
  const int64_t* bag_offsets = nullptr;  // [num_bags+1]
  const int64_t* bag_out = nullptr;      // [num_bags] element offset of the bag's output run
  const int32_t* bag_feat = nullptr;     // [num_bags]
  const uint64_t* g = nullptr;           // [N] unsharded row per id
  const uint8_t* valid = nullptr;        // [N] 0: skip the id (out of bounds, empty shard)
  const float* weights = nullptr;        // [N] or null
  const int64_t* feat_dim = nullptr;     // [F]
  const uint64_t* feat_seed = nullptr;   // [F] oracle table seed of the feature's table
  int out_dtype = 0;
  float* out = nullptr;
};
void launch_pooled_lookup(const PooledLookupArgs& a, cudaStream_t s);

// out[e] = sum_{d<W} parts[d*stride + e], in d order; with `round_dtype` != 0 the sum is
// rounded to fp16/bf16 after every add (a low-precision reduce-scatter). n elements.
void launch_reduce(const float* parts, int64_t num_parts, int64_t stride, int64_t n,
                   int round_dtype, float* out, cudaStream_t s);
// Elementwise codec encode (clamp + round) in place: the encode-decode around a collective.
void launch_codec(float* x, int64_t n, int dtype, cudaStream_t s);

}  // namespace dynemb::cuda
