// Keep going after trouble (replayer.hpp): a rank-batch that cannot be read or replayed is an
// error check of its own, and the run goes on with the others (--fail-fast stops it instead).
#include <fmt/format.h>

#include "common/error.hpp"
#include "replay/replayer.hpp"

namespace dynemb::replay_detail {

namespace {

// "/batches/3/rank1/ctx/x" -> 1; -1 when the path names no rank.
int rank_in(const std::string& text) {
  const size_t at = text.find("/rank");
  if (at == std::string::npos) return -1;
  size_t i = at + 5, n = 0;
  int r = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9' && n < 9) {
    r = r * 10 + (text[i] - '0');
    ++i;
    ++n;
  }
  return n == 0 ? -1 : r;
}

}  // namespace

void Replayer::record_trouble(int64_t k, int rank, const std::string& stage,
                              const std::string& msg) {
  if (opt_.fail_fast) throw Error(msg);
  if (troubles_++ == 0) first_trouble_batch_ = k;
  CheckResult c;
  c.batch = k;
  c.rank = rank >= 0 ? rank : rank_in(msg);
  c.stage = stage;
  c.check = "trouble";
  c.status = CheckStatus::error;
  c.message = msg;
  emit(std::move(c));
}

std::optional<Batch> Replayer::read_batch_keeping_going(const CaptureReader& reader, int64_t k) {
  const auto oom = [&](const std::string& what, int rank) {
    return fmt::format("{}:/batches/{}{}: {} while reading {}", opt_.capture_path, k,
                       rank >= 0 ? fmt::format("/rank{}", rank) : std::string(),
                       out_of_memory_text(), what);
  };
  try {
    return reader.read_batch(read_plan(), k);
  } catch (const Error&) {
    if (opt_.fail_fast) throw;
  } catch (const std::bad_alloc&) {
    if (opt_.fail_fast) throw Error(oom("the batch", -1));
  }
  // Something of batch k is unreadable: the KJTs of every rank are needed (the input dist is
  // an all-to-all), the optional parts are tried rank by rank.
  ReadParts kjt_only;
  kjt_only.ctx = kjt_only.local_embs = kjt_only.output = false;
  try {
    reader.read_batch(read_plan(), k, kjt_only);
  } catch (const Error& e) {
    record_trouble(k, -1, "capture", e.what());
    return std::nullopt;
  } catch (const std::bad_alloc&) {
    record_trouble(k, -1, "capture", oom("the KJTs", -1));
    return std::nullopt;
  }
  const size_t W = size_t(read_plan().world_size);
  ReadParts good;
  good.ranks.assign(W, 1);
  for (size_t r = 0; r < W; ++r) {
    ReadParts one;
    one.ranks.assign(W, 0);
    one.ranks[r] = 1;
    try {
      reader.read_batch(read_plan(), k, one);
      continue;
    } catch (const Error& e) {
      record_trouble(k, int(r), "capture",
                     std::string(e.what()) +
                         " (this rank's ctx/, local_embs and output are left out of the replay)");
    } catch (const std::bad_alloc&) {
      record_trouble(k, int(r), "capture", oom("ctx/, local_embs and output", int(r)));
    }
    good.ranks[r] = 0;
  }
  try {
    return reader.read_batch(read_plan(), k, good);
  } catch (const Error& e) {
    record_trouble(k, -1, "capture", e.what());
  } catch (const std::bad_alloc&) {
    record_trouble(k, -1, "capture", oom("the batch", -1));
  }
  return std::nullopt;
}

}  // namespace dynemb::replay_detail
