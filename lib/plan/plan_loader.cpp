// Plan loader and static checks (docs/plan-format.md).
//
// yaml-cpp's node API keeps no duplicate keys and loses marks of map keys, so the YAML is read
// through YAML::Parser events into a small tree of our own that keeps, for every node and
// every map key, its 1-based line:col. Three passes:
//   1. build the tree: syntax errors, duplicate keys, nesting depth and size caps;
//   2. schema: unknown / missing keys, types, ranges, enums -> Plan fields;
//   3. semantics: unique names, sequence dims, shards vs the ceil rule, dtypes, sizes.
// Every finding names file:line:col of the token at fault.
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/mark.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <unordered_map>

#include "common/input_file.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// ------------------------------------------------------------------ Diagnostic

static const char* severity_name(Severity s) {
  switch (s) {
    case Severity::error:
      return "error";
    case Severity::warning:
      return "warning";
    case Severity::note:
      return "note";
  }
  return "?";
}

std::string Diagnostic::str() const {
  std::string s = loc.str() + ": " + severity_name(severity) + ": ";
  if (!path.empty()) s += path + ": ";
  return s + message;
}

bool PlanLoadResult::ok() const {
  for (const Diagnostic& d : findings)
    if (d.severity == Severity::error) return false;
  return plan.has_value();
}

namespace {

// Hostile input caps: plans are a few KiB; these keep a crafted file from exhausting the
// stack (yaml-cpp recurses per nesting level) or memory.
constexpr int kMaxDepth = 64;
constexpr size_t kMaxTextBytes = size_t{16} << 20;
constexpr size_t kMaxNodes = size_t{1} << 20;
constexpr size_t kMaxFindings = 1000;  // like GCC's -fmax-errors, for a hostile file
constexpr int64_t kMaxWorldSize = 65536;
constexpr int64_t kMaxEmbeddingDim = int64_t{1} << 20;

// ------------------------------------------------------------------ YAML tree with marks

struct YNode;
using NodeP = std::shared_ptr<YNode>;

struct YEntry {
  std::string key;
  int line = 0, col = 0;  // of the key token
  NodeP value;
};

struct YNode {
  enum class Kind { null, scalar, seq, map } kind = Kind::null;
  int line = 0, col = 0;  // 1-based, first character of the node's token
  std::string value;      // scalar text
  bool quoted = false;    // '...' / "..." / block scalar: a string, never a number
  bool complete = false;  // its end event was seen (guards aliases to an open ancestor)
  std::vector<NodeP> items;
  std::vector<YEntry> entries;
  const YEntry* find(const std::string& k) const {
    for (const YEntry& e : entries)
      if (e.key == k) return &e;
    return nullptr;
  }
};

const char* kind_name(const YNode& n) {
  switch (n.kind) {
    case YNode::Kind::null:
      return "null (no value)";
    case YNode::Kind::scalar:
      return "a scalar";
    case YNode::Kind::seq:
      return "a list";
    case YNode::Kind::map:
      return "a mapping";
  }
  return "?";
}

struct Abort {};  // thrown out of the event handler once a cap is hit

// Builds the tree from parser events and reports duplicate keys at their second occurrence.
class TreeBuilder : public YAML::EventHandler {
 public:
  TreeBuilder(const std::string& text, std::vector<Diagnostic>& out, const std::string& file)
      : text_(text), out_(out), file_(file) {}

  NodeP root;

  void OnDocumentStart(const YAML::Mark& m) override {
    if (++docs_ > 1) {
      fail(m, "a plan is one YAML document; a second document starts here");
    }
  }
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& m, YAML::anchor_t anchor) override {
    auto n = make(m, YNode::Kind::null);
    // An empty value carries the mark of the next token; point at the key instead.
    if (!looks_like_null(m) && !keys_.empty() && keys_.back().pending) {
      n->line = keys_.back().line;
      n->col = keys_.back().col;
    }
    n->complete = true;
    add(n, anchor);
  }

  void OnAlias(const YAML::Mark& m, YAML::anchor_t anchor) override {
    auto it = anchors_.find(anchor);
    if (it == anchors_.end() || !it->second->complete)
      fail(m, "alias refers to an anchor that encloses it (a cycle)");
    count(m);
    add(it->second, 0);
  }

