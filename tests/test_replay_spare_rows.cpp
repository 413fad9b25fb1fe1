// SpareRows: the buffers a replay by destination hands from checked units to the next reads.
#include <doctest/doctest.h>

#include <vector>

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
