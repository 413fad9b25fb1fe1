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

// Partition path (partition.cuh, partition_resident.cuh; tiles planned on the host by
// plan_partition_tiles, bucketize/tiles.cu).
// Bags of a tile at most (the tile's offsets live in shared memory; the place kernel's static
// shared memory stays under 48 KB with this many), and W x bags <= kPartMaxCells.
constexpr int kPartMaxTileBags = 512;
// Bags of a tile as planned: 384 bags of 10 ids fill two chunks where 512 spill into a third,
// and a tile within one chunk gains nothing from more bags. The wider cap (kPartMaxTileBags)
// pays only where the one launch's tiles must grow past one chunk to be resident at once:
// fewer short-bag tiles leave more of the grid to the long-bag features, whose tiles set the
// launch's length. plan_partition_tiles takes the wider cap there only.
constexpr int kPartTileBags = 384;
// W x (bags of a tile) at most: the count kernel's shared count matrix.
constexpr int kPartMaxCells = 4096;
// Ids of a tile (plan_partition_tiles, bucketize/tiles.cu): the batch's ids over kPartMinTiles
// (about one resident place block per SM quarter), within [kPartMinTileIds, kPartTargetIds]:
// at least half a chunk (a tile's fixed work, its offsets and the summing of tile counts,
// outweighs a smaller tile's ids), at most three chunks (a fourth lengthens the largest tiles,
// which set the two kernels' length, more than fewer tiles save). The one launch may grow
// tiles up to kPartTileIds (four chunks) to keep them all resident. `bench --sweep
// --tile-ids` compares tilings.
constexpr int64_t kPartTargetIds = 6144;
constexpr int64_t kPartTileIds = 8192;
constexpr int64_t kPartMinTileIds = 1024;
constexpr int64_t kPartMinTiles = 512;
// W x tiles_per_rank at most for the place kernel to sum its rank's tile counts itself
// (tile_base == nullptr: no scan launches; a warp per bucket reads the rank's counts, 32 KB at
// most per block); above it, a cub scan writes tile_base.
constexpr int64_t kPartDirectBaseEntries = 4096;

static_assert(kPartMaxTileBags <= 2 * kThreads, "two bag lengths per thread");
static_assert(kPartTileBags <= kPartMaxTileBags);
}  // namespace dynemb::cuda::bucketize
