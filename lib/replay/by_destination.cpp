// A batch cut by destination (batch_run.hpp, unit_planner.hpp): each unit reads from the
// capture only the rows its output is made of, while the next unit's are read on another thread.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <new>
#include <set>
#include <system_error>

#include "common/error.hpp"
#include "engine/ops.hpp"
#include "replay/batch_run.hpp"
#include "replay/lookup_check.hpp"
#include "replay/output_check.hpp"
#include "replay/spare_rows.hpp"
#include "replay/team.hpp"
#include "replay/unit_planner.hpp"

namespace dynemb::replay_detail {

namespace {

// fn(arg) on another thread (`ahead`), or deferred to the get() of the future: when not ahead, or
// when no thread can be started (the work then runs in turn).
template <class Fn, class Arg>
auto read_ahead_task(Fn& fn, Arg arg, bool ahead) -> std::future<decltype(fn(arg))> {
  try {
    if (ahead) return std::async(std::launch::async, [&fn, arg] { return fn(arg); });
    return std::async(std::launch::deferred, [&fn, arg] { return fn(arg); });
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, [&fn, arg] { return fn(arg); });
  }
}

}  // namespace

namespace {

// Every row of a captured tensor as the ranges of CaptureReader::read_rows.
std::vector<std::pair<int64_t, int64_t>> whole_rows(const EmbTensor& t) {
  if (t.rows() == 0) return {};
  return {{0, t.rows()}};
}

// What a unit's checks read from the capture: the block of every sender and the unit's rows of
// the golden output (when captured).
struct UnitRows {
  std::vector<EmbTensor> blocks;  // pooled: [W] the senders' chunks
  EmbTensor recv;                 // sequence: what d receives, the senders' blocks in rank order
  std::vector<int64_t> recv_off;  // sequence: [W + 1] where each block starts in recv (elements)
  std::optional<EmbTensor> golden;
  const float* block(size_t s) const {  // sender s's block: its first element
    return blocks.empty() ? recv.data.data() + recv_off[s] : blocks[s].data.data();
  }
};

// A unit's rows lent to the backend while its checks read them (a GPU uploads them directly),
// each until it is given back; what is not (a check that threw) is unlent when this ends.
class LentRows {
 public:
  LentRows(SpareRows& spare, const UnitRows& rows) : spare_(spare) {
    for (const EmbTensor& b : rows.blocks) spare.lend(b.data);
    spare.lend(rows.recv.data);
    if (rows.golden) spare.lend(rows.golden->data);
  }
  ~LentRows() {
    try {
      spare_.unlend_all();
    } catch (...) {  // a device lost: its next call says so
    }
  }

