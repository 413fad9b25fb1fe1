// The replay's team (replay/team.hpp) without MPI: the batches' split, the findings' bytes, and
// P run_replay calls on threads joined by an in-memory team, whose process 0 report is the
// one-process report and whose progress counts every process's rank-batches.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "engine/backend.hpp"
#include "replay/replay.hpp"
#include "synth/synth.hpp"

using namespace dynemb;

TEST_CASE("team_share: contiguous blocks, process 0's first and never empty") {
  const std::vector<int64_t> two{0, 1}, five{0, 1, 2, 3, 4}, none;
  CHECK(team_share(two, 0, 3) == std::vector<int64_t>{0});
  CHECK(team_share(two, 1, 3) == std::vector<int64_t>{1});
  CHECK(team_share(two, 2, 3).empty());
  CHECK(team_share(five, 0, 2) == std::vector<int64_t>{0, 1, 2});
  CHECK(team_share(five, 1, 2) == std::vector<int64_t>{3, 4});
  CHECK(team_share(none, 0, 4).empty());
  const std::vector<int64_t> odd{3, 7, 9};
  CHECK(team_share(odd, 0, 1) == odd);
}

TEST_CASE("findings: every field of a check, the counted passes, warnings and trouble come back") {
  Report r;
  CheckResult c;
  c.batch = 4;
  c.rank = 3;
  c.stage = "output";
  c.check = "golden";
  c.status = CheckStatus::fail;
  c.message = "1 of 64 elements differ";
  c.got_label = "replayed";
  c.want_label = "golden";
  c.cause = "data (golden output)";
  c.compared = 64;
  c.mismatches = 1;
  c.max_abs_err = 0.25;
  c.details.push_back({Coords{{"feature", 1, "f1"}, {"column", 5, ""}}, "1.5", "1.25", "note"});
  r.checks.push_back(c);
  r.pass_counts["ctx"] = 7;
  r.warnings = {"w1", "w2"};
  r.trouble = "stopped";
  const Findings f = decode_findings(encode_findings(r, true));
  REQUIRE(f.checks.size() == 1);
  const CheckResult& d = f.checks[0];
  CHECK(d.name() == c.name());
  CHECK(d.status == c.status);
  CHECK(d.message == c.message);
  CHECK(d.cause == c.cause);
  CHECK(d.got_label == "replayed");
  CHECK(d.compared == 64);
  CHECK(d.max_abs_err == 0.25);
  CHECK(!d.max_rel_err.has_value());
  REQUIRE(d.details.size() == 1);
  CHECK(to_string(d.details[0].where) == to_string(c.details[0].where));
  CHECK(d.details[0].note == "note");
  CHECK(f.pass_counts.at("ctx") == 7);
  CHECK(f.warnings == r.warnings);
  CHECK(f.trouble == "stopped");
  CHECK(decode_findings(encode_findings(r, false)).pass_counts.empty());
  std::string cut = encode_findings(r, true);
  cut.resize(cut.size() - 3);
  CHECK_THROWS_AS(decode_findings(cut), Error);
}

TEST_CASE("rank_block: contiguous blocks of the W ranks, empty ones when W < P") {
  using B = std::pair<int64_t, int64_t>;
  CHECK(rank_block(512, 0, 2) == B{0, 256});
  CHECK(rank_block(512, 1, 2) == B{256, 512});
  CHECK(rank_block(512, 0, 3) == B{0, 170});
  CHECK(rank_block(512, 1, 3) == B{170, 341});
  CHECK(rank_block(512, 2, 3) == B{341, 512});
  CHECK(rank_block(2, 0, 3) == B{0, 0});
  CHECK(rank_block(2, 1, 3) == B{0, 1});
  CHECK(rank_block(2, 2, 3) == B{1, 2});
  // 64-bit: q W overflows 32 bits here.
  CHECK(rank_block(int64_t(3) << 31, 1, 2) == B{int64_t(3) << 30, int64_t(3) << 31});
  for (int P : {1, 2, 3, 7})
    for (int64_t W : {1, 5, 8, 512}) {
      int64_t at = 0;
      for (int q = 0; q < P; ++q) {
        const B b = rank_block(W, q, P);
        CHECK(b.first == at);
        CHECK(b.second >= b.first);
        at = b.second;
      }
      CHECK(at == W);
    }
}