  void OnScalar(const YAML::Mark& m, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    auto n = make(m, YNode::Kind::scalar);
    n->value = value;
    n->quoted = (tag == "!");  // yaml-cpp tags non-plain scalars "!"
    n->complete = true;
    add(n, anchor);
  }

  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(make(m, YNode::Kind::seq), anchor, m);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(make(m, YNode::Kind::map), anchor, m);
  }
  void OnMapEnd() override { close(); }

 private:
  // Per open map: whether the next node is a value (and for which key), or a key.
  struct KeyState {
    bool pending = false;  // a key was read, its value comes next
    bool skip = false;     // the pending key is a duplicate or not a string: drop its value
    NodeP bad_key;         // a key that is not a scalar
    std::string key;
    int line = 0, col = 0;
  };

  const std::string& text_;
  std::vector<Diagnostic>& out_;
  const std::string& file_;
  std::vector<NodeP> stack_;
  std::vector<KeyState> keys_;  // parallel to stack_ (unused for sequences)
  // Per open map: key -> index in entries (a linear search would make a hostile flat mapping
  // of many keys quadratic).
  std::vector<std::unordered_map<std::string, size_t>> seen_;
  std::map<YAML::anchor_t, NodeP> anchors_;
  int docs_ = 0;
  size_t nodes_ = 0;

  [[noreturn]] void fail(const YAML::Mark& m, const std::string& msg) {
    Diagnostic d;
    d.loc = SourceLoc{file_, m.line + 1, m.column + 1};
    d.message = msg;
    out_.push_back(std::move(d));
    throw Abort{};
  }
  void count(const YAML::Mark& m) {
    if (++nodes_ > kMaxNodes)
      fail(m, "plan has more than " + std::to_string(kMaxNodes) + " YAML nodes; refusing it");
  }
  NodeP make(const YAML::Mark& m, YNode::Kind k) {
    count(m);
    auto n = std::make_shared<YNode>();
    n->kind = k;
    n->line = m.line + 1;
    n->col = m.column + 1;
    return n;
  }
  bool looks_like_null(const YAML::Mark& m) const {
    if (m.pos < 0 || static_cast<size_t>(m.pos) >= text_.size()) return false;
    const char c = text_[static_cast<size_t>(m.pos)];
    return c == '~' || c == 'n' || c == 'N';
  }
  void open(NodeP n, YAML::anchor_t anchor, const YAML::Mark& m) {
    if (static_cast<int>(stack_.size()) >= kMaxDepth)
      fail(m, "YAML nesting deeper than " + std::to_string(kMaxDepth) + " levels; refusing it");
    add(n, anchor);
    stack_.push_back(n);
    keys_.emplace_back();
    seen_.emplace_back();
  }
  void close() {
    stack_.back()->complete = true;
    stack_.pop_back();
    keys_.pop_back();
    seen_.pop_back();
  }
  // Attaches a finished (or just opened) node to its parent.
  void add(const NodeP& n, YAML::anchor_t anchor) {
    if (anchor != 0) anchors_[anchor] = n;
    if (stack_.empty()) {
      root = n;
      return;
    }
    YNode& parent = *stack_.back();
    if (parent.kind == YNode::Kind::seq) {
      parent.items.push_back(n);
      return;
    }
    KeyState& ks = keys_.back();
    if (ks.pending) {  // n is the value of the pending key
      // Reported only now that the key is complete (a cap may abort before that).
      if (ks.bad_key)
        report_key_error(*ks.bad_key, "a mapping key must be a plain string, got " +
                                          std::string(kind_name(*ks.bad_key)));
      if (!ks.skip) {
        seen_.back().emplace(ks.key, parent.entries.size());
        parent.entries.push_back(YEntry{ks.key, ks.line, ks.col, n});
      }
      ks = KeyState{};
      return;
    }
    // n is a key.
    ks.pending = true;
    ks.line = n->line;
    ks.col = n->col;
    if (n->kind != YNode::Kind::scalar) {
      ks.bad_key = n;
      ks.skip = true;
      return;
    }
    ks.key = n->value;
    if (auto it = seen_.back().find(ks.key); it != seen_.back().end()) {
      const YEntry* first = &parent.entries[it->second];
      // yaml-cpp's node API would silently keep one of the two: say so, at the second one.
      report_key_error(*n, "duplicate key '" + ks.key + "' (first at line " +
                               std::to_string(first->line) + ":" + std::to_string(first->col) +
                               ")");
      ks.skip = true;
    }
  }
  void report_key_error(const YNode& n, const std::string& msg) {
    Diagnostic d;
    d.loc = SourceLoc{file_, n.line, n.col};
    d.message = msg;
    out_.push_back(std::move(d));
  }
};

// ------------------------------------------------------------------ helpers

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const char ca = static_cast<char>(std::tolower(static_cast<unsigned char>(a[i - 1])));
      const char cb = static_cast<char>(std::tolower(static_cast<unsigned char>(b[j - 1])));
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca == cb ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// "; did you mean 'x'?" when one candidate is close (at most a third of the word, min 2).
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.size() > 64) return "";
  const std::string* best = nullptr;
  size_t best_d = 0;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (!best || d < best_d) best = &c, best_d = d;
  }
  if (!best || best_d > std::max<size_t>(2, word.size() / 3)) return "";
  return "; did you mean '" + *best + "'?";
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string show(const std::string& s) {  // a user value, quoted and bounded for messages
  if (s.size() > 40) return "'" + s.substr(0, 40) + "...'";
  return "'" + s + "'";
}

std::string rows_range(int64_t lo, int64_t hi) {
  return "[" + std::to_string(lo) + "," + std::to_string(hi) + ")";
}

// Where each checked value came from, for the semantic pass.
struct ShardLocs {
  SourceLoc map, rank, row_offset, rows;
  bool valid = false;  // all three ints parsed and in range
};
struct TableLocs {
  SourceLoc map, name, num_embeddings, embedding_dim, data_type, dist_type, pooling_key, shards_key,
      shards;
  bool has_pooling = false, has_shards = false;
  bool valid = false;  // every required scalar parsed
  std::vector<SourceLoc> features;
  std::vector<ShardLocs> shard_locs;
};

