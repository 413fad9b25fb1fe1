#include "replay/team.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/error.hpp"

namespace dynemb {

std::vector<int64_t> team_share(const std::vector<int64_t>& batches, int q, int P) {
  // Block q is [ceil(q n / P), ceil((q + 1) n / P)): process 0's is never empty when n >= 1.
  const int64_t n = int64_t(batches.size());
  const auto start = [&](int64_t i) { return (i * n + P - 1) / P; };
  return {batches.begin() + start(q), batches.begin() + start(q + 1)};
}

std::pair<int64_t, int64_t> rank_block(int64_t W, int q, int P) {
  // 64-bit: W * P stays far below 2^63 for any W and P a launcher starts.
  const auto start = [&](int64_t i) { return i * W / P; };
  return {start(q), start(q + 1)};
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

namespace {

constexpr uint32_t kSplitMagic = 0x54494c53;  // "SLIT"
constexpr uint32_t kUnitsMagic = 0x53544e55;  // "UNTS"

}  // namespace

std::string encode_split(const SplitFindings& f) {
  Writer w;
  w.pod<uint32_t>(kSplitMagic);
  w.pod<uint64_t>(f.records.size());
  for (const SplitRecord& r : f.records) {
    w.pod<int32_t>(r.phase);
    put_check(w, r.check);
  }
  w.pod<uint8_t>(f.stop.set);
  w.pod<uint8_t>(f.stop.fatal);
  w.pod<int32_t>(f.stop.phase);
  w.pod<int32_t>(f.stop.rank);
  w.str(f.stop.stage);
  w.str(f.stop.message);
  w.str(f.fatal);
  return w.take();
}

SplitFindings decode_split(const std::string& bytes) {
  Reader r(bytes);
  if (r.pod<uint32_t>() != kSplitMagic)
    throw Error("a process's findings of a batch do not begin as they should");
  SplitFindings f;
  f.records.resize(r.pod<uint64_t>());
  for (SplitRecord& x : f.records) {
    x.phase = r.pod<int32_t>();
    x.check = get_check(r);
  }
  f.stop.set = r.pod<uint8_t>() != 0;
  f.stop.fatal = r.pod<uint8_t>() != 0;
  f.stop.phase = r.pod<int32_t>();
  f.stop.rank = r.pod<int32_t>();
  f.stop.stage = r.str();
  f.stop.message = r.str();
  f.fatal = r.str();
  if (!r.done()) throw Error("a process's findings of a batch run on past their end");
  return f;
}

std::vector<SplitEvent> split_order(const std::vector<SplitFindings>& all) {
  int phases = 0;
  for (const SplitFindings& f : all) {
    for (const SplitRecord& r : f.records) phases = std::max(phases, r.phase + 1);
    if (f.stop.set) phases = std::max(phases, f.stop.phase + 1);
  }
  std::vector<SplitEvent> out;
  for (int p = 0; p < phases; ++p)
    for (const SplitFindings& f : all) {
      for (const SplitRecord& r : f.records)
        if (r.phase == p) out.push_back({&r.check, nullptr});
      if (f.stop.set && f.stop.phase == p) {
        out.push_back({nullptr, &f.stop});
        return out;
      }
    }
  return out;
}

std::string encode_units(const UnitFindings& f) {
  Writer w;
  w.pod<uint32_t>(kUnitsMagic);
  w.pod<uint64_t>(f.troubles.size());
  for (const UnitTrouble& t : f.troubles) {
    w.pod<int64_t>(t.d);
    w.pod<int32_t>(t.rank);
    w.str(t.stage);
    w.str(t.message);
    w.pod<uint8_t>(t.stop);
  }
  w.pod<uint64_t>(f.lookups.size());
  for (size_t s = 0; s < f.lookups.size(); ++s) {
    const TensorDiff& d = f.lookups[s];
    w.pod<uint8_t>(s < f.comparable.size() ? f.comparable[s] : 1);
    w.pod<uint8_t>(d.shape_ok);
    w.str(d.shape_note);
    w.pod<int64_t>(d.compared);
    w.pod<int64_t>(d.mismatches);
    w.pod<double>(d.max_abs_err);
    w.pod<double>(d.max_rel_err);
    w.pod<int64_t>(d.max_ulp);
    w.pod<uint64_t>(d.first.size());
    for (const ElementMismatch& m : d.first) {  // not located yet: no coordinates
      w.pod<int64_t>(m.flat);
      w.pod<float>(m.got);
      w.pod<float>(m.want);
    }
  }
  return w.take();
}

UnitFindings decode_units(const std::string& bytes) {
  Reader r(bytes);
  if (r.pod<uint32_t>() != kUnitsMagic)
    throw Error("a process's findings of its units do not begin as they should");
  UnitFindings f;
  f.troubles.resize(r.pod<uint64_t>());
  for (UnitTrouble& t : f.troubles) {
    t.d = r.pod<int64_t>();
    t.rank = r.pod<int32_t>();
    t.stage = r.str();
    t.message = r.str();
    t.stop = r.pod<uint8_t>() != 0;
  }
  const uint64_t W = r.pod<uint64_t>();
  f.lookups.resize(W);
  f.comparable.resize(W);
  for (uint64_t s = 0; s < W; ++s) {
    TensorDiff& d = f.lookups[s];
    f.comparable[s] = r.pod<uint8_t>();
    d.shape_ok = r.pod<uint8_t>() != 0;
    d.shape_note = r.str();
    d.compared = r.pod<int64_t>();
    d.mismatches = r.pod<int64_t>();
    d.max_abs_err = r.pod<double>();
    d.max_rel_err = r.pod<double>();
    d.max_ulp = r.pod<int64_t>();
    d.first.resize(r.pod<uint64_t>());
    for (ElementMismatch& m : d.first) {
      m.flat = r.pod<int64_t>();
      m.got = r.pod<float>();
      m.want = r.pod<float>();
    }
  }
  if (!r.done()) throw Error("a process's findings of its units run on past their end");
  return f;
}

}  // namespace dynemb
