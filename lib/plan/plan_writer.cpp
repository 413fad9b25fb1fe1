// plan_to_yaml: a Plan back to the YAML of docs/plan-format.md, through yaml-cpp's emitter so
// that every name is quoted and escaped whatever bytes it holds.
//
// Layout (every key written, defaults included, so that a reader sees the whole plan):
//   # comment line ...
//   format_version: 1
//   world_size: W
//   module: ...
//   comm_precision: ...
//   bounds_check: ...
//   input_dist: inference           (only when not training: older readers keep reading the rest)
//   tables:
//     - name: "t0"
//       ...
//       pooling: sum                (pooled plans only: a sequence plan must not have it)
//       features: ["f0", "f1"]
//       shards:                     (only when explicit)
//         - {rank: 0, row_offset: 0, rows: 3}
#include <yaml-cpp/emitter.h>
#include <yaml-cpp/emittermanip.h>

#include <string>
#include <vector>

#include "common/safe_text.hpp"
#include "plan/plan.hpp"

namespace dynemb {

namespace {

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// A double-quoted YAML scalar that keeps every byte: yaml-cpp's emitter turns bytes that are not
// UTF-8 into U+FFFD, yet its parser reads them back as they are (a plan file may hold them).
// Quote, backslash, C0 controls and DEL are escaped; every other byte is written unchanged.
std::string quote_bytes(const std::string& s) {
  static const char* kHex = "0123456789abcdef";
  std::string q = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      q += '\\';
      q += ch;
    } else if (c < 0x20 || c == 0x7F) {
      q += "\\x";
      q += kHex[c >> 4];
      q += kHex[c & 15];
    } else {
      q += ch;
    }
  }
  return q + "\"";
}

// Names go through yaml-cpp's double-quoted style; a name that is not UTF-8 goes in as a
// placeholder (a token no name holds) that quote_bytes' text replaces after emission.
class Names {
 public:
  explicit Names(const Plan& plan) {
    auto taken = [&](const std::string& tok) {
      for (const TableConfig& t : plan.tables) {
        if (t.name.find(tok) != std::string::npos) return true;
        for (const std::string& f : t.features)
          if (f.find(tok) != std::string::npos) return true;
      }
      return false;
    };
    for (int n = 0; taken(token_); ++n) token_ = "@@raw-name-" + std::to_string(n) + "@";
  }
  void emit(YAML::Emitter& out, const std::string& name) {
    if (valid_utf8(name)) {
      out << YAML::DoubleQuoted << name;
      return;
    }
    out << YAML::DoubleQuoted << token_ + std::to_string(raw_.size()) + "@@";
    raw_.push_back(name);
  }
  std::string finish(std::string yaml) const {
    for (size_t k = 0; k < raw_.size(); ++k) {
      const std::string ph = "\"" + token_ + std::to_string(k) + "@@\"";
      const size_t at = yaml.find(ph);
      if (at == std::string::npos) throw Error("plan_to_yaml: a name's placeholder went missing");
      yaml.replace(at, ph.size(), quote_bytes(raw_[k]));
    }
    return yaml;
  }

 private:
  std::string token_ = "@@raw-name@";
  std::vector<std::string> raw_;
};

// One comment line made safe: control characters, invalid UTF-8 and C1 controls as escapes
// (escape_field), and the Unicode line and paragraph separators too, since a YAML 1.1 reader
// may take them as line breaks.
std::string comment_line(const std::string& line) {
  std::string s = escape_field(line);
  for (const char* sep : {"\xE2\x80\xA8", "\xE2\x80\xA9"}) {
    for (size_t at = s.find(sep); at != std::string::npos; at = s.find(sep, at))
      s.replace(at, 3, sep[2] == '\xA8' ? "\\u2028" : "\\u2029");
  }
  return s;
}

std::string comment_block(const std::string& comment) {
  std::string out;
  size_t begin = 0;
  while (begin < comment.size()) {
    size_t end = comment.find('\n', begin);
    if (end == std::string::npos) end = comment.size();
    const std::string line = comment_line(comment.substr(begin, end - begin));
    out += line.empty() ? "#\n" : "# " + line + "\n";
    begin = end + 1;
  }
  return out;
}

void emit_table(YAML::Emitter& out, const Plan& plan, const TableConfig& t, Names& names) {
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value;
  names.emit(out, t.name);
  out << YAML::Key << "num_embeddings" << YAML::Value << t.num_embeddings;
  out << YAML::Key << "embedding_dim" << YAML::Value << t.embedding_dim;
  out << YAML::Key << "data_type" << YAML::Value << to_string(t.data_type);
  if (plan.module == ModuleKind::pooled)
    out << YAML::Key << "pooling" << YAML::Value << to_string(t.pooling);
  out << YAML::Key << "dist_type" << YAML::Value << to_string(t.dist_type);
  out << YAML::Key << "features" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const std::string& f : t.features) names.emit(out, f);
  out << YAML::EndSeq;
  if (!t.shards.empty()) {
    out << YAML::Key << "shards" << YAML::Value << YAML::BeginSeq;
    for (const ShardSpec& s : t.shards) {
      out << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "rank" << YAML::Value << s.rank;
      out << YAML::Key << "row_offset" << YAML::Value << s.row_offset;
      out << YAML::Key << "rows" << YAML::Value << s.rows;
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  out << YAML::EndMap;
}

}  // namespace

std::string plan_to_yaml(const Plan& plan, const std::string& comment) {
  YAML::Emitter out;
  Names names(plan);
  out << YAML::BeginMap;
  out << YAML::Key << "format_version" << YAML::Value << plan.format_version;
  out << YAML::Key << "world_size" << YAML::Value << plan.world_size;
  out << YAML::Key << "module" << YAML::Value << to_string(plan.module);
  out << YAML::Key << "comm_precision" << YAML::Value << to_string(plan.comm_precision);
  out << YAML::Key << "bounds_check" << YAML::Value << to_string(plan.bounds_check);
  if (plan.input_dist != InputDist::training)
    out << YAML::Key << "input_dist" << YAML::Value << to_string(plan.input_dist);
  out << YAML::Key << "tables" << YAML::Value << YAML::BeginSeq;
  for (const TableConfig& t : plan.tables) emit_table(out, plan, t, names);
  out << YAML::EndSeq;
  out << YAML::EndMap;
  if (!out.good()) throw Error("plan_to_yaml: yaml-cpp: " + out.GetLastError());
  return comment_block(comment) + names.finish(out.c_str()) + "\n";
}

}  // namespace dynemb
