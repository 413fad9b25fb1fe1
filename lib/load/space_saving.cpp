#include "load/space_saving.hpp"

#include <algorithm>

#include "common/hash.hpp"

namespace dynemb::load {

size_t SpaceSaving::KeyHash::operator()(const Key& k) const {
  return static_cast<size_t>(fmix64(k.row ^ (static_cast<uint64_t>(k.table) << 48)));
}

SpaceSaving::SpaceSaving(size_t capacity) : capacity_(std::max<size_t>(1, capacity)) {
  entries_.reserve(capacity_);
  heap_.reserve(capacity_);
  where_.reserve(capacity_);
  index_.reserve(capacity_ * 2);
}

// The heap's order: count, then the entry's key, so that the row evicted among equal counts
// does not depend on the hash map's iteration order.
bool SpaceSaving::less(uint32_t a, uint32_t b) const {
  const CountedRow& x = entries_[a];
  const CountedRow& y = entries_[b];
  if (x.count != y.count) return x.count < y.count;
  if (x.table != y.table) return x.table < y.table;
  return x.row < y.row;
}

void SpaceSaving::sift_up(size_t pos) {
  while (pos > 0) {
    const size_t parent = (pos - 1) / 2;
    if (!less(heap_[pos], heap_[parent])) break;
    std::swap(heap_[pos], heap_[parent]);
    where_[heap_[pos]] = static_cast<uint32_t>(pos);
    where_[heap_[parent]] = static_cast<uint32_t>(parent);
    pos = parent;
  }
}

void SpaceSaving::sift_down(size_t pos) {
  const size_t n = heap_.size();
  for (;;) {
    const size_t l = 2 * pos + 1, r = l + 1;
    size_t m = pos;
    if (l < n && less(heap_[l], heap_[m])) m = l;
    if (r < n && less(heap_[r], heap_[m])) m = r;
    if (m == pos) return;
    std::swap(heap_[pos], heap_[m]);
    where_[heap_[pos]] = static_cast<uint32_t>(pos);
    where_[heap_[m]] = static_cast<uint32_t>(m);
    pos = m;
  }
}

void SpaceSaving::add(int table, uint64_t row, int64_t weight) {
  const Key key{table, row};
  auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].count += weight;
    sift_down(where_[it->second]);
    return;
  }
  if (entries_.size() < capacity_) {
    const auto i = static_cast<uint32_t>(entries_.size());
    entries_.push_back({table, row, weight, 0});
    where_.push_back(static_cast<uint32_t>(heap_.size()));
    heap_.push_back(i);
    index_.emplace(key, i);
    sift_up(heap_.size() - 1);
    return;
  }
  const uint32_t i = heap_.front();  // the least count: replaced
  CountedRow& e = entries_[i];
  index_.erase(Key{e.table, e.row});
  const int64_t least = e.count;
  e = {table, row, least + weight, least};
  index_.emplace(key, i);
  sift_down(0);
}

std::vector<CountedRow> SpaceSaving::top(size_t k) const {
  std::vector<CountedRow> all = entries_;
  std::sort(all.begin(), all.end(), [](const CountedRow& a, const CountedRow& b) {
    if (a.count != b.count) return a.count > b.count;
    if (a.table != b.table) return a.table < b.table;
    return a.row < b.row;
  });
  if (all.size() > k) all.resize(k);
  return all;
}

}  // namespace dynemb::load