// ------------------------------------------------------------------ checker

class Checker {
 public:
  Checker(const std::string& file, std::vector<Diagnostic>& out) : file_(file), out_(out) {}

  SourceLoc at(int line, int col) const { return SourceLoc{file_, line, col}; }
  SourceLoc at(const YNode& n) const { return at(n.line, n.col); }
  SourceLoc key_at(const YEntry& e) const { return at(e.line, e.col); }

  void report(Severity s, SourceLoc loc, const std::string& path, const std::string& msg) {
    Diagnostic d;
    d.severity = s;
    d.loc = std::move(loc);
    d.path = path;
    d.message = msg;
    out_.push_back(std::move(d));
  }
  void error(SourceLoc loc, const std::string& path, const std::string& msg) {
    report(Severity::error, std::move(loc), path, msg);
  }

  // Unknown keys (with a suggestion) and missing required keys (at the mapping itself).
  void check_keys(const YNode& map, const std::string& path,
                  const std::vector<std::string>& allowed,
                  const std::vector<std::string>& required) {
    for (const YEntry& e : map.entries) {
      if (std::find(allowed.begin(), allowed.end(), e.key) != allowed.end()) continue;
      error(key_at(e), sub(path, e.key),
            "unknown key " + show(e.key) + did_you_mean(e.key, allowed) +
                " (valid keys: " + join(allowed) + ")");
    }
    std::vector<std::string> missing;
    for (const std::string& k : required)
      if (!map.find(k)) missing.push_back("'" + k + "'");
    if (!missing.empty())
      error(
          at(map), path,
          std::string("missing required key") + (missing.size() > 1 ? "s " : " ") + join(missing));
  }

