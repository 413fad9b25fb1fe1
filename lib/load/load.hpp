// Per-rank load and traffic of a capture's real batches under a sharding plan (docs/load.md):
// the lookup work each rank gets and the bytes both dists move, for the captured plan and for
// alternatives (alternatives.hpp). Everything comes from the KJTs alone, so any capture serves,
// whatever optional parts it holds, and memory does not grow with the capture's rows.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "plan/plan.hpp"

namespace dynemb {

class CaptureReader;

namespace load {

// Bytes rank s sends to rank d in one dist, sender-major. The diagonal is a rank's share with
// itself (a local copy inside the collective): kept so that rows and columns sum to what each
// rank puts in and takes out, left out of sent(), received() and the critical-path estimate.
struct TrafficMatrix {
  int64_t world_size = 0;
  std::vector<int64_t> bytes;  // [W * W], bytes[s * W + d]

  TrafficMatrix() = default;
  explicit TrafficMatrix(int64_t w) : world_size(w), bytes(static_cast<size_t>(w * w), 0) {}
  int64_t at(int64_t s, int64_t d) const { return bytes[static_cast<size_t>(s * world_size + d)]; }
  void add(int64_t s, int64_t d, int64_t v) { bytes[static_cast<size_t>(s * world_size + d)] += v; }
  void add(const TrafficMatrix& o);
  std::vector<int64_t> sent() const;      // [W]: row sums without the diagonal
  std::vector<int64_t> received() const;  // [W]: column sums without the diagonal
  int64_t total() const;                  // every entry, the diagonal included
};

// What one rank does in one batch (or, summed, over all batches).
struct RankLoad {
  int64_t ids = 0;          // ids routed to the rank: the length of its lookup's input
  int64_t unique_rows = 0;  // distinct (table, row) pairs among them: the rows it touches
};

// One batch, O(W) numbers (the W x W matrices are only kept summed over batches).
struct BatchLoad {
  int64_t batch = 0;
  std::vector<RankLoad> ranks;           // [W]
  std::vector<int64_t> input_received;   // [W] KJT all-to-all bytes in, off the diagonal
  std::vector<int64_t> output_received;  // [W] output dist bytes in, off the diagonal
  double input_dist_seconds = 0;         // critical-path estimate (LoadOptions::link_gbps)
  double output_dist_seconds = 0;
};

// A row of the hottest rank, counted over all batches with a bounded summary (Space-Saving):
// the true count lies in [count - overcount, count]; overcount 0 means exact.
struct HotRow {
  int table = 0;    // index into Plan::tables
  int64_t row = 0;  // the id as routed (global key; docs/load.md)
  int64_t count = 0;
  int64_t overcount = 0;
};

// One plan's load over every batch of the capture.
struct PlanLoad {
  std::string name;    // short and file-name safe: "captured", "roundrobin", "w16", "balanced"
  std::string origin;  // one line: what it is and how it differs from the captured plan
  Plan plan;           // finalized

  std::vector<BatchLoad> batches;    // in batch order (consecutive batches may be grouped, see
                                     // batch_group)
  int64_t batch_group = 1;           // batches[i] sums batches [i*g, (i+1)*g)
  std::vector<RankLoad> total;       // [W] summed over batches
  std::vector<int64_t> table_ids;    // [T * W]: ids of table t routed to rank r, all batches
  TrafficMatrix input_dist;          // KJT all-to-all: lengths, values, strides (VBE), weights
  TrafficMatrix output_dist;         // sequence: all-to-all of rows; pooled: reduce-scatter
  int64_t hottest_rank = 0;          // most ids over all batches (lowest rank on a tie)
  std::vector<HotRow> hottest_rows;  // of hottest_rank, most first
  double input_dist_seconds = 0;     // summed over batches
  double output_dist_seconds = 0;
};

struct LoadReport {
  std::string capture;  // path as given
  int64_t capture_world_size = 0;
  int64_t num_batches = 0;
  double link_gbps = 0;          // the estimate's link bandwidth, Gbit/s per direction
  int64_t hot_row_capacity = 0;  // Space-Saving entries kept per rank for hottest_rows
  std::vector<PlanLoad> plans;   // [0]: the plan the capture is read under; then alternatives
};

// max / mean of a per-rank quantity: 1 for a perfectly balanced one, W when one rank has it
// all; 0 when every value is 0.
double imbalance(const std::vector<int64_t>& per_rank);

}  // namespace load
}  // namespace dynemb
