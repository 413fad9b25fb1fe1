#include "common/safe_text.hpp"

#include <algorithm>
#include <cstdint>

namespace dynemb {

namespace {

const char kHex[] = "0123456789abcdef";

void put_byte(std::string& o, unsigned char c) {
  o += "\\x";
  o += kHex[c >> 4];
  o += kHex[c & 15];
}

void put_u(std::string& o, uint32_t cp) {
  o += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) o += kHex[(cp >> shift) & 15];
}

bool cont(std::string_view s, size_t i) {
  return i < s.size() && (static_cast<unsigned char>(s[i]) & 0xc0) == 0x80;
}

// The well-formed UTF-8 sequence (RFC 3629: no overlong form, no surrogate, at most U+10FFFF)
// of 2 to 4 bytes at s[i]: its length, and its code point in `cp`; 0 when there is none.
size_t utf8_sequence(std::string_view s, size_t i, uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (i + 1 >= s.size() || b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (!cont(s, i + k)) return 0;
  cp = c & (n == 2 ? 0x1f : n == 3 ? 0x0f : 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (b(k) & 0x3f);
  return n;
}

// An SGR sequence (ESC [ digits and ';' m) at s[i]: its length, else 0.
size_t sgr_length(std::string_view s, size_t i) {
  size_t j = i + 1;
  if (j >= s.size() || s[j] != '[') return 0;
  ++j;
  while (j < s.size() && ((s[j] >= '0' && s[j] <= '9') || s[j] == ';')) ++j;
  return j < s.size() && s[j] == 'm' ? j + 1 - i : 0;
}

// Escapes the character at s[i] into `o`; returns the index after it. '\n' is escaped too
// (escape_lines splits on it first).
size_t escape_one(std::string_view s, size_t i, std::string& o, bool keep_sgr) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c >= 0x20 && c < 0x7f) {
    if (c == '#' && i + 2 < s.size() && s[i + 1] == '#' && s[i + 2] == '[') {
      o += "#\\x23[";
      return i + 3;
    }
    o += static_cast<char>(c);
    return i + 1;
  }
  if (c < 0x80) {  // C0 or DEL
    if (c == 0x1b && keep_sgr) {
      if (const size_t n = sgr_length(s, i)) {
        o.append(s.data() + i, n);
        return i + n;
      }
    }
    if (c == '\n')
      o += "\\n";
    else if (c == '\r')
      o += "\\r";
    else if (c == '\t')
      o += "\\t";
    else
      put_byte(o, c);
    return i + 1;
  }
  uint32_t cp = 0;
  const size_t n = utf8_sequence(s, i, cp);
  if (n == 0) {
    put_byte(o, c);
    return i + 1;
  }
  if ((cp >= 0x80 && cp <= 0x9f) || cp == 0xfffe || cp == 0xffff)
    put_u(o, cp);
  else
    o.append(s.data() + i, n);
  return i + n;
}

// The length of the blank (what .NET's TrimStart removes, as the GitHub Actions runner does
// before it looks for "::") at s[i], else 0. Controls are escaped by now; left: the space and
// the Unicode spaces.
size_t blank_length(std::string_view s, size_t i) {
  if (s[i] == ' ') return 1;
  uint32_t cp = 0;
  const size_t n = utf8_sequence(s, i, cp);
  const bool space = cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
                     cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
  return n > 0 && space ? n : 0;
}

}  // namespace

bool needs_escape(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      if (c == '#' && i + 2 < s.size() && s[i + 1] == '#' && s[i + 2] == '[') return true;
      ++i;
      continue;
    }
    if (c < 0x80) return true;
    uint32_t cp = 0;
    const size_t n = utf8_sequence(s, i, cp);
    if (n == 0 || (cp >= 0x80 && cp <= 0x9f) || cp == 0xfffe || cp == 0xffff) return true;
    i += n;
  }
  return false;
}

std::string escape_field(std::string_view s) {
  if (!needs_escape(s)) return std::string(s);
  std::string o;
  o.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) i = escape_one(s, i, o, false);
  return o;
}

std::string escape_lines(std::string_view text, LineGuard g) {
  std::string o;
  o.reserve(text.size() + 8);
  size_t i = 0;
  while (i < text.size()) {
    const size_t end = std::min(text.find('\n', i), text.size());
    const size_t start = o.size();
    while (i < end) i = escape_one(text.substr(0, end), i, o, g.keep_sgr);
    if (!g.keep_commands) {
      size_t k = start;
      while (k < o.size())
        if (const size_t n = blank_length(o, k))
          k += n;
        else
          break;
      if (o.compare(k, 2, "::") == 0) o.replace(k, 1, "\\x3a");
    }
    if (end < text.size()) o += '\n';
    i = end + 1;
  }
  return o;
}

}  // namespace dynemb
