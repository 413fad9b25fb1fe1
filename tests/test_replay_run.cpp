// run_replay in-process on small synth captures: --batches parsing, a clean capture, a
// context defect written through CaptureWriter (verdict "context"), and a context the output
// dist cannot run with (a finding, exit 1, not trouble).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <future>
#include <string>

#include "capture/capture.hpp"
#include "common/error.hpp"
#include "engine/backend.hpp"
#include "replay/replay.hpp"
#include "synth/synth.hpp"

using namespace dynemb;

namespace {

std::string make_capture(const std::string& name) {
  const Plan plan = preset_plan("unit-seq-w2");
  SynthOptions opt = preset_workload("unit-seq-w2");
  opt.batches = 2;
  opt.seed = 11;
  synth_capture(plan, opt, name);
  return name;
}

// Copies `src` to `dst`, letting `edit(k, batch)` change each batch on the way.
template <class Edit>
void rewrite(const std::string& src, const std::string& dst, Edit edit) {
  CaptureReader in(src);
  const Plan plan = capture_plan(in);
  CaptureWriter out(dst, plan, in.oracle_seed());
  for (int64_t k = 0; k < in.num_batches(); ++k) {
    Batch b = in.read_batch(plan, k);
    edit(k, b);
    out.write_batch(b);
  }
  out.commit();
}

const CheckResult* find(const Report& r, const std::string& name) {
  auto it = std::find_if(r.checks.begin(), r.checks.end(),
                         [&](const CheckResult& c) { return c.name() == name; });
  return it == r.checks.end() ? nullptr : &*it;
}

}  // namespace

TEST_CASE("parse_batch_range") {
  CHECK(parse_batch_range("", 3) == std::vector<int64_t>{0, 1, 2});
  CHECK(parse_batch_range("0-3,7", 10) == std::vector<int64_t>{0, 1, 2, 3, 7});
  CHECK(parse_batch_range("2,1,2", 3) == std::vector<int64_t>{1, 2});
  CHECK(parse_batch_range("4-4", 5) == std::vector<int64_t>{4});
  for (const char* bad : {"a", "3-1", "10", "1,,2", "-1", "1-", "0-10"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_batch_range(bad, 10), doctest::Contains("--batches"), UsageError);
  }
}

