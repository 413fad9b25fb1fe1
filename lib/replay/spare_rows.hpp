// The float buffers of units already checked, handed back to the reader for the next ones.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

namespace dynemb::replay_detail {

// Spare buffers of a replay by destination (the senders' blocks or what a destination
// receives, and the golden rows of units already checked), handed back to the reader for the
// batch's next units: units are about one size (a pooled destination's exactly), so their
// memory is neither zeroed nor faulted in again (CaptureReader::read_rows' `reuse`). Holds
// `most` buffers at most (one unit's worth); shared by the checking and the reading thread.
class SpareRows {
 public:
  void set_most(size_t most) {
    std::lock_guard<std::mutex> lock(m_);
    most_ = most;
    if (spare_.size() > most_) spare_.resize(most_);
  }
  // A buffer for each of `need` (floats): the spare of least capacity that holds it, else the
  // largest left (the reader grows it without copying its old contents); an empty buffer when
  // none is spare.
  std::vector<std::vector<float>> take(const std::vector<size_t>& need) {
    std::lock_guard<std::mutex> lock(m_);
    std::vector<std::vector<float>> out(need.size());
    for (size_t i = 0; i < need.size() && !spare_.empty(); ++i) {
      size_t best = spare_.size(), largest = 0;
      for (size_t j = 0; j < spare_.size(); ++j) {
        const size_t c = spare_[j].capacity();
        if (c >= need[i] && (best == spare_.size() || c < spare_[best].capacity())) best = j;
        if (c > spare_[largest].capacity()) largest = j;
      }
      const size_t j = best < spare_.size() ? best : largest;
      out[i] = std::move(spare_[j]);
      spare_[j] = std::move(spare_.back());
      spare_.pop_back();
    }
    return out;
  }
  std::vector<float> take_one(size_t need) { return std::move(take({need})[0]); }
  void give(std::vector<float>&& v) {
    std::lock_guard<std::mutex> lock(m_);
    if (spare_.size() < most_ && v.capacity() > 0) spare_.push_back(std::move(v));
  }

 private:
  std::mutex m_;
  size_t most_ = 0;
  std::vector<std::vector<float>> spare_;
};

}  // namespace dynemb::replay_detail
