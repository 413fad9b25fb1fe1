// Checks that passed, kept compactly for the reports that list every check (--json, --junit).
// A replay passes dozens of checks a batch, and a CheckResult costs several hundred bytes (six
// strings, the optionals, the details vector): kept whole, they grew the replay's memory with
// every batch. A pass has no details, no mismatches, and its strings come from a small set
// (stage, check, labels, cause, and messages that repeat), so each is a record of 72 bytes
// whose strings are interned.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace dynemb {

struct CheckResult;

class PassLog {
 public:
  // Whether `c` can be kept here: a pass without details (its CheckResult comes back equal).
  static bool fits(const CheckResult& c);
  // Keeps `c` (fits(c)), decided after the first `before` entries of Report::checks.
  void add(const CheckResult& c, size_t before);
  size_t size() const { return records_.size(); }
  size_t before(size_t i) const { return static_cast<size_t>(records_[i].before); }
  CheckResult at(size_t i) const;  // the check as it was added

 private:
  struct Record {
    int64_t batch = -1, compared = 0;
    uint64_t before = 0;
    double max_abs = 0, max_rel = 0;
    int32_t rank = -1;
    uint32_t stage = 0, check = 0, message = 0, got = 0, want = 0, cause = 0;
    bool has_abs = false, has_rel = false;
  };
  uint32_t intern(const std::string& s);
  std::vector<Record> records_;
  std::vector<std::string> strings_;
  std::unordered_map<std::string, uint32_t> index_;
};

}  // namespace dynemb
