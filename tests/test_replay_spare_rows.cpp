// SpareRows: the buffers a replay by destination hands from checked units to the next reads.
#include <doctest/doctest.h>

#include <set>
#include <vector>

#include "engine/backend.hpp"
#include "replay/spare_rows.hpp"

using dynemb::replay_detail::SpareRows;

namespace {
std::vector<float> with_capacity(size_t n) {
  std::vector<float> v;
  v.reserve(n);
  return v;
}
}  // namespace

TEST_CASE("SpareRows: the smallest spare that holds each need, else the largest") {
  SpareRows spare;
  spare.set_most(4);
  spare.give(with_capacity(100));
  spare.give(with_capacity(300));
  spare.give(with_capacity(200));
  std::vector<std::vector<float>> got = spare.take({150, 50, 1000, 10});
  REQUIRE(got.size() == 4);
  CHECK(got[0].capacity() == 200);  // the least that holds 150
  CHECK(got[1].capacity() == 100);  // the least that holds 50
  CHECK(got[2].capacity() == 300);  // none holds 1000: the largest left
  CHECK(got[3].capacity() == 0);    // none left
  CHECK(spare.take({1})[0].capacity() == 0);
}

TEST_CASE("SpareRows: holds at most `most`, kept until taken") {
  SpareRows spare;
  spare.set_most(2);
  for (size_t n : {10, 20, 30}) spare.give(with_capacity(n));
  spare.give(std::vector<float>{});  // nothing to keep
  std::vector<std::vector<float>> got = spare.take({1, 1, 1});
  CHECK(got[0].capacity() == 10);
  CHECK(got[1].capacity() == 20);
  CHECK(got[2].capacity() == 0);  // the third was not kept
  spare.give(with_capacity(40));
  spare.set_most(0);  // fewer allowed: the extra ones go
  CHECK(spare.take_one(1).capacity() == 0);
}

namespace {

// A backend's lending that only records what is lent to it.
class LendingBackend final : public dynemb::HostLending {
 public:
  bool lend(void* p, size_t bytes) override {
    if (bytes < 64) return false;  // as a GPU declines what is too small to pin
    lent.insert(p);
    pinned.insert(p);
    return true;
  }
  void unlend(void* p) override { lent.erase(p); }
  void forget(void* p) override {
    CHECK(lent.count(p) == 0);  // never unpinned while a read of it may be pending
    pinned.erase(p);
  }
  std::set<void*> lent, pinned;
};

}  // namespace

// The lending protocol of a replay by destination: a unit's buffers are lent while its checks
// read them and unlent before the reader may write them again; a buffer is pinned once however
// often it comes back, and unpinned before it is freed: dropped, or when the batch ends.
TEST_CASE("SpareRows: buffers lent while read, unlent when given back, unpinned before freed") {
  LendingBackend backend;
  {
    SpareRows spare;
    spare.set_most(2);
    spare.lend_to(&backend);
    std::vector<float> a = with_capacity(100), b = with_capacity(200), tiny = with_capacity(4);
    void* pa = a.data();
    void* pb = b.data();
    spare.lend(a);
    spare.lend(b);
    spare.lend(tiny);  // declined: never lent, never forgotten
    CHECK(backend.lent == std::set<void*>{pa, pb});
    spare.give(std::move(a));  // no longer read: unlent, still pinned
    CHECK(backend.lent == std::set<void*>{pb});
    CHECK(backend.pinned == std::set<void*>{pa, pb});
    // Taken by the reader, written, lent again: the same pinning.
    std::vector<float> again = spare.take_one(50);
    CHECK(again.data() == pa);
    spare.lend(again);
    CHECK(backend.lent == std::set<void*>{pa, pb});
    // A check that threw: what was not given back is unlent on the way out.
    spare.unlend_all();
    CHECK(backend.lent.empty());
    spare.give(std::move(again));
    spare.give(std::move(b));
    // A third buffer finds the spare full: unpinned as it goes.
    std::vector<float> c = with_capacity(300);
    spare.lend(c);
    spare.give(std::move(c));
    CHECK(backend.pinned == std::set<void*>{pa, pb});
    CHECK(backend.lent.empty());
    // Too small for the next read: made anew with room for later ones of about its size, so
    // that a pinned buffer is not grown (and pinned again) unit after unit.
    std::vector<float> grown = spare.take_one(1000);
    CHECK(grown.capacity() >= 1250);
    CHECK(grown.data() != pb);
    spare.give(std::move(grown));
  }
  CHECK(backend.pinned.empty());  // the batch's end: every pinning undone
  CHECK(backend.lent.empty());
}