TEST_CASE("run_replay: clean capture, then a planted context defect") {
  const std::string clean = make_capture("test_replay_run_clean.h5");
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  ReplayOptions opt;
  opt.capture_path = clean;
  int seen = 0;
  bool started = false;
  ReplayCallbacks cb;
  cb.on_start = [&](const Report& r) { started = r.info.module == "sequence"; };
  cb.on_check = [&](const CheckResult&) { ++seen; };
  const Report ok = run_replay(opt, *cpu, cb);
  CHECK(ok.trouble == "");
  CHECK(started);
  CHECK(ok.summary().exit_code == 0);
  CHECK(seen == int(ok.checks.size()));
  CHECK(ok.info.ctx_mode == "captured");
  CHECK(ok.info.tolerance == "exact");
  REQUIRE(find(ok, "batch1.rank1.output.golden"));
  CHECK(find(ok, "batch1.rank1.output.golden")->status == CheckStatus::pass);
  CHECK(find(ok, "batch1.rank1.output.reference")->status == CheckStatus::pass);

  SUBCASE("swapped output_splits: a context mismatch, outputs blamed on the context") {
    const std::string bad = "test_replay_run_splits.h5";
    int64_t a = 0, b = 0;
    rewrite(clean, bad, [&](int64_t k, Batch& batch) {
      if (k != 1) return;
      auto& os = *batch.ranks[0].ctx->output_splits;
      a = os[0];
      b = os[1];
      std::swap(os[0], os[1]);
    });
    REQUIRE(a != b);  // the swap must change something
    opt.capture_path = bad;
    const Report r = run_replay(opt, *cpu, {});
    CHECK(r.trouble == "");
    CHECK(r.summary().exit_code == 1);
    const CheckResult* c = find(r, "batch1.rank0.ctx.output_splits");
    REQUIRE(c);
    CHECK(c->status == CheckStatus::fail);
    CHECK(c->mismatches == 2);
    CHECK(c->details.at(0).got == std::to_string(b));
    CHECK(c->details.at(0).want == std::to_string(a));
    for (const CheckResult& x : r.checks) {
      if (x.stage == "output" && x.status == CheckStatus::fail) {
        CHECK(x.batch == 1);
        CHECK(x.cause == "context");
      }
      if (x.batch == 0) CHECK(x.status == CheckStatus::pass);
    }
    // --ctx derived: the defect is still reported; the outputs are right.
    opt.ctx_mode = CtxMode::derived;
    const Report d = run_replay(opt, *cpu, {});
    CHECK(d.summary().exit_code == 1);
    CHECK(d.summary().output_mismatches == 0);
    CHECK(d.summary().context_mismatches >= 1);
    std::remove(bad.c_str());
  }
  SUBCASE("a permute index out of range: the output dist cannot run, a finding not trouble") {
    const std::string bad = "test_replay_run_perm.h5";
    rewrite(clean, bad, [&](int64_t k, Batch& batch) {
      if (k == 0) (*batch.ranks[1].ctx->unbucketize_permute)[0] = 1 << 20;
    });
    opt.capture_path = bad;
    const Report r = run_replay(opt, *cpu, {});
    CHECK(r.trouble == "");
    CHECK(r.summary().exit_code == 1);
    CHECK(find(r, "batch0.rank1.ctx.unbucketize_permute.bijection")->status == CheckStatus::fail);
    const CheckResult* od = find(r, "batch0.rank1.ctx.output_dist");
    REQUIRE(od);
    CHECK(od->status == CheckStatus::fail);
    CHECK(od->message.find("unbucketize_permute") != std::string::npos);
    CHECK(find(r, "batch0.rank1.output.golden")->status == CheckStatus::skipped);
    // Batch 1 is replayed normally after the failure.
    CHECK(find(r, "batch1.rank1.output.golden")->status == CheckStatus::pass);
    std::remove(bad.c_str());
  }
  SUBCASE("trouble is reported in the report, not thrown") {
    opt.capture_path = "test_replay_run_missing.h5";
    const Report r = run_replay(opt, *cpu, {});
    CHECK(r.summary().exit_code == 2);
    CHECK(r.trouble.find("test_replay_run_missing.h5") != std::string::npos);
    opt.capture_path = clean;
    opt.write_output = clean;
    CHECK(run_replay(opt, *cpu, {}).trouble.find("that is the input capture") != std::string::npos);
  }
  std::remove(clean.c_str());
}

