#include "replay/check_log.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <system_error>

#include "common/sha256.hpp"

namespace dynemb::replay_detail {

void CheckLog::record(CheckResult c) {
  // A backend that cannot start is the run's trouble, before any check counts. A GPU backend
  // still starting is not waited for here: what is decided meanwhile (a batch's context checks,
  // which need no backend) waits unconfirmed, so that the host goes on with the batch (the first
  // unit's read) while the device starts; the next check decided once it has started, or
  // settle(), records them in their order. (Under a rank split the processes exchange each
  // batch's checks in phases: there a check waits for the backend, as its first step would.)
  if (began_ && !backend_ok_) {
    if (!split_ && !backend_.ready()) {
      unconfirmed_.push_back(std::move(c));
      return;
    }
    settle();
  }
  record_confirmed(std::move(c));
}

void CheckLog::settle() {
  if (!began_ || backend_ok_) return;
  backend_.get();  // throws what the backend's start threw: the checks waiting are dropped
  backend_ok_ = true;
  std::vector<CheckResult> waiting = std::move(unconfirmed_);
  unconfirmed_.clear();
  for (CheckResult& c : waiting) record_confirmed(std::move(c));
}

void CheckLog::record_confirmed(CheckResult c) {
  if (split_) {
    const bool zero = !team_ || team_->index() == 0;
    const bool keep = phase_ == 0 || c.rank < 0 ? zero : c.rank >= split_lo_ && c.rank < split_hi_;
    if (keep) split_found_.records.push_back({phase_, std::move(c)});
    return;
  }
  show_header_when_hashed();
  if (cb_.on_check) {
    if (header_shown_)
      cb_.on_check(c);
    else
      waiting_.push_back(c);  // to the caller after the header, which waits for the hash
  }
  if (opt_.passes != PassMode::whole && PassLog::fits(c)) {
    ++rep_.pass_counts[c.stage];
    if (opt_.passes == PassMode::compact) rep_.pass_log.add(c, rep_.checks.size());
    return;
  }
  rep_.checks.push_back(std::move(c));
}

void CheckLog::trouble(int64_t k, int rank, const std::string& stage, const std::string& msg) {
  if (opt_.fail_fast) throw Error(msg);
  if (troubles_++ == 0) first_trouble_batch_ = k;
  CheckResult c;
  c.batch = k;
  c.rank = rank;
  c.stage = stage;
  c.check = "trouble";
  c.status = CheckStatus::error;
  c.message = msg;
  record(std::move(c));
}

void CheckLog::hash_capture(const std::string& path) {
  try {
    capture_sha_ = std::async(std::launch::async, [path] { return sha256_file(path); });
  } catch (const std::system_error&) {  // no thread to be had: hashed in turn
    capture_sha_ = std::async(std::launch::deferred, [path] { return sha256_file(path); });
  }
}

void CheckLog::take_capture_sha() {
  if (capture_sha_.valid()) rep_.info.capture.sha256 = capture_sha_.get();
}

void CheckLog::batch_began() {
  began_ = true;
  show_header_when_hashed();
}

void CheckLog::show_header() {
  settle();  // the header names the backend's device: it has started
  if (header_shown_) return;
  take_capture_sha();
  rep_.info.device = backend_.get().device();  // waits for a backend still starting
  header_shown_ = true;
  if (cb_.on_start) cb_.on_start(rep_);
  for (const CheckResult& c : waiting_) cb_.on_check(c);
  waiting_.clear();
  waiting_.shrink_to_fit();
}

void CheckLog::show_header_when_hashed() {
  using namespace std::chrono_literals;
  // The header names the capture's hash and the backend's device: shown once both are in,
  // never waiting for either (at the latest, show_header() when the run ends).
  if (began_ && !header_shown_ &&
      (!capture_sha_.valid() || capture_sha_.wait_for(0s) == std::future_status::ready) &&
      backend_.ready())
    show_header();
}

void CheckLog::measure_progress(const CaptureReader& reader, int64_t world_size) {
  world_size_ = std::max<int64_t>(1, world_size);
  if (!cb_.on_progress) return;
  progress_.batches_total = int64_t(rep_.info.batches.size());
  progress_.rank_batches_total = progress_.batches_total * world_size;
  for (int64_t k : rep_.info.batches) {
    double bytes = 0;
    for (const DatasetStat& d : reader.dataset_stats(k)) bytes += double(d.logical_bytes);
    batch_bytes_[k] = bytes;
    progress_.bytes_total += bytes;
  }
}

void CheckLog::rank_done(int64_t k) {
  if (relays()) return team_->send_progress(k, false);
  if (!cb_.on_progress) return;
  show_header_when_hashed();  // before the bar moves on under a missing header
  count_done(k, false);
  poll_team();
}

void CheckLog::batch_done(int64_t k) {
  if (relays()) return team_->send_progress(k, true);
  show_header_when_hashed();
  if (!cb_.on_progress) return;
  count_done(k, true);
  poll_team();
}

void CheckLog::count_done(int64_t k, bool whole_batch) {
  if (finished_.count(k)) return;
  const int64_t W = world_size_;
  int64_t& done = ranks_done_[k];
  if (whole_batch) {
    progress_.rank_batches_done += W - done;
    progress_.bytes_done += batch_bytes_[k] * double(W - done) / double(W);
    ranks_done_.erase(k);
    finished_.insert(k);
    ++progress_.batches_done;
  } else {
    if (done >= W) return;
    ++done;
    ++progress_.rank_batches_done;
    progress_.bytes_done += batch_bytes_[k] / double(W);
  }
  cb_.on_progress(progress_);
}

void CheckLog::poll_team() {
  if (team_ && !relays() && cb_.on_progress)
    team_->poll_progress([this](int64_t k, bool whole) { count_done(k, whole); });
}

void CheckLog::merge(Findings&& f) {
  settle();  // this process's own checks first
  for (CheckResult& c : f.checks) {
    if (c.check == "trouble" && c.status == CheckStatus::error && troubles_++ == 0)
      first_trouble_batch_ = c.batch;
    record(std::move(c));
  }
  for (const auto& [stage, n] : f.pass_counts) rep_.pass_counts[stage] += n;
  // A warning given once a run (no local_embs to run a dist on) is given once by each process.
  for (std::string& w : f.warnings)
    if (std::find(rep_.warnings.begin(), rep_.warnings.end(), w) == rep_.warnings.end())
      rep_.warnings.push_back(std::move(w));
}

void CheckLog::split_begin(int64_t k, int64_t lo, int64_t hi) {
  settle();  // the batches before are recorded as one process records them
  split_ = true;
  phase_ = 0;
  split_k_ = k;
  split_lo_ = lo;
  split_hi_ = hi;
  split_found_ = SplitFindings();
}

void CheckLog::batch_trouble(int64_t k, int rank, const std::string& stage,
                             const std::string& msg) {
  if (!split_) return trouble(k, rank, stage, msg);
  SplitStop& s = split_found_.stop;
  if (s.set) return;
  s.set = true;
  s.phase = phase_;
  s.rank = rank;
  s.stage = stage;
  s.message = msg;
}

std::vector<std::string> CheckLog::exchange(char tag, const std::string& bytes) {
  std::vector<std::string> all =
      team_->allgather(std::string(1, tag) + bytes, [this](int64_t k, bool whole) {
        if (cb_.on_progress) count_done(k, whole);
      });
  for (std::string& b : all) {
    if (b.empty() || b[0] != tag)
      team_->abort(
          fmt::format("batch {}: the processes are out of step (one is at exchange '{}', "
                      "another at '{}')",
                      split_k_, tag, b.empty() ? '?' : b[0]));
    b.erase(0, 1);
  }
  return all;
}

void CheckLog::split_end(std::exception_ptr fatal) {
  const int64_t k = split_k_;
  split_ = false;
  if (fatal) {
    try {
      std::rethrow_exception(fatal);
    } catch (const std::exception& e) {
      split_found_.fatal = e.what();
    } catch (...) {
      split_found_.fatal = "unknown trouble";
    }
    if (split_found_.fatal.empty()) split_found_.fatal = "trouble";
    SplitStop& s = split_found_.stop;
    if (!s.set) {
      s.set = s.fatal = true;
      s.phase = phase_;
      s.message = split_found_.fatal;
    }
  }
  const std::vector<std::string> bytes = exchange('B', encode_split(split_found_));
  split_found_ = SplitFindings();
  std::vector<SplitFindings> all;
  for (const std::string& b : bytes) {
    try {
      all.push_back(decode_split(b));
    } catch (const Error& e) {
      team_->abort(fmt::format("batch {}: {}", k, e.what()));
    }
  }
  // Trouble that ends the run: this process's own rethrown, else the first process's.
  const auto end_run = [&] {
    if (fatal) std::rethrow_exception(fatal);
    for (const SplitFindings& f : all)
      if (!f.fatal.empty()) throw Error(f.fatal);
  };
  const bool zero = team_->index() == 0;
  for (const SplitEvent& ev : split_order(all)) {
    if (ev.check) {
      if (zero) record(*ev.check);
      continue;
    }
    const SplitStop& s = *ev.stop;
    if (s.fatal) end_run();
    if (zero)
      trouble(k, s.rank, s.stage, s.message);  // throws under --fail-fast
    else if (opt_.fail_fast)
      throw Error(s.message);
  }
  end_run();
}

}  // namespace dynemb::replay_detail
