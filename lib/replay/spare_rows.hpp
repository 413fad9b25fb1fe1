// The float buffers of units already checked, handed back to the reader for the next ones.
#pragma once

#include <cstddef>
#include <mutex>
#include <set>
#include <vector>

#include "engine/backend.hpp"

namespace dynemb::replay_detail {

// Spare buffers of a replay by destination (the senders' blocks or what a destination
// receives, and the golden rows of units already checked), handed back to the reader for the
// batch's next units: units are about one size (a pooled destination's exactly), so their
// memory is neither zeroed nor faulted in again (CaptureReader::read_rows' `reuse`), and, lent
// to a GPU backend, is pinned once for all of them. Holds `most` buffers at most (one unit's
// worth); shared by the checking and the reading thread.
class SpareRows {
 public:
  SpareRows() = default;
  SpareRows(const SpareRows&) = delete;
  SpareRows& operator=(const SpareRows&) = delete;
  ~SpareRows() {
    std::lock_guard<std::mutex> lock(m_);
    try {
      unlend_locked();
      for (void* p : known_) backend_->forget(p);
    } catch (...) {  // a device lost meanwhile: its next call says so
    }
  }
  // Lends the buffers to `backend` while the checking thread reads them (HostLending: a GPU
  // uploads from them directly): each is pinned the first time and reused pinned. Null: none.
  void lend_to(HostLending* backend) { backend_ = backend; }
  // The checking thread reads `v` (a unit's rows) from now until it is given back or
  // unlend_all(), whichever comes first.
  void lend(const std::vector<float>& v) {
    void* p = const_cast<float*>(v.data());
    // Not under the lock: pinning takes a while, and the reader takes buffers meanwhile.
    if (!backend_ || v.capacity() == 0 || !backend_->lend(p, v.capacity() * sizeof(float))) return;
    std::lock_guard<std::mutex> lock(m_);
    lent_.insert(p);
    known_.insert(p);
  }
  // Every buffer lent is read no more (none is pending): they may be written, grown or freed.
  void unlend_all() {
    std::lock_guard<std::mutex> lock(m_);
    unlend_locked();
  }
  void set_most(size_t most) {
    std::lock_guard<std::mutex> lock(m_);
    most_ = most;
    while (spare_.size() > most_) {
      forget_locked(spare_.back().data());
      spare_.pop_back();
    }
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
    // Lent buffers are pinned once each: one the reader would grow is made anew with room to
    // spare, so that later units of about its size fit it. (The one it replaces stays pinned,
    // never lent again, until forgotten.)
    for (size_t i = 0; backend_ && i < need.size(); ++i)
      if (out[i].capacity() < need[i]) {
        std::vector<float>().swap(out[i]);
        out[i].reserve(need[i] + need[i] / 4);
      }
    return out;
  }
  std::vector<float> take_one(size_t need) { return std::move(take({need})[0]); }
  // `v` back from the checking thread (no longer lent), kept for a read if there is room.
  void give(std::vector<float>&& v) {
    bool was_lent = false;
    {
      std::lock_guard<std::mutex> lock(m_);
      was_lent = lent_.erase(v.data()) > 0;
    }
    // Not under the lock: unlending waits for the device's reads of it, and the reader takes
    // other buffers meanwhile (this one is no one else's until it is kept below).
    if (was_lent) backend_->unlend(v.data());
    std::lock_guard<std::mutex> lock(m_);
    if (spare_.size() < most_ && v.capacity() > 0)
      spare_.push_back(std::move(v));
    else
      forget_locked(v.data());  // the caller frees it
  }

 private:
  void unlend_locked() {
    for (auto it = lent_.begin(); it != lent_.end(); it = lent_.erase(it)) backend_->unlend(*it);
  }
  void forget_locked(void* p) {
    if (known_.erase(p) > 0) backend_->forget(p);
  }

  HostLending* backend_ = nullptr;
  std::set<void*> lent_;   // lent now
  std::set<void*> known_;  // lent at some time: pinned until forgotten
  std::mutex m_;
  size_t most_ = 0;
  std::vector<std::vector<float>> spare_;
};

}  // namespace dynemb::replay_detail