namespace {

CheckResult named(int64_t k, int rank, const std::string& check) {
  CheckResult c;
  c.batch = k;
  c.rank = rank;
  c.stage = "output";
  c.check = check;
  return c;
}

std::vector<std::string> names(const std::vector<SplitEvent>& ev) {
  std::vector<std::string> out;
  for (const SplitEvent& e : ev)
    out.push_back(e.check ? fmt::format("{}:{}", e.check->check, e.check->rank)
                          : "stop:" + e.stop->message);
  return out;
}

}  // namespace

TEST_CASE("split_order: by phase, then process, then record order; nothing after a stop") {
  // Process 0 holds the batch-level phase 0 and ranks 0-1, process 1 ranks 2-3.
  std::vector<SplitFindings> all(2);
  all[0].records = {{0, named(3, -1, "ctx")},   {0, named(3, 1, "latch")},
                    {1, named(3, 0, "lookup")}, {1, named(3, 1, "lookup")},
                    {2, named(3, 0, "golden")}, {2, named(3, 1, "golden")}};
  all[1].records = {{1, named(3, 2, "lookup")},
                    {1, named(3, 3, "lookup")},
                    {2, named(3, 2, "golden")},
                    {2, named(3, 3, "golden")}};
  // Through the bytes the processes exchange.
  for (SplitFindings& f : all) f = decode_split(encode_split(f));
  CHECK(names(split_order(all)) ==
        std::vector<std::string>{"ctx:-1", "latch:1", "lookup:0", "lookup:1", "lookup:2",
                                 "lookup:3", "golden:0", "golden:1", "golden:2", "golden:3"});
  // Process 1 stopped in phase 1 after rank 2's lookup: what process 0 decided later (phase 2)
  // is not said, as one process would not have decided it.
  all[1].records.resize(1);
  all[1].stop.set = true;
  all[1].stop.phase = 1;
  all[1].stop.message = "id out of range";
  all[1].fatal = "";
  all[1] = decode_split(encode_split(all[1]));
  CHECK(names(split_order(all)) == std::vector<std::string>{"ctx:-1", "latch:1", "lookup:0",
                                                            "lookup:1", "lookup:2",
                                                            "stop:id out of range"});
  std::string cut = encode_split(all[1]);
  cut.pop_back();
  CHECK_THROWS_AS(decode_split(cut), Error);
}

TEST_CASE("units: troubles and every sender's partial lookup diff come back") {
  UnitFindings f;
  f.troubles.push_back({300, 4, "capture", "no such dataset", false});
  f.troubles.push_back({301, -1, "lookup", "", true});
  TensorDiff d;
  d.compared = 12;
  d.mismatches = 2;
  d.max_abs_err = 0.5;
  d.max_ulp = 9;
  d.first.push_back({7, {}, 1.5f, 1.0f});
  f.lookups = {TensorDiff(), d};
  f.comparable = {1, 0};
  const UnitFindings g = decode_units(encode_units(f));
  REQUIRE(g.troubles.size() == 2);
  CHECK(g.troubles[0].d == 300);
  CHECK(g.troubles[0].rank == 4);
  CHECK(g.troubles[0].message == "no such dataset");
  CHECK(g.troubles[1].stop);
  REQUIRE(g.lookups.size() == 2);
  CHECK(g.comparable == std::vector<uint8_t>{1, 0});
  CHECK(g.lookups[1].mismatches == 2);
  CHECK(g.lookups[1].max_ulp == 9);
  REQUIRE(g.lookups[1].first.size() == 1);
  CHECK(g.lookups[1].first[0].flat == 7);
  CHECK(g.lookups[1].first[0].got == 1.5f);
}