 private:
  SpareRows& spare_;
};

// The block of sender s in unit u.
DestBlock unit_block(const DestinationCut& cut, int64_t s, const Unit& u) {
  const DestBlock& b = cut.where[size_t(s)][size_t(u.d)];
  return u.rows ? block_rows(b, u.r0, u.r1) : b;
}

// The bytes of a unit's rows once read (as float32): every sender's block and its golden rows.
double unit_bytes(const DestinationCut& cut, const Unit& u, const EmbTensor* golden) {
  double n = 0;
  for (size_t s = 0; s < cut.where.size(); ++s) n += double(unit_block(cut, int64_t(s), u).numel());
  if (golden) n += u.rows ? double(u.r1 - u.r0) * double(golden->cols()) : double(golden->numel());
  return 4.0 * n;
}

// Unit u's rows, read through `src` (on whichever thread it reads).
UnitRows read_unit(BatchSource& src, int64_t k, const Unit& u, bool sequence,
                   const DestinationCut& cut, const std::vector<const EmbTensor*>& local,
                   const EmbTensor* golden, SpareRows& spare) {
  const size_t W = cut.where.size();
  std::vector<DestBlock> b;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges(W);
  for (size_t s = 0; s < W; ++s) {
    b.push_back(unit_block(cut, int64_t(s), u));
    ranges[s] = b.back().ranges;
  }
  const DType dt = local[0]->dtype;  // the plan's data_type on every rank (read_batch checks)
  UnitRows out;
  if (sequence) {  // one buffer: the blocks are what d receives, in rank order
    size_t recv = 0;
    for (const DestBlock& bs : b) recv += size_t(bs.numel());
    out.recv.dtype = dt;
    out.recv.data =
        src.read_rows_concat(k, "local_embs", dt, ranges, out.recv_off, spare.take_one(recv));
    out.recv.shape = {out.recv_off.back() / std::max<int64_t>(1, b[0].row_elems), b[0].row_elems};
  } else {
    std::vector<size_t> need;
    for (const DestBlock& bs : b) need.push_back(size_t(bs.numel()));
    std::vector<std::vector<float>> rows =
        src.read_rows(k, "local_embs", dt, ranges, spare.take(need));
    for (size_t s = 0; s < W; ++s) out.blocks.push_back({dt, b[s].shape, std::move(rows[s])});
  }
  if (!golden) return out;
  std::vector<std::pair<int64_t, int64_t>> gr = whole_rows(*golden);
  std::vector<int64_t> shape = golden->shape;
  if (u.rows) {
    gr.clear();
    if (u.r1 > u.r0) gr.emplace_back(u.r0, u.r1);
    shape = {u.r1 - u.r0, golden->cols()};
  }
  const int64_t n = EmbTensor{golden->dtype, shape, {}}.numel();
  out.golden =
      EmbTensor{golden->dtype, shape,
                src.read_rows(k, u.d, "output", golden->dtype, gr, spare.take_one(size_t(n)))};
  return out;
}

// A rank split's units are done (RunContext::own_ranks = [lo, hi)): every process's troubles
// (`met`: this process's, in unit order) said in unit order as one process says them (the blocks
// are in rank order), each message once, and the lookup diff of each of this process's senders
// merged over every process's destinations.
void share_units(RunContext& rc, const BatchState& st, LookupChecks& looked,
                 std::vector<UnitTrouble> met, std::set<int64_t>& failed,
                 std::set<std::string>& said, std::pair<int64_t, int64_t> own) {
  UnitFindings found;
  found.troubles = std::move(met);
  for (int64_t s = 0; rc.source && s < st.W; ++s) {
    found.lookups.push_back(std::move(looked.diff(int(s))));
    found.comparable.push_back(looked.comparable(int(s)));
  }
  std::vector<UnitFindings> all;
  for (const std::string& b : rc.log.exchange('A', encode_units(found))) {
    try {
      all.push_back(decode_units(b));
    } catch (const Error& e) {
      rc.opt.team->abort(fmt::format("batch {}: {}", st.k, e.what()));
    }
  }
  for (const UnitFindings& f : all)
    for (const UnitTrouble& t : f.troubles) {
      if (t.stop) throw std::bad_alloc();  // as the one process's units stop there
      failed.insert(t.d);
      if (said.insert(t.message).second) rc.log.trouble(st.k, t.rank, t.stage, t.message);
    }
  for (int64_t s = own.first; rc.source && s < own.second; ++s) {
    TensorDiff d;
    bool comparable = true;
    for (UnitFindings& f : all) {
      merge_diff(d, std::move(f.lookups[size_t(s)]), rc.opt.max_mismatches);
      comparable = comparable && f.comparable[size_t(s)] != 0;
    }
    looked.adopt(int(s), std::move(d), comparable);
  }
}

// The checks of ranks [lo, hi) decided, in the whole batch's order: lookups by rank, then
// outputs by rank; those a failed destination was part of skipped.
void decide_checks(RunContext& rc, BatchState& st, LookupChecks& looked, OutputChecks& checks,
                   const std::set<int64_t>& failed, int64_t lo, int64_t hi) {
  const int64_t k = st.k;
  const std::string why =
      fmt::format("not every part of it could be checked: trouble in batch {} (destination {})", k,
                  failed.empty() ? 0 : *failed.begin());
  rc.log.split_phase(1);
  const auto decide_lookups = [&] {
    for (int64_t s = lo; rc.source && s < hi; ++s) {
      if (failed.empty())
        looked.decide(int(s));
      else
        rc.log.record(skipped(k, int(s), "lookup", "local_embs", why));
    }
  };
  if (!rc.own_ranks) {
    decide_lookups();
  } else {
    // A failed lookup is the cause every output check names (BatchState::lookup_bad): each
    // process must know whether any sender's failed, whoever decided it. A process whose lookup
    // decisions met trouble takes part in the exchange first (the others wait in it), then stops.
    std::exception_ptr stopped;
    try {
      decide_lookups();
    } catch (...) {
      stopped = std::current_exception();
    }
    for (const std::string& b : rc.log.exchange('L', st.lookup_bad ? "1" : "0"))
      st.lookup_bad = st.lookup_bad || b == "1";
    if (stopped) std::rethrow_exception(stopped);
  }
  rc.log.split_phase(2);
  for (int64_t d = lo; d < hi; ++d) {
    if (failed.count(d))
      checks.skip(int(d), why);
    else
      checks.decide(int(d), nullptr);
  }
}

}  // namespace

