#include "replay/team.hpp"

#include <fmt/format.h>

#include <cstring>

#include "common/error.hpp"

namespace dynemb {

std::vector<int64_t> team_share(const std::vector<int64_t>& batches, int q, int P) {
  // Block q is [ceil(q n / P), ceil((q + 1) n / P)): process 0's is never empty when n >= 1.
  const int64_t n = int64_t(batches.size());
  const auto start = [&](int64_t i) { return (i * n + P - 1) / P; };
  return {batches.begin() + start(q), batches.begin() + start(q + 1)};
}

namespace {

// Fixed-width little-endian fields and length-prefixed strings: both ends are the same binary.
class Writer {
 public:
  template <class T>
  void pod(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    s_.append(b, sizeof(T));
  }
  void str(const std::string& v) {
    pod<uint64_t>(v.size());
    s_ += v;
  }
  void opt(const std::optional<double>& v) {
    pod<uint8_t>(v.has_value());
    pod<double>(v.value_or(0));
  }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <class T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, s_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = pod<uint64_t>();
    need(n);
    std::string v = s_.substr(at_, n);
    at_ += n;
    return v;
  }
  std::optional<double> opt() {
    const bool has = pod<uint8_t>() != 0;
    const double v = pod<double>();
    return has ? std::optional<double>(v) : std::nullopt;
  }
  bool done() const { return at_ == s_.size(); }

 private:
  void need(uint64_t n) const {
    if (n > s_.size() - at_)
      throw Error(fmt::format("a worker's findings are cut short ({} bytes, {} more wanted at {})",
                              s_.size(), n, at_));
  }
  const std::string& s_;
  size_t at_ = 0;
};

constexpr uint32_t kMagic = 0x444d5446;  // "FTMD": the findings' first field

void put_check(Writer& w, const CheckResult& c) {
  w.pod<int64_t>(c.batch);
  w.pod<int32_t>(c.rank);
  w.str(c.stage);
  w.str(c.check);
  w.pod<uint8_t>(uint8_t(c.status));
  w.str(c.message);
  w.str(c.got_label);
  w.str(c.want_label);
  w.str(c.cause);
  w.pod<int64_t>(c.compared);
  w.pod<int64_t>(c.mismatches);
  w.opt(c.max_abs_err);
  w.opt(c.max_rel_err);
  w.pod<uint64_t>(c.details.size());
  for (const Detail& d : c.details) {
    w.pod<uint64_t>(d.where.size());
    for (const Coord& x : d.where) {
      w.str(x.key);
      w.pod<int64_t>(x.value);
      w.str(x.label);
    }
    w.str(d.got);
    w.str(d.want);
    w.str(d.note);
  }
}

CheckResult get_check(Reader& r) {
  CheckResult c;
  c.batch = r.pod<int64_t>();
  c.rank = r.pod<int32_t>();
  c.stage = r.str();
  c.check = r.str();
  c.status = CheckStatus(r.pod<uint8_t>());
  c.message = r.str();
  c.got_label = r.str();
  c.want_label = r.str();
  c.cause = r.str();
  c.compared = r.pod<int64_t>();
  c.mismatches = r.pod<int64_t>();
  c.max_abs_err = r.opt();
  c.max_rel_err = r.opt();
  c.details.resize(r.pod<uint64_t>());
  for (Detail& d : c.details) {
    d.where.resize(r.pod<uint64_t>());
    for (Coord& x : d.where) {
      x.key = r.str();
      x.value = r.pod<int64_t>();
      x.label = r.str();
    }
    d.got = r.str();
    d.want = r.str();
    d.note = r.str();
  }
  return c;
}

}  // namespace

std::string encode_findings(const Report& r, bool counted_passes) {
  Writer w;
  w.pod<uint32_t>(kMagic);
  uint64_t n = 0;
  for (auto it = r.listed_checks().begin(); it != r.listed_checks().end(); ++it) ++n;
  w.pod<uint64_t>(n);
  for (const CheckResult& c : r.listed_checks()) put_check(w, c);
  w.pod<uint64_t>(counted_passes ? r.pass_counts.size() : 0);
  if (counted_passes)
    for (const auto& [stage, count] : r.pass_counts) {
      w.str(stage);
      w.pod<int64_t>(count);
    }
  w.pod<uint64_t>(r.warnings.size());
  for (const std::string& s : r.warnings) w.str(s);
  w.str(r.trouble);
  return w.take();
}

Findings decode_findings(const std::string& bytes) {
  Reader r(bytes);
  if (r.pod<uint32_t>() != kMagic) throw Error("a worker's findings do not begin as they should");
  Findings f;
  f.checks.resize(r.pod<uint64_t>());
  for (CheckResult& c : f.checks) c = get_check(r);
  for (uint64_t i = r.pod<uint64_t>(); i > 0; --i) {
    std::string stage = r.str();
    f.pass_counts[stage] += r.pod<int64_t>();
  }
  f.warnings.resize(r.pod<uint64_t>());
  for (std::string& s : f.warnings) s = r.str();
  f.trouble = r.str();
  if (!r.done()) throw Error("a worker's findings run on past their end");
  return f;
}

}  // namespace dynemb