  static std::string sub(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  // An integer in [lo, hi]; plain (unquoted) decimal digits only.
  std::optional<int64_t> get_int(const YEntry& e, const std::string& path, int64_t lo, int64_t hi) {
    const YNode& n = *e.value;
    if (n.kind != YNode::Kind::scalar) {
      error(at(n), path, std::string("expected an integer, got ") + kind_name(n));
      return std::nullopt;
    }
    if (n.quoted) {
      error(at(n), path, "expected an integer, got the quoted string " + show(n.value));
      return std::nullopt;
    }
    const std::string& s = n.value;
    size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
    const bool digits = i < s.size() && std::all_of(s.begin() + static_cast<long>(i), s.end(),
                                                    [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) {
      error(at(n), path, "expected an integer, got " + show(s));
      return std::nullopt;
    }
    errno = 0;
    const long long v = std::strtoll(s.c_str(), nullptr, 10);
    if (errno == ERANGE) {
      error(at(n), path, "integer " + show(s) + " does not fit in 64 bits");
      return std::nullopt;
    }
    if (v < lo) {
      error(at(n), path, "must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
      return std::nullopt;
    }
    if (v > hi) {
      error(at(n), path, "must be <= " + std::to_string(hi) + ", got " + std::to_string(v));
      return std::nullopt;
    }
    return static_cast<int64_t>(v);
  }

  std::optional<std::string> get_string(const YEntry& e, const std::string& path) {
    const YNode& n = *e.value;
    if (n.kind != YNode::Kind::scalar) {
      error(at(n), path, std::string("expected a string, got ") + kind_name(n));
      return std::nullopt;
    }
    if (n.value.empty()) {
      error(at(n), path, "must not be empty");
      return std::nullopt;
    }
    return n.value;
  }

  // One of `names`; returns the index.
  std::optional<size_t> get_enum(const YEntry& e, const std::string& path,
                                 const std::vector<std::string>& names) {
    auto s = get_string(e, path);
    if (!s) return std::nullopt;
    for (size_t i = 0; i < names.size(); ++i)
      if (*s == names[i]) return i;
    error(at(*e.value), path,
          "must be one of " + join(names) + "; got " + show(*s) + did_you_mean(*s, names));
    return std::nullopt;
  }

  const YNode* get_list(const YEntry& e, const std::string& path, size_t min_entries) {
    const YNode& n = *e.value;
    if (n.kind != YNode::Kind::seq) {
      error(at(n), path, std::string("expected a list, got ") + kind_name(n));
      return nullptr;
    }
    if (n.items.size() < min_entries) {
      error(at(n), path, "must have at least " + std::to_string(min_entries) + " entry");
      return nullptr;
    }
    return &n;
  }

  bool expect_map(const YNode& n, const std::string& path) {
    if (n.kind == YNode::Kind::map) return true;
    error(at(n), path, std::string("expected a mapping, got ") + kind_name(n));
    return false;
  }

 private:
  const std::string& file_;
  std::vector<Diagnostic>& out_;
};

const std::vector<std::string> kDTypes = {"fp32", "fp16", "bf16"};
const std::vector<std::string> kModules = {"sequence", "pooled"};
const std::vector<std::string> kPoolings = {"sum", "mean"};
const std::vector<std::string> kDistTypes = {"continuous", "roundrobin", "hash_roundrobin"};
const std::vector<std::string> kBoundsChecks = {"error", "warn_zero_row", "ignore"};
const std::vector<std::string> kInputDists = {"training", "inference"};
const std::vector<std::string> kTopKeys = {"format_version", "world_size",   "module",
                                           "comm_precision", "bounds_check", "input_dist",
                                           "tables"};
const std::vector<std::string> kTableKeys = {"name",      "num_embeddings", "embedding_dim",
                                             "data_type", "pooling",        "dist_type",
                                             "features",  "shards"};
const std::vector<std::string> kShardKeys = {"rank", "row_offset", "rows"};

DType dtype_at(size_t i) {
  return i == 0 ? DType::f32 : i == 1 ? DType::f16 : DType::bf16;
}

// ---- semantic checks on one table's explicit shards (all values parsed) ----
void check_shards(Checker& c, const TableConfig& t, const TableLocs& L, const std::string& path,
                  int64_t W, InputDist input_dist) {
  const std::string spath = path + ".shards";
  const int64_t n = static_cast<int64_t>(t.shards.size());
  for (const ShardLocs& sl : L.shard_locs)
    if (!sl.valid) return;  // already reported by the schema pass

  // Exactly one shard per rank 0..W-1 (TorchRec reads shards[rank] positionally).
  std::vector<int> by_rank(static_cast<size_t>(W), -1);
  bool ranks_ok = true;
  for (int64_t i = 0; i < n; ++i) {
    const ShardSpec& s = t.shards[static_cast<size_t>(i)];
    int& slot = by_rank[static_cast<size_t>(s.rank)];
    if (slot >= 0) {
      const SourceLoc& first = L.shard_locs[static_cast<size_t>(slot)].rank;
      c.error(L.shard_locs[static_cast<size_t>(i)].rank, spath + "[" + std::to_string(i) + "].rank",
              "rank " + std::to_string(s.rank) + " has a second shard (first at line " +
                  std::to_string(first.line) + ":" + std::to_string(first.col) + ")");
      ranks_ok = false;
    } else {
      slot = static_cast<int>(i);
    }
  }
  std::vector<std::string> missing;
  for (int64_t r = 0; r < W; ++r)
    if (by_rank[static_cast<size_t>(r)] < 0) missing.push_back(std::to_string(r));
  if (!missing.empty() || n != W) {
    std::string msg = "expected exactly one shard per rank 0.." + std::to_string(W - 1) +
                      " (world_size " + std::to_string(W) + "), got " + std::to_string(n);
    if (!missing.empty()) msg += "; no shard for rank " + join(missing);
    c.error(L.shards, spath, msg);
    return;
  }
  if (!ranks_ok) return;
  if (t.dist_type != DistType::continuous) return;  // capacities, not key ranges

  // Contiguous, non-overlapping, covering [0, num_embeddings), in rank order.
  int64_t expect = 0;
  for (int64_t r = 0; r < W; ++r) {
    const size_t i = static_cast<size_t>(by_rank[static_cast<size_t>(r)]);
    const ShardSpec& s = t.shards[i];
    const ShardLocs& sl = L.shard_locs[i];
    const std::string ipath = spath + "[" + std::to_string(i) + "]";
    if (s.row_offset != expect) {
      std::string msg;
      if (r == 0) {
        msg = "rank 0's shard must start at row 0, got row_offset " + std::to_string(s.row_offset) +
              " (rows " + rows_range(0, s.row_offset) + " are in no shard)";
      } else if (s.row_offset > expect) {
        msg = "rows " + rows_range(expect, s.row_offset) + " are in no shard: rank " +
              std::to_string(r - 1) + " ends at row " + std::to_string(expect) + ", rank " +
              std::to_string(r) + " starts at row " + std::to_string(s.row_offset);
      } else {
        msg = "rank " + std::to_string(r) + "'s rows " +
              rows_range(s.row_offset, s.row_offset + s.rows) + " overlap rank " +
              std::to_string(r - 1) + "'s, which end at row " + std::to_string(expect);
      }
      c.error(sl.row_offset, ipath + ".row_offset", msg);
      return;
    }
    expect = s.row_offset + s.rows;
  }
  if (expect != t.num_embeddings) {
    const size_t last = static_cast<size_t>(by_rank[static_cast<size_t>(W - 1)]);
    c.error(L.shard_locs[last].rows, spath + "[" + std::to_string(last) + "].rows",
            "shards cover rows " + rows_range(0, expect) + " but num_embeddings is " +
                std::to_string(t.num_embeddings) +
                (expect < t.num_embeddings
                     ? " (rows " + rows_range(expect, t.num_embeddings) + " are in no shard)"
                     : ""));
    return;
  }

  // The training input dist routes by blk = ceil(N/W) and never reads the spec
  // (docs/semantics.md §2): a different split sends ids to ranks that lack their rows. The
  // inference input dist routes by the shards' offsets (block_bucketize_pos): any cover will do.
  if (input_dist == InputDist::inference) return;
  const std::vector<int64_t> even = rw_even_shard_rows(t.num_embeddings, W);
  const int64_t blk = rw_block_size(t.num_embeddings, W);
  std::vector<int64_t> even_off(static_cast<size_t>(W), 0), differ;
  for (int64_t r = 0; r < W; ++r) {
    if (r > 0) even_off[r] = even_off[r - 1] + even[r - 1];
    const size_t i = static_cast<size_t>(by_rank[static_cast<size_t>(r)]);
    if (t.shards[i].rows != even[static_cast<size_t>(r)]) differ.push_back(r);
  }
  // One error per rank that differs (at most kMaxReported, the last one counts the rest).
  constexpr size_t kMaxReported = 8;
  for (size_t k = 0; k < differ.size() && k < kMaxReported; ++k) {
    const int64_t r = differ[k];
    const size_t i = static_cast<size_t>(by_rank[static_cast<size_t>(r)]);
    const ShardSpec& s = t.shards[i];
    const int64_t er = even[static_cast<size_t>(r)], eo = even_off[static_cast<size_t>(r)];
    const std::string ids = er == 0 ? "no ids" : "ids " + rows_range(eo, eo + er);
    const std::string got =
        s.rows == 0 ? "no rows" : "rows " + rows_range(s.row_offset, s.row_offset + s.rows);
    std::string msg = "training routes " + ids + " to rank " + std::to_string(r) +
                      " (blk=" + std::to_string(blk) + "), but shards give rank " +
                      std::to_string(r) + " " + got;
    if (k == 0 && W <= 32) {
      std::vector<std::string> ev;
      for (int64_t x : even) ev.push_back(std::to_string(x));
      msg += "; the ceil rule (docs/semantics.md §2) gives rows per rank [" + join(ev, ",") + "]";
    }
    if (k + 1 == kMaxReported && differ.size() > kMaxReported)
      msg += " (and " + std::to_string(differ.size() - kMaxReported) + " more ranks differ)";
    c.error(L.shard_locs[i].rows, spath + "[" + std::to_string(i) + "].rows", msg);
  }
}

// ------------------------------------------------------------------ parse_plan's passes

// Pass 1: YAML syntax, duplicate keys and caps (TreeBuilder); nullptr after reporting.
NodeP parse_syntax(const std::string& yaml_text, const std::string& display_name, Checker& c,
                   std::vector<Diagnostic>& out) {
  std::istringstream in(yaml_text);
  TreeBuilder tb(yaml_text, out, display_name);
  try {
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(tb)) {
    }
  } catch (const Abort&) {
    return nullptr;
  } catch (const YAML::ParserException& e) {
    // A tab in the indentation makes yaml-cpp report something unrelated ("illegal block
    // entry", "end of map not found"): name the tab when one comes at or before the error.
    const int err_line = e.mark.is_null() ? 0 : e.mark.line + 1;
    int line = 1;
    for (size_t i = 0, col = 1; i < yaml_text.size() && (err_line == 0 || line <= err_line); ++i) {
      const char ch = yaml_text[i];
      if (ch == '\n') {
        ++line;
        col = 1;
        continue;
      }
      if (ch == '\t' && yaml_text.find_first_not_of(" \t", i - (col - 1)) >= i) {
        c.error(
            c.at(line, int(col)), "",
            "a tab in the indentation; YAML indents with spaces only (yaml-cpp: " + e.msg + ")");
        return nullptr;
      }
      ++col;
    }
    c.error(e.mark.is_null() ? c.at(0, 0) : c.at(e.mark.line + 1, e.mark.column + 1), "",
            "YAML syntax error: " + e.msg);
    return nullptr;
  } catch (const YAML::Exception& e) {
    c.error(c.at(1, 1), "", std::string("YAML error: ") + e.what());
    return nullptr;
  }
  if (!tb.root || tb.root->kind == YNode::Kind::null) {
    c.error(c.at(1, 1), "",
            "the plan is empty: expected a mapping with format_version, world_size, module "
            "and tables");
    return nullptr;
  }
  if (!c.expect_map(*tb.root, "")) return nullptr;
  return tb.root;
}

// What pass 2 learned besides the Plan: which required top-level values parsed, and where
// every table's values came from.
struct SchemaState {
  bool have_w = false, have_module = false;
  std::vector<TableLocs> locs;  // [tables]
};

// Pass 2, top level: every key but `tables`, whose entry is returned (nullptr when absent).
const YEntry* parse_top_level(const YNode& root, Checker& c, Plan& plan, SchemaState& st) {
  const YEntry* tables_entry = nullptr;
  c.check_keys(root, "", kTopKeys, {"format_version", "world_size", "module", "tables"});
  for (const YEntry& e : root.entries) {
    if (e.key == "format_version") {
      // Checked as "any integer" first, so a wrong version gets its own message.
      if (auto v = c.get_int(e, e.key, INT64_MIN, INT64_MAX)) {
        if (*v != 1)
          c.error(
              c.at(*e.value), e.key,
              "unsupported format_version " + std::to_string(*v) + " (this build reads version 1)");
      }
    } else if (e.key == "world_size") {
      if (auto v = c.get_int(e, e.key, 1, kMaxWorldSize)) plan.world_size = *v, st.have_w = true;
    } else if (e.key == "module") {
      if (auto v = c.get_enum(e, e.key, kModules))
        plan.module = *v == 0 ? ModuleKind::sequence : ModuleKind::pooled, st.have_module = true;
    } else if (e.key == "comm_precision") {
      if (auto v = c.get_enum(e, e.key, kDTypes)) plan.comm_precision = dtype_at(*v);
    } else if (e.key == "bounds_check") {
      if (auto v = c.get_enum(e, e.key, kBoundsChecks))
        plan.bounds_check = static_cast<BoundsCheck>(*v);
    } else if (e.key == "input_dist") {
      if (auto v = c.get_enum(e, e.key, kInputDists)) plan.input_dist = static_cast<InputDist>(*v);
    } else if (e.key == "tables") {
      tables_entry = &e;
    }
  }
  return tables_entry;
}

// Pass 2, one `shards` list of table `kp`; false when it is not a list. Ranks are checked
// against world_size when that parsed (`world_size` < 0: unknown).
bool parse_shards(const YEntry& e, const std::string& kp, Checker& c, int64_t world_size,
                  TableConfig& t, TableLocs& L) {
  L.has_shards = true;
  L.shards_key = c.key_at(e);
  L.shards = c.at(*e.value);
  const YNode* sl = c.get_list(e, kp, 1);
  if (!sl) return false;
  for (size_t si = 0; si < sl->items.size(); ++si) {
    const YNode& sn = *sl->items[si];
    const std::string sp = kp + "[" + std::to_string(si) + "]";
    ShardSpec s;
    ShardLocs sloc;
    sloc.map = s.loc = c.at(sn);
    if (c.expect_map(sn, sp)) {
      c.check_keys(sn, sp, kShardKeys, kShardKeys);
      int got = 0;
      for (const YEntry& se : sn.entries) {
        const std::string p = sp + "." + se.key;
        if (se.key == "rank") {
          sloc.rank = c.at(*se.value);
          if (auto v = c.get_int(se, p, 0, INT64_MAX)) s.rank = *v, ++got;
        } else if (se.key == "row_offset") {
          sloc.row_offset = c.at(*se.value);
          if (auto v = c.get_int(se, p, 0, INT64_MAX)) s.row_offset = *v, ++got;
        } else if (se.key == "rows") {
          sloc.rows = c.at(*se.value);
          if (auto v = c.get_int(se, p, 0, INT64_MAX)) s.rows = *v, ++got;
        }
      }
      sloc.valid = got == 3;
      if (sloc.valid && world_size >= 0 && s.rank >= world_size) {
        c.error(sloc.rank, sp + ".rank",
                "must be < world_size " + std::to_string(world_size) + ", got " +
                    std::to_string(s.rank));
        sloc.valid = false;
      }
      if (sloc.valid && s.row_offset > INT64_MAX - s.rows) {
        c.error(sloc.rows, sp + ".rows", "row_offset + rows overflows 64 bits");
        sloc.valid = false;
      }
    }
    t.shards.push_back(s);
    L.shard_locs.push_back(sloc);
  }
  return true;
}

// Pass 2, table `tp`: its keys into `t`, their places into `L`. L.valid: every required
// scalar parsed (and its size fits 64 bits).
void parse_table(const YNode& tn, const std::string& tp, Checker& c, int64_t world_size,
                 TableConfig& t, TableLocs& L) {
  L.map = c.at(tn);
  t.loc = L.map;
  L.data_type = L.dist_type = L.map;  // defaults are reported at the table's mapping
  if (!c.expect_map(tn, tp)) return;
  c.check_keys(tn, tp, kTableKeys, {"name", "num_embeddings", "embedding_dim", "features"});
  bool ok = tn.find("name") && tn.find("num_embeddings") && tn.find("embedding_dim") &&
            tn.find("features");
  for (const YEntry& e : tn.entries) {
    const std::string kp = tp + "." + e.key;
    if (e.key == "name") {
      L.name = c.at(*e.value);
      if (auto v = c.get_string(e, kp))
        t.name = *v;
      else
        ok = false;
    } else if (e.key == "num_embeddings") {
      L.num_embeddings = c.at(*e.value);
      if (auto v = c.get_int(e, kp, 1, INT64_MAX))
        t.num_embeddings = *v;
      else
        ok = false;
    } else if (e.key == "embedding_dim") {
      L.embedding_dim = c.at(*e.value);
      if (auto v = c.get_int(e, kp, 1, kMaxEmbeddingDim))
        t.embedding_dim = *v;
      else
        ok = false;
    } else if (e.key == "data_type") {
      L.data_type = c.at(*e.value);
      if (auto v = c.get_enum(e, kp, kDTypes))
        t.data_type = dtype_at(*v);
      else
        ok = false;
    } else if (e.key == "pooling") {
      L.has_pooling = true;
      L.pooling_key = c.key_at(e);
      if (auto v = c.get_enum(e, kp, kPoolings))
        t.pooling = static_cast<PoolingMode>(*v);
      else
        ok = false;
    } else if (e.key == "dist_type") {
      L.dist_type = c.at(*e.value);
      if (auto v = c.get_enum(e, kp, kDistTypes))
        t.dist_type = static_cast<DistType>(*v);
      else
        ok = false;
    } else if (e.key == "features") {
      const YNode* fl = c.get_list(e, kp, 1);
      if (!fl) {
        ok = false;
        continue;
      }
      for (size_t fi = 0; fi < fl->items.size(); ++fi) {
        const YNode& fnode = *fl->items[fi];
        YEntry fe{"", fnode.line, fnode.col, fl->items[fi]};
        if (auto v = c.get_string(fe, kp + "[" + std::to_string(fi) + "]")) {
          t.features.push_back(*v);
          L.features.push_back(c.at(fnode));
        } else {
          ok = false;
        }
      }
    } else if (e.key == "shards") {
      ok &= parse_shards(e, kp, c, world_size, t, L);
    }
  }
  // Bytes of the unsharded table must fit in 64 bits (rows x D x dtype bytes).
  if (t.num_embeddings > 0 && t.embedding_dim > 0) {
    int64_t elems = 0, bytes = 0;
    if (__builtin_mul_overflow(t.num_embeddings, t.embedding_dim, &elems) ||
        __builtin_mul_overflow(elems, int64_t{dtype_bytes(t.data_type)}, &bytes)) {
      c.error(L.num_embeddings, tp + ".num_embeddings",
              "num_embeddings x embedding_dim x " + std::to_string(dtype_bytes(t.data_type)) +
                  " bytes overflows 64 bits");
      ok = false;
    }
  }
  L.valid = ok;
}

// Pass 2, after every table: the per-rank memory report sums all tables, so that sum must fit
// in 64 bits too.
void check_total_size(const Plan& plan, Checker& c, SchemaState& st) {
  int64_t total = 0;
  for (size_t ti = 0; ti < plan.tables.size(); ++ti) {
    const TableConfig& t = plan.tables[ti];
    if (!st.locs[ti].valid) continue;
    const int64_t bytes = t.num_embeddings * t.embedding_dim * dtype_bytes(t.data_type);
    if (__builtin_add_overflow(total, bytes, &total)) {
      c.error(st.locs[ti].num_embeddings, "tables[" + std::to_string(ti) + "].num_embeddings",
              "the total size of all tables overflows 64 bits");
      st.locs[ti].valid = false;
      break;
    }
  }
}

// Pass 3: table and feature names unique across the plan.
void check_unique_names(const Plan& plan, const SchemaState& st, Checker& c) {
  std::map<std::string, SourceLoc> seen_tables, seen_features;
  for (size_t ti = 0; ti < plan.tables.size(); ++ti) {
    const TableConfig& t = plan.tables[ti];
    const TableLocs& L = st.locs[ti];
    const std::string tp = "tables[" + std::to_string(ti) + "]";
    if (!t.name.empty()) {
      auto [it, fresh] = seen_tables.emplace(t.name, L.name);
      if (!fresh)
        c.error(L.name, tp + ".name",
                "duplicate table name " + show(t.name) + " (first at line " +
                    std::to_string(it->second.line) + ":" + std::to_string(it->second.col) + ")");
    }
    for (size_t fi = 0; fi < t.features.size(); ++fi) {
      auto [it, fresh] = seen_features.emplace(t.features[fi], L.features[fi]);
      if (!fresh)
        c.error(L.features[fi], tp + ".features[" + std::to_string(fi) + "]",
                "duplicate feature name " + show(t.features[fi]) + " (first at line " +
                    std::to_string(it->second.line) + ":" + std::to_string(it->second.col) +
                    "); feature names are unique across the plan");
    }
  }
}

// Pass 3: every parsed table against the first parsed one (`ref`: one dim for a sequence
// plan, one data_type), its size, and its explicit shards.
void check_tables_agree(const Plan& plan, const SchemaState& st, size_t ref, Checker& c) {
  for (size_t ti = 0; ti < plan.tables.size(); ++ti) {
    const TableConfig& t = plan.tables[ti];
    const TableLocs& L = st.locs[ti];
    const std::string tp = "tables[" + std::to_string(ti) + "]";
    if (!L.valid) continue;
    const TableConfig& r = plan.tables[ref];
    const std::string ref_name = "tables[" + std::to_string(ref) + "] (" + r.name + ")";

    if (st.have_module && plan.module == ModuleKind::sequence) {
      if (L.has_pooling)
        c.error(L.pooling_key, tp + ".pooling",
                "'pooling' is for pooled plans only (module is sequence: an "
                "EmbeddingCollection does not pool)");
      if (ti != ref && t.embedding_dim != r.embedding_dim)
        c.error(
            L.embedding_dim, tp + ".embedding_dim",
            "a sequence plan needs one common embedding_dim: " + std::to_string(t.embedding_dim) +
                " here, " + std::to_string(r.embedding_dim) + " in " + ref_name);
    }
    if (ti != ref && t.data_type != r.data_type)
      c.error(L.data_type, tp + ".data_type",
              std::string("all tables must share one data_type (the output dist receives one "
                          "tensor): ") +
                  to_string(t.data_type) + " here, " + to_string(r.data_type) + " in " + ref_name);

    // 32-bit indexing in known kernels overflows at 2^31 elements.
    const int64_t elems = t.num_embeddings * t.embedding_dim;
    if (elems >= (int64_t{1} << 31))
      c.report(Severity::warning, L.num_embeddings, tp + ".num_embeddings",
               "table " + show(t.name) + " has " + std::to_string(t.num_embeddings) + " x " +
                   std::to_string(t.embedding_dim) + " = " + std::to_string(elems) +
                   " elements (>= 2^31): kernels that index with 32 bits overflow on it");

    if (L.has_shards && st.have_w && !t.shards.empty()) {
      if (t.dist_type != DistType::continuous)
        c.report(Severity::warning, L.shards_key, tp + ".shards",
                 std::string("dist_type ") + to_string(t.dist_type) +
                     " does not route ids by row ranges: row_offset is ignored and shard "
                     "rows are only per-rank capacities");
      check_shards(c, t, L, tp, plan.world_size, plan.input_dist);
    }
  }
}

// Pass 3: mixed dist_types are allowed, but worth a note at the first table that differs.
void note_mixed_dist_types(const Plan& plan, const SchemaState& st, size_t ref, Checker& c) {
  const size_t n_tables = plan.tables.size();
  std::map<int, std::vector<std::string>> by_dist;
  size_t first_diff = n_tables;
  for (size_t ti = 0; ti < n_tables; ++ti) {
    if (!st.locs[ti].valid) continue;
    by_dist[static_cast<int>(plan.tables[ti].dist_type)].push_back(plan.tables[ti].name);
    if (first_diff == n_tables && plan.tables[ti].dist_type != plan.tables[ref].dist_type)
      first_diff = ti;
  }
  if (first_diff == n_tables) return;
  std::vector<std::string> parts;
  for (const auto& [d, names] : by_dist)
    parts.push_back(std::string(to_string(static_cast<DistType>(d))) + " (" + join(names) + ")");
  c.report(Severity::note, st.locs[first_diff].dist_type,
           "tables[" + std::to_string(first_diff) + "].dist_type",
           "plan mixes dist_types: " + join(parts, "; ") +
               "; each feature is routed by its own table's dist_type");
}

// Findings in file order, at most kMaxFindings of them (then one note with the rest's count).
void sort_and_cap(std::vector<Diagnostic>& out, const std::string& display_name) {
  std::stable_sort(out.begin(), out.end(), [](const Diagnostic& a, const Diagnostic& b) {
    return std::make_pair(a.loc.line, a.loc.col) < std::make_pair(b.loc.line, b.loc.col);
  });
  if (out.size() <= kMaxFindings) return;
  const size_t more = out.size() - kMaxFindings;
  out.resize(kMaxFindings);
  Diagnostic d;
  d.severity = Severity::note;
  d.loc.file = display_name;
  d.message = std::to_string(more) + " more findings not shown (at most " +
              std::to_string(kMaxFindings) + " are reported)";
  out.push_back(std::move(d));
}

}  // namespace

// ------------------------------------------------------------------ parse_plan

PlanLoadResult parse_plan(const std::string& yaml_text, const std::string& display_name) {
  PlanLoadResult result;
  std::vector<Diagnostic>& out = result.findings;
  Checker c(display_name, out);

  if (yaml_text.size() > kMaxTextBytes) {
    c.error(c.at(1, 1), "",
            "plan is " + std::to_string(yaml_text.size()) + " bytes; plans larger than " +
                std::to_string(kMaxTextBytes >> 20) + " MiB are refused");
    return result;
  }
  const NodeP root = parse_syntax(yaml_text, display_name, c, out);  // pass 1
  if (!root) return result;

  // Pass 2: the schema, each value where it stands.
  Plan plan;
  plan.path = display_name;
  plan.source_text = yaml_text;
  SchemaState st;
  const YEntry* tables_entry = parse_top_level(*root, c, plan, st);
  if (const YNode* tables = tables_entry ? c.get_list(*tables_entry, "tables", 1) : nullptr) {
    for (size_t ti = 0; ti < tables->items.size(); ++ti) {
      TableConfig t;
      TableLocs L;
      parse_table(*tables->items[ti], "tables[" + std::to_string(ti) + "]", c,
                  st.have_w ? plan.world_size : -1, t, L);
      plan.tables.push_back(std::move(t));
      st.locs.push_back(std::move(L));
    }
  }
  check_total_size(plan, c, st);

  // Pass 3: semantics across tables, against the first fully parsed one.
  check_unique_names(plan, st, c);
  size_t ref = plan.tables.size();
  for (size_t ti = 0; ti < plan.tables.size() && ref == plan.tables.size(); ++ti)
    if (st.locs[ti].valid) ref = ti;
  if (ref < plan.tables.size()) {
    check_tables_agree(plan, st, ref, c);
    note_mixed_dist_types(plan, st, ref, c);
  }

  sort_and_cap(out, display_name);
  const bool any_error = std::any_of(
      out.begin(), out.end(), [](const Diagnostic& d) { return d.severity == Severity::error; });
  if (!any_error) {
    plan.finalize();
    result.plan = std::move(plan);
  }
  return result;
}

PlanLoadResult load_plan_file(const std::string& path) {
  // Missing vs permission denied vs a directory; a FIFO nobody writes to times out.
  return parse_plan(read_input_text(path, "plan"), path);
}

Plan load_plan_or_throw(const std::string& yaml_text, const std::string& display_name) {
  PlanLoadResult r = parse_plan(yaml_text, display_name);
  for (const Diagnostic& d : r.findings) {
    if (d.severity != Severity::error) continue;
    throw PlanError(d.loc, d.path.empty() ? d.message : d.path + ": " + d.message);
  }
  return std::move(*r.plan);
}

}  // namespace dynemb
