#include "replay/pass_log.hpp"

#include "replay/report.hpp"

namespace dynemb {

bool PassLog::fits(const CheckResult& c) {
  return c.status == CheckStatus::pass && c.details.empty() && c.mismatches == 0;
}

uint32_t PassLog::intern(const std::string& s) {
  const auto [it, added] = index_.emplace(s, static_cast<uint32_t>(strings_.size()));
  if (added) strings_.push_back(s);
  return it->second;
}

void PassLog::add(const CheckResult& c, size_t before) {
  Record r;
  r.batch = c.batch;
  r.compared = c.compared;
  r.before = before;
  r.rank = c.rank;
  r.stage = intern(c.stage);
  r.check = intern(c.check);
  r.message = intern(c.message);
  r.got = intern(c.got_label);
  r.want = intern(c.want_label);
  r.cause = intern(c.cause);
  r.has_abs = c.max_abs_err.has_value();
  r.has_rel = c.max_rel_err.has_value();
  if (r.has_abs) r.max_abs = *c.max_abs_err;
  if (r.has_rel) r.max_rel = *c.max_rel_err;
  records_.push_back(r);
}

CheckResult PassLog::at(size_t i) const {
  const Record& r = records_[i];
  CheckResult c;
  c.batch = r.batch;
  c.rank = r.rank;
  c.stage = strings_[r.stage];
  c.check = strings_[r.check];
  c.status = CheckStatus::pass;
  c.message = strings_[r.message];
  c.got_label = strings_[r.got];
  c.want_label = strings_[r.want];
  c.cause = strings_[r.cause];
  c.compared = r.compared;
  if (r.has_abs) c.max_abs_err = r.max_abs;
  if (r.has_rel) c.max_rel_err = r.max_rel;
  return c;
}

}  // namespace dynemb