// The reads of a batch's units [0, n), in order and one at a time (the capture is read by one
// thread), each begun once the one before it is done: normally one in flight while a unit is
// checked. `after_last` runs once the last unit's read has begun and none is in flight.
class UnitReads {
 public:
  UnitReads(std::function<UnitRows(size_t)> read, size_t n, bool ahead,
            std::function<void()> after_last)
      : read_(std::move(read)), n_(n), ahead_(ahead), after_last_(std::move(after_last)) {
    begin();
  }
  // Reads ahead, one unit after another, while `waiting()` holds and the units read and the
  // next one together take at most `room` bytes (`bytes(i)`: unit i's).
  void read_while(const std::function<bool()>& waiting, double room,
                  const std::function<double(size_t)>& bytes) {
    double held = 0;
    while (waiting() && begun_ < n_) {
      reads_.back().wait();
      held += bytes(begun_ - 1);
      if (held + bytes(begun_) > room) break;
      begin();
    }
  }
  // The next unit's rows (nullopt and `unread` set: its read failed), and the read after it
  // begun when none is in flight, whether or not this one's could be read.
  std::optional<UnitRows> next(std::exception_ptr& unread) {
    std::future<UnitRows> mine = std::move(reads_.front());
    reads_.pop_front();
    std::optional<UnitRows> got;
    try {
      got = mine.get();
    } catch (...) {
      unread = std::current_exception();
    }
    using namespace std::chrono_literals;
    const bool idle = reads_.empty() || reads_.back().wait_for(0s) == std::future_status::ready;
    if (idle && reads_.size() < 2) begin();
    return got;
  }

 private:
  void begin() {
    if (begun_ < n_) {
      reads_.push_back(read_ahead_task(read_, begun_++, ahead_));
    } else if (!after_last_done_) {
      after_last_done_ = true;
      after_last_();
    }
  }
  std::function<UnitRows(size_t)> read_;
  size_t n_, begun_ = 0;
  bool ahead_, after_last_done_ = false;
  std::function<void()> after_last_;
  std::deque<std::future<UnitRows>> reads_;  // of units [checked, begun_)
};