namespace {

// Messages between threads, by (to, from, tag).
class Hub {
 public:
  void put(int to, int from, int tag, std::string s) {
    std::lock_guard<std::mutex> l(m_);
    box_[{to, from, tag}].push_back(std::move(s));
    cv_.notify_all();
  }
  bool take(int to, int from, int tag, std::string& out, bool wait) {
    std::unique_lock<std::mutex> l(m_);
    auto& q = box_[{to, from, tag}];
    if (wait) cv_.wait(l, [&] { return !q.empty(); });
    if (q.empty()) return false;
    out = std::move(q.front());
    q.pop_front();
    return true;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, int>, std::deque<std::string>> box_;
};

class ThreadTeam final : public ReplayTeam {
 public:
  ThreadTeam(Hub& hub, int q, int P) : hub_(hub), q_(q), P_(P) {}
  int index() const override { return q_; }
  int size() const override { return P_; }
  int host_size() const override { return P_; }  // every thread on this one host
  void send_progress(int64_t k, bool whole) override {
    hub_.put(0, q_, 1, std::to_string(k) + (whole ? " 1" : " 0"));
  }
  void poll_progress(const ProgressFn& fn) override {
    std::string s;
    for (int from = 1; from < P_; ++from)
      while (hub_.take(0, from, 1, s, false)) {
        long long k = 0;
        int whole = 0;
        std::sscanf(s.c_str(), "%lld %d", &k, &whole);
        if (fn) fn(k, whole != 0);
      }
  }
  void send_result(const std::string& b) override { hub_.put(0, q_, 2, b); }
  std::string receive_result(int q, const ProgressFn& fn) override {
    std::string s;
    for (;;) {
      poll_progress(fn);
      if (hub_.take(0, q, 2, s, false)) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void send_carry(const std::string& b) override { hub_.put(q_ + 1, q_, 3, b); }
  std::string receive_carry() override {
    std::string s;
    hub_.take(q_, q_ - 1, 3, s, true);
    return s;
  }
  std::vector<std::string> allgather(const std::string& b, const ProgressFn& fn) override {
    for (int to = 0; to < P_; ++to)
      if (to != q_) hub_.put(to, q_, 4, b);
    std::vector<std::string> all(static_cast<size_t>(P_));
    all[size_t(q_)] = b;
    for (int from = 0; from < P_; ++from)
      while (from != q_ && !hub_.take(q_, from, 4, all[size_t(from)], false)) {
        if (q_ == 0) poll_progress(fn);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    return all;
  }
  void broadcast(std::string& b) override {
    if (q_ == 0)
      for (int to = 1; to < P_; ++to) hub_.put(to, 0, 5, b);
    else
      hub_.take(q_, 0, 5, b, true);
  }
  [[noreturn]] void abort(const std::string& why) override {
    std::fprintf(stderr, "ThreadTeam abort: %s\n", why.c_str());
    std::abort();
  }

 private:
  Hub& hub_;
  int q_, P_;
};

}  // namespace

// P processes on threads, each with its own backend, joined by a ThreadTeam: process 0's JSON
// report, and its last progress.
std::pair<std::string, ReplayProgress> run_team(const ReplayOptions& opt, int P, int64_t& calls) {
  Hub hub;
  std::vector<Report> reps(static_cast<size_t>(P));
  ReplayProgress last;
  std::vector<std::thread> threads;
  for (int q = 0; q < P; ++q)
    threads.emplace_back([&, q] {
      ReplayOptions o = opt;
      o.team = std::make_shared<ThreadTeam>(hub, q, P);
      ReplayCallbacks cb;
      if (q == 0)
        cb.on_progress = [&](const ReplayProgress& p) {
          last = p;
          ++calls;
        };
      auto b = make_cpu_backend(1);
      reps[size_t(q)] = run_replay(o, *b, cb);
    });
  for (std::thread& t : threads) t.join();
  return {json_report(reps[0]), last};
}

TEST_CASE("P replays joined by a team: process 0's report is the one-process report") {
  const std::string path = "test_replay_team_vbe.h5";
  const Plan plan = preset_plan("unit-pooled-w8");
  SynthOptions so = preset_workload("unit-pooled-w8");
  so.batches = 5;
  so.batch_sizes = {4};
  so.vbe = true;
  so.seed = 5;
  synth_capture(plan, so, path);
  ReplayOptions opt;
  opt.capture_path = path;
  opt.passes = PassMode::compact;
  auto backend = make_cpu_backend(1);
  const Report one = run_replay(opt, *backend);
  REQUIRE(one.trouble.empty());
  const std::string want = json_report(one);
  CHECK(want.find("1 matches the mode latched at batch 0") != std::string::npos);

  // 2 and 3 processes split the 5 batches; 6 split each batch by destination rank blocks.
  for (int P : {2, 3, 6}) {
    CAPTURE(P);
    int64_t calls = 0;
    const auto [json, last] = run_team(opt, P, calls);
    CHECK(json == want);
    CHECK(last.batches_done == 5);
    CHECK(last.rank_batches_done == 5 * 8);
    CHECK(last.rank_batches_done == last.rank_batches_total);
    CHECK(last.bytes_done == doctest::Approx(last.bytes_total));
    CHECK(calls >= 5);
  }
  std::remove(path.c_str());
}

TEST_CASE("a batch split by destination rank blocks: the one-process report, every pass mode") {
  const std::string path = "test_replay_team_seq.h5";
  const Plan plan = preset_plan("unit-seq-w8");
  SynthOptions so = preset_workload("unit-seq-w8");
  so.batches = 2;
  so.batch_sizes = {4};
  so.seed = 9;
  synth_capture(plan, so, path);
  ReplayOptions opt;
  opt.capture_path = path;
  opt.batches = "1";
  for (PassMode mode : {PassMode::compact, PassMode::counted, PassMode::whole}) {
    CAPTURE(int(mode));
    opt.passes = mode;
    auto backend = make_cpu_backend(1);
    const Report one = run_replay(opt, *backend);
    REQUIRE(one.trouble.empty());
    for (int P : {2, 3, 11}) {  // 11: more processes than ranks, some own none
      CAPTURE(P);
      int64_t calls = 0;
      const auto [json, last] = run_team(opt, P, calls);
      CHECK(json == json_report(one));
      CHECK(last.batches_done == 1);
      CHECK(last.rank_batches_done == 8);
    }
  }
  std::remove(path.c_str());
}

TEST_CASE("the lockstep split: every process replays every batch whole, the one-process report") {
  // Pooled VBE (the latch) and sequence, 3 batches; every pass mode; 2 and 3 processes, and 11
  // (more processes than ranks: some own none). Each process's checks are only its ranks', so a
  // report equal to one process's has every rank's once, in the one-process order.
  const std::string path = "test_replay_team_lockstep.h5";
  for (const char* preset : {"unit-pooled-w8", "unit-seq-w8"}) {
    CAPTURE(preset);
    const Plan plan = preset_plan(preset);
    SynthOptions so = preset_workload(preset);
    so.batches = 3;
    so.batch_sizes = {4};
    so.vbe = plan.module == ModuleKind::pooled;
    so.seed = 13;
    synth_capture(plan, so, path);
    ReplayOptions opt;
    opt.capture_path = path;
    for (PassMode mode : {PassMode::compact, PassMode::counted, PassMode::whole}) {
      CAPTURE(int(mode));
      opt.passes = mode;
      opt.team_split = TeamSplit::automatic;
      auto backend = make_cpu_backend(1);
      const Report one = run_replay(opt, *backend);
      REQUIRE(one.trouble.empty());
      opt.team_split = TeamSplit::lockstep;
      for (int P : {2, 3, 11}) {
        CAPTURE(P);
        int64_t calls = 0;
        const auto [json, last] = run_team(opt, P, calls);
        CHECK(json == json_report(one));
        CHECK(last.batches_done == 3);
        CHECK(last.rank_batches_done == 3 * 8);
      }
    }
  }
  std::remove(path.c_str());
}
