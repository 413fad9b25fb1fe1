// merge_captures (merge.hpp): per-rank files as a live job writes them, merged into the capture
// they were split from; a missing or doubled rank refused before anything is written.
#include "capture/merge.hpp"

#include <doctest/doctest.h>
#include <hdf5.h>

#include <filesystem>

#include "common/error.hpp"
#include "test_capture_util.hpp"

using namespace dynemb;
using namespace dynemb::testcap;

namespace {

struct PerRank {
  TempDir dir;
  Plan plan =
      make_plan(ModuleKind::sequence, 2, {{"t0", 10, 4, DType::f32}, {"t1", 7, 4, DType::f32}});
  std::string whole = dir.file("whole.h5");
  std::vector<std::string> ranks;
  PerRank() {
    CaptureWriter w(whole, plan, 11);
    for (int64_t k = 0; k < 2; ++k)
      w.write_batch(make_batch(plan, k, {3, 2}, -1, IndexType::i64, false, 60 + k));
    w.commit();
    // rank<r>.h5: the capture less the other rank's groups, with the root attribute rank = r.
    for (int64_t r = 0; r < 2; ++r) {
      const std::string p = dir.file("rank" + std::to_string(r) + ".h5");
      std::filesystem::copy_file(whole, p);
      hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      REQUIRE(f >= 0);
      for (int64_t k = 0; k < 2; ++k) {
        const std::string other = "/batches/" + std::to_string(k) + "/rank" + std::to_string(1 - r);
        REQUIRE(H5Ldelete(f, other.c_str(), H5P_DEFAULT) >= 0);
      }
      hid_t sp = H5Screate(H5S_SCALAR);
      hid_t a = H5Acreate2(f, "rank", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
      REQUIRE(H5Awrite(a, H5T_NATIVE_INT64, &r) >= 0);
      H5Aclose(a);
      H5Sclose(sp);
      REQUIRE(H5Fclose(f) >= 0);
      ranks.push_back(p);
    }
  }
};

}  // namespace

TEST_CASE("merge_captures: the per-rank files make the capture they came from") {
  PerRank pr;
  MergeOptions opt;
  opt.inputs = {pr.ranks[1], pr.ranks[0]};  // any order
  opt.output = pr.dir.file("merged.h5");
  std::vector<std::string> notes;
  const MergeResult res =
      merge_captures(opt, [&](const std::string& note) { notes.push_back(note); });
  CHECK(res.files == 2);
  CHECK(res.num_batches == 2);
  CHECK(res.world_size == 2);
  REQUIRE(notes.size() == 2);
  CHECK(notes[0].rfind("merge: writing " + opt.output + ".tmp-", 0) == 0);
  CHECK(notes[1].empty());
  CaptureReader whole(pr.whole), merged(opt.output);
  CHECK(merged.oracle_seed() == std::optional<uint64_t>(11));
  CHECK(merged.plan_text() == whole.plan_text());
  for (int64_t k = 0; k < 2; ++k) {
    const Batch a = whole.read_batch(pr.plan, k), b = merged.read_batch(pr.plan, k);
    for (size_t r = 0; r < 2; ++r) {
      CHECK(a.ranks[r].kjt.values == b.ranks[r].kjt.values);
      CHECK(a.ranks[r].kjt.lengths == b.ranks[r].kjt.lengths);
      CHECK(a.ranks[r].local_embs->data == b.ranks[r].local_embs->data);
      CHECK(a.ranks[r].output->data == b.ranks[r].output->data);
      CHECK(a.ranks[r].ctx->input_splits == b.ranks[r].ctx->input_splits);
    }
  }
  // An existing OUT is replaced only with force.
  CHECK_THROWS_AS(merge_captures(opt), Error);
  opt.force = true;
  CHECK(merge_captures(opt).files == 2);
}

TEST_CASE("merge_captures: a missing or doubled rank is refused, nothing written") {
  PerRank pr;
  MergeOptions opt;
  opt.output = pr.dir.file("merged.h5");
  opt.inputs = {pr.ranks[0]};
  try {
    merge_captures(opt);
    FAIL("no error");
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()) == "merge: no file for rank 1 of world_size 2 (1 file(s) given)");
  }
  opt.inputs = {pr.ranks[0], pr.ranks[1], pr.ranks[0]};
  try {
    merge_captures(opt);
    FAIL("no error");
  } catch (const CaptureError& e) {
    CHECK(e.file() == pr.ranks[0]);
    CHECK(e.h5path() == "/");
    CHECK(e.message() == "rank 0 appears twice (also in " + pr.ranks[0] + ")");
  }
  CHECK(!file_exists(opt.output));
  std::size_t left = 0;
  for (const auto& e : std::filesystem::directory_iterator(pr.dir.path))
    left += e.path().filename().string().find(".tmp-") != std::string::npos;
  CHECK(left == 0);
}
