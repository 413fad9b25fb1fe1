// Launch shapes and limits of the bucketize kernels, shared by every path.
#pragma once

#include <cstdint>

namespace dynemb::cuda::bucketize {

constexpr int kThreads = 256;     // threads of every block-shaped bucketize kernel
constexpr int kMaxSharedW = 256;  // buckets (W) that per-bucket shared arrays hold
constexpr int kSmallW = 16;       // W <= kSmallW: 4-bit buckets (peers<4>, the one-pass
                                  // histogram and its warp-local ranking)

// Three-pass path, a warp per bag: kPre tiles of 32 ids loaded before the first is ranked.
constexpr int kPre = 4;
constexpr int kBagsPerBlock = kThreads / 32;

// Chunks of a block per bag (the one-pass kernel and the three-pass block-per-bag kernels):
// warp w ranks ids [w*kWarpIds, (w+1)*kWarpIds) of each kChunk-id chunk, kIdsPerLane per lane.
constexpr int kWarps = kThreads / 32;
constexpr int kIdsPerLane = 8;
constexpr int kWarpIds = 32 * kIdsPerLane;
constexpr int kChunk = kWarps * kWarpIds;  // 2048

// One-pass kernel limits (bucketize.cu checks them before choosing it).
constexpr int kLensPerThread = 4;                               // bag lengths per thread, step 1
constexpr int64_t kMaxOnePassBags = kLensPerThread * kThreads;  // 1024: bags of one launch
constexpr int64_t kMaxRankEntries = 65536;  // W x (bags of a rank): words each block reads
constexpr int kWordsPerThread = 2;          // words loaded per thread per round, step 4
constexpr int kWordRound = kWordsPerThread * kThreads;
constexpr int64_t kMaxFeatTab = 512;      // R x (F+1) feature offsets kept in shared memory
constexpr unsigned kMaxPolls = 1u << 25;  // step 4 traps after this many polls of one round

}  // namespace dynemb::cuda::bucketize
