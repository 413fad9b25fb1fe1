// A bounded summary of the most frequent rows of a stream (Space-Saving, Metwally, Agrawal and
// El Abbadi 2005), with weighted updates: memory is `capacity` entries whatever the stream's
// number of distinct rows. Each kept row has a count and an overcount: its true count lies in
// [count - overcount, count]. Every row whose true count exceeds (total weight) / capacity is
// kept; while no more than `capacity` distinct rows have come, every count is exact
// (overcount 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
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
  // `weight` (>= 1) more occurrences of (table, row). When the summary is full and the row is
  // not in it, it replaces the entry of least count c, taking count c + weight and overcount c.
  void add(int table, uint64_t row, int64_t weight);
  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }
  // The k entries of largest count, largest first; ties by table, then row, ascending.
  std::vector<CountedRow> top(size_t k) const;

 private:
  struct Key {
    int table;
    uint64_t row;
    bool operator==(const Key& o) const { return table == o.table && row == o.row; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  size_t capacity_;
  std::vector<CountedRow> entries_;  // [size]
  std::vector<uint32_t> heap_;       // entry indices, a min-heap on count
  std::vector<uint32_t> where_;      // [size]: position of entry i in heap_
  std::unordered_map<Key, uint32_t, KeyHash> index_;
  void sift_down(size_t pos);
  void sift_up(size_t pos);
  bool less(uint32_t a, uint32_t b) const;
};

}  // namespace dynemb::load
