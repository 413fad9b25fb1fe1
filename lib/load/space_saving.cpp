#include "load/space_saving.hpp"

#include <algorithm>

namespace dynemb::load {

namespace {

bool key_less(const CountedRow& a, const CountedRow& b) {
  return a.table != b.table ? a.table < b.table : a.row < b.row;
}
// Largest count first, then the key: a total order, so that what is kept never depends on
// the order of equal counts.
bool rank_before(const CountedRow& a, const CountedRow& b) {
  return a.count != b.count ? a.count > b.count : key_less(a, b);
}

}  // namespace

SpaceSaving::SpaceSaving(size_t capacity) : capacity_(std::max<size_t>(1, capacity)) {}

void SpaceSaving::add_batch(std::vector<CountedRow>& batch) {
  // Kept rows add their batch counts (a merge of two key-sorted lists); the others, compacted
  // at the front of `batch`, are candidates.
  size_t j = 0, fresh = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const CountedRow b = batch[i];
    while (j < entries_.size() && key_less(entries_[j], b)) ++j;
    if (j < entries_.size() && !key_less(b, entries_[j]))
      entries_[j].count += b.count;
    else
      batch[fresh++] = b;
  }
  batch.resize(fresh);
  // Every candidate enters with the floor so far: only the `capacity` largest can stay, and
  // the largest dropped bounds the rows not kept.
  const int64_t f0 = floor_;
  if (batch.size() > capacity_) {
    std::nth_element(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(capacity_),
                     batch.end(), rank_before);
    for (size_t i = capacity_; i < batch.size(); ++i)
      floor_ = std::max(floor_, f0 + batch[i].count);
    batch.resize(capacity_);
  }
  for (const CountedRow& b : batch) entries_.push_back({b.table, b.row, f0 + b.count, f0});
  if (entries_.size() > capacity_) {
    std::nth_element(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(capacity_),
                     entries_.end(), rank_before);
    for (size_t i = capacity_; i < entries_.size(); ++i)
      floor_ = std::max(floor_, entries_[i].count);
    entries_.resize(capacity_);
  }
  std::sort(entries_.begin(), entries_.end(), key_less);
}

void SpaceSaving::add(int table, uint64_t row, int64_t weight) {
  std::vector<CountedRow> one{{table, row, weight, 0}};
  add_batch(one);
}

std::vector<CountedRow> SpaceSaving::top(size_t k) const {
  std::vector<CountedRow> all = entries_;
  std::sort(all.begin(), all.end(), rank_before);
  if (all.size() > k) all.resize(k);
  return all;
}

}  // namespace dynemb::load