// A backend still being made on another thread (BackendStartup, backend.hpp; what a GPU replay
// starts while it opens the capture): the replay's report is the one of the backend made up
// front, name() and ready() do not wait for the making, get() does, and what the making threw is
// rethrown by every get() and is the run's trouble.
TEST_CASE("run_replay on a starting backend") {
  const std::string clean = make_capture("test_replay_run_starting.h5");
  ReplayOptions opt;
  opt.capture_path = clean;
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  const Report want = run_replay(opt, *cpu, {});
  REQUIRE(want.trouble == "");

  // The making waits until the test lets it go, after name() and ready() answered: a name()
  // that waited for it would never return.
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  BackendStartup starting("cpu", [released] {
    released.wait();
    return make_cpu_backend(1);
  });
  CHECK(starting.name() == "cpu");
  CHECK_FALSE(starting.ready());
  go.set_value();
  int checks = 0;
  ReplayCallbacks cb;
  std::string device_at_header;
  cb.on_start = [&](const Report& r) { device_at_header = r.info.device; };
  cb.on_check = [&](const CheckResult&) { ++checks; };
  const Report got = run_replay(opt, starting, cb);
  CHECK(starting.ready());
  CHECK(starting.get().name() == "cpu");
  CHECK(&starting.get() == &starting.get());  // made once
  CHECK(got.trouble == "");
  CHECK(got.info.device == want.info.device);
  CHECK(device_at_header == want.info.device);
  CHECK(checks == int(got.checks.size()));
  REQUIRE(got.checks.size() == want.checks.size());
  for (size_t i = 0; i < got.checks.size(); ++i) {
    CAPTURE(want.checks[i].name());
    CHECK(got.checks[i].name() == want.checks[i].name());
    CHECK(got.checks[i].status == want.checks[i].status);
    CHECK(got.checks[i].message == want.checks[i].message);
  }

  // Made already: ready at once, get() gives that very backend.
  BackendStartup borrowed(*cpu);
  CHECK(borrowed.ready());
  CHECK(borrowed.name() == "cpu");
  CHECK(&borrowed.get() == cpu.get());
  std::unique_ptr<Backend> owned = make_cpu_backend(1);
  Backend* owned_at = owned.get();
  BackendStartup made(std::move(owned));
  CHECK(made.ready());
  CHECK(&made.get() == owned_at);

  // A backend that cannot be made: every get() rethrows its error, and the run says it.
  BackendStartup broken(
      "cuda", []() -> std::unique_ptr<Backend> { throw DeviceError("CUDA device 0 is gone"); });
  CHECK(broken.name() == "cuda");
  CHECK_THROWS_WITH_AS(broken.get(), "CUDA device 0 is gone", DeviceError);
  CHECK_THROWS_WITH_AS(broken.get(), "CUDA device 0 is gone", DeviceError);
  const Report failed = run_replay(opt, broken, {});
  CHECK(failed.trouble.find("CUDA device 0 is gone") != std::string::npos);
  CHECK(failed.checks.empty());
  std::remove(clean.c_str());
}

// A CPU backend that keeps (make_cpu_backend(threads, true)): the replay's kept paths (lookups
// kept for the dist, captured local_embs kept as inputs, outputs kept and compared where they
// are) give the report of the host paths, check for check, whole or one destination at a time.
TEST_CASE("run_replay on a keeping CPU backend == on the host") {
  const std::string clean = make_capture("test_replay_run_keeping.h5");
  const std::string bad = "test_replay_run_keeping_bad.h5";
  rewrite(clean, bad, [&](int64_t k, Batch& batch) {
    if (k == 1) batch.ranks[0].output->data[3] += 1.0f;  // one golden element off
  });
  std::unique_ptr<Backend> host = make_cpu_backend(1);
  std::unique_ptr<Backend> keeping = make_cpu_backend(1, true);
  for (const std::string& cap : {clean, bad})
    for (const CtxMode mode : {CtxMode::captured, CtxMode::derived}) {
      CAPTURE(cap);
      CAPTURE(int(mode));
      ReplayOptions opt;
      opt.capture_path = cap;
      opt.ctx_mode = mode;
      const Report want = run_replay(opt, *host, {});
      const Report got = run_replay(opt, *keeping, {});
      REQUIRE(want.trouble == "");
      CHECK(got.trouble == "");
      CHECK(got.summary().exit_code == want.summary().exit_code);
      CHECK(want.summary().output_mismatches == (cap == bad ? 1 : 0));
      REQUIRE(got.checks.size() == want.checks.size());
      for (size_t i = 0; i < got.checks.size(); ++i) {
        CAPTURE(want.checks[i].name());
        CHECK(got.checks[i].name() == want.checks[i].name());
        CHECK(got.checks[i].status == want.checks[i].status);
        CHECK(got.checks[i].mismatches == want.checks[i].mismatches);
        CHECK(got.checks[i].message == want.checks[i].message);
      }
    }
  std::remove(bad.c_str());
  std::remove(clean.c_str());
}