// For each unit (a destination d, or some rows of it): the block of every sender (a part of its
// lookup check), the unit's output from those blocks alone and its part of d's output checks,
// while the next unit's rows are read on another thread. Decided in the whole batch's order:
// lookups by rank, then outputs by rank. Under a rank split (RunContext::own_ranks) only the units
// of this process's destinations run; their troubles and lookup diffs are exchanged with the
// other processes' before any check is decided, and this process decides its ranks' checks.
void run_destinations(RunContext& rc, BatchState& st, const DestinationCut& cut, BatchSource& src,
                      int64_t next_batch) {
  const int64_t W = st.W, k = st.k;
  const std::optional<std::pair<int64_t, int64_t>>& own = rc.own_ranks;
  const int64_t lo = own ? own->first : 0, hi = own ? own->second : W;
  std::vector<Unit> mine;  // a rank split's: the units of destinations [lo, hi)
  if (own)
    for (const Unit& u : cut.units)
      if (u.d >= lo && u.d < hi) mine.push_back(u);
  const std::vector<Unit>& units = own ? mine : cut.units;
  drop_bucketized(st);
  // A unit's blocks and its golden rows. Per batch: kept to the next one, they would sit beside
  // its input dist while it is derived, the replay's peak.
  SpareRows spare;
  spare.set_most(static_cast<size_t>(W) + 1);
  const auto read = [&, sequence = rc.seq_dist.has_value()](size_t i) {
    return read_unit(src, k, units[i], sequence, cut, st.cap_local, st.golden[size_t(units[i].d)],
                     spare);
  };
  const bool ahead = rc.opt.read_ahead > 0;  // --read-ahead 0: read, then check, in turn
  UnitReads reads(read, units.size(), ahead, [&] {
    if (ahead && next_batch >= 0) src.shapes_ahead(next_batch);  // once no unit is left
  });
  // While the backend is still starting (a GPU's context), units are read ahead instead of
  // waiting for it, up to a quarter of the memory budget and at most 512 MiB (what they add to
  // the peak of a batch run by destination, about two units' rows otherwise).
  if (ahead)
    reads.read_while(
        [&] { return !rc.backend.ready(); },
        std::min(512.0 * (1 << 20), double(memory_budget(rc.opt)) / 4),
        [&](size_t i) { return unit_bytes(cut, units[i], st.golden[size_t(units[i].d)]); });
  Backend& backend = rc.backend.get();
  spare.lend_to(dynamic_cast<HostLending*>(&backend));
  LookupChecks looked(rc, st);
  OutputChecks checks(rc, st);
  std::vector<LookupKjtIndex> index(static_cast<size_t>(W));  // [s]: of its lookup KJT
  for (int64_t s = 0; rc.source && s < W; ++s)
    index[size_t(s)] = lookup_kjt_index(st.der.ranks[size_t(s)].lookup_kjt);
  const auto run_unit = [&](size_t i) {
    const Unit& u = units[i];
    const int64_t d = u.d;
    rc.clock.enter("read", int(d));
    // This unit's rows, then the next unit's read begins if none is in flight (one at a time),
    // whether or not this one's could be read.
    std::exception_ptr unread;
    std::optional<UnitRows> got = reads.next(unread);
    if (unread) std::rethrow_exception(unread);
    UnitRows& rows = *got;
    const LentRows lent(spare, rows);
    for (int64_t s = 0; rc.source && s < W; ++s) {
      DestBlock some_rows;
      const DestBlock* b = &cut.where[size_t(s)][size_t(d)];
      if (u.rows) b = &(some_rows = unit_block(cut, s, u));
      const LookupKjt& lk = st.der.ranks[size_t(s)].lookup_kjt;
      const int64_t b0 = u.rows ? u.r0 : 0, b1 = u.rows ? u.r1 : INT64_MAX;
      // Most (s, d) pairs of a wide sequence batch carry nothing (d's few ids reach few
      // senders): an empty block of an empty piece adds nothing to s's diff.
      if (b->numel() == 0 && lookup_kjt_from_ids(lk, index[size_t(s)], d, b0, b1) == 0) continue;
      const LookupKjt part = lookup_kjt_from(lk, index[size_t(s)], d, b0, b1);
      looked.check(int(s),
                   TensorRef::span(rows.block(size_t(s)), b->numel(), st.cap_local[0]->dtype), part,
                   [b](int64_t e) { return b->to_whole(e); });
    }
    rc.clock.enter("output dist", int(d));
    const Tensor out = rows.blocks.empty()
                           ? sequence_destination_output(rc.plan, backend, rows.recv,
                                                         *st.used_ptr[size_t(d)], Place::kept)
                           : destination_output(rc.plan, backend, d, rows.blocks, st.used_ptr,
                                                cut.variable_batch, Place::kept);
    for (EmbTensor& b : rows.blocks) spare.give(std::move(b.data));
    if (!rows.recv.data.empty()) spare.give(std::move(rows.recv.data));
    const Kjt& kjt_d = st.batch().ranks[size_t(d)].kjt;
    const Kjt samples = u.rows ? kjt_samples(kjt_d, u.r0, u.r1) : Kjt{};
    const int64_t off = u.rows ? u.r0 * out.t.cols() : 0;  // out's first element in d's output
    OutputPart p;
    p.rank = int(d);
    p.out = &out;
    p.whole_shape = cut.shapes[size_t(d)];
    p.to_whole = [off](int64_t e) { return off + e; };
    p.golden = rows.golden ? &*rows.golden : nullptr;
    p.plan = &rc.plan;
    p.source = rc.source.get();
    p.kjt = u.rows ? &samples : &kjt_d;
    checks.check(p);
    if (rows.golden) spare.give(std::move(rows.golden->data));
  };
  // A unit that meets trouble (its rows cannot be read, an id outside its table) is reported and
  // the next one runs; the checks it was part of are skipped, never decided on part of their data.
  std::set<int64_t> failed;  // destinations
  std::set<std::string> said;
  std::vector<UnitTrouble> met;  // a rank split's: said once every process's are in
  const auto trouble = [&](int64_t d, int rank, const std::string& stage, const std::string& msg) {
    if (own) return met.push_back({d, rank, stage, msg, false});
    failed.insert(d);
    if (said.insert(msg).second) rc.log.trouble(k, rank, stage, msg);
  };
  for (size_t i = 0; i < units.size(); ++i) {
    const Unit& u = units[i];
    const int64_t d = u.d;
    try {
      run_unit(i);
    } catch (const CaptureError& e) {
      trouble(d, rank_of_h5path(e.h5path()), "capture", e.what());
    } catch (const Error& e) {
      trouble(d, rc.clock.rank(), rc.clock.report_stage(), e.what());
    } catch (const std::bad_alloc&) {
      if (!own) throw;
      // One process stops the batch here (guarded()): so does every process of the split, once
      // all of them know it.
      met.push_back({d, rc.clock.rank(), rc.clock.report_stage(), "", true});
      break;
    }
    if (i + 1 == units.size() || units[i + 1].d != d) rc.log.rank_done(k);
  }
  if (own) share_units(rc, st, looked, std::move(met), failed, said, *own);
  rc.note_latch(k);
  decide_checks(rc, st, looked, checks, failed, lo, hi);
}

}  // namespace dynemb::replay_detail
