// A bounded summary of the most frequent rows of a stream, in `capacity` entries whatever the
// stream's number of distinct rows: Space-Saving (Metwally, Agrawal and El Abbadi 2005) taken a
// batch at a time, as a merge of the summary with the batch's exact counts (the mergeable
// form of Agarwal et al. 2012). Each kept row has a count and an overcount: its true count lies
// in [count - overcount, count]. While no more than `capacity` distinct rows have come, every
// count is exact (overcount 0).
//
// The merge: a kept row adds its batch count; a row not kept enters with count floor + its
// batch count and overcount floor, `floor` bounding the true count of every row not kept (0
// until a row is dropped); then the `capacity` largest counts stay and floor becomes the
// largest count dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dynemb::load {

struct CountedRow {
  int table = 0;
  uint64_t row = 0;
  int64_t count = 0;
  int64_t overcount = 0;
};

class SpaceSaving {
 public:
  explicit SpaceSaving(size_t capacity);
  // One batch's exact counts: distinct (table, row) pairs, each count >= 1, sorted by (table,
  // row). `batch` is used as scratch.
  void add_batch(std::vector<CountedRow>& batch);
  // `weight` more occurrences of one row (a batch of one).
  void add(int table, uint64_t row, int64_t weight);
  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }
  // Upper bound of the true count of every row not kept.
  int64_t floor() const { return floor_; }
  // The k entries of largest count, largest first; ties by table, then row, ascending.
  std::vector<CountedRow> top(size_t k) const;

 private:
  size_t capacity_;
  int64_t floor_ = 0;
  std::vector<CountedRow> entries_;  // sorted by (table, row)
};

}  // namespace dynemb::load
