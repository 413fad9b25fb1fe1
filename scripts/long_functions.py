#!/usr/bin/env python3
"""Finds C++/CUDA function bodies longer than MAX_LINES lines in lib/, backends/, cli/ and
bench/ and fails unless the function says why it is long: a `long: <reason>` comment on its
first line or in the comment block right above it.

    scripts/long_functions.py [SOURCE_ROOT]     (run by CTest as `long_functions`)

A brace-counting heuristic over the source with comments, strings and preprocessor lines
blanked: a `{` at namespace, extern "C" or class scope whose header (the text since the last
`;`, `{` or `}` there) holds a `(` opens a function; namespaces, classes/structs/enums and
`= {` initializers are not functions; lambdas and local classes are part of their function.
A constructor's brace member initializer (`: a_{x} {`) continues the function it starts.
Body length = lines from the `{` to the matching `}`, both included.
"""
import os
import re
import sys

MAX_LINES = 120
DIRS = ("lib", "backends", "cli", "bench")
EXTS = (".cpp", ".hpp", ".h", ".cc", ".cu", ".cuh")

# Long functions that are being split right now, with lib/replay/replay.cpp:
# "path:function" -> why it is allowed until then. An entry that is no longer long is
# reported, so that it can be removed.
ALLOW = {
}


def blank(text):
    """Comments, string/char literals (contents) and preprocessor lines -> spaces; newlines
    are kept, so offsets and line numbers stay those of the source."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True

    def fill(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if line_start and c == "#":  # preprocessor line (with continuations)
            j = i
            while j < n and not (text[j] == "\n" and text[j - 1] != "\\"):
                j += 1
            fill(i, j)
            i = j
            continue
        if c == "\n":
            line_start = True
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            fill(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            fill(i, j)
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            fill(i + 2, end - 1)
            i = end
        elif c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum()):  # digit separator 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            fill(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def strip_template(h):
    h = h.strip()
    while h.startswith("template"):
        k = h.find("<")
        if k < 0:
            break
        depth, j = 0, k
        while j < len(h):
            depth += {"<": 1, ">": -1}.get(h[j], 0)
            if depth == 0:
                break
            j += 1
        h = h[j + 1:].strip()
    return h


def classify(header):
    h = strip_template(re.sub(r"\s+", " ", header))
    h = re.sub(r"\balignas\s*\([^)]*\)", "", h).strip()
    if re.match(r"^(inline )?namespace\b", h) or re.match(r'^extern\s*"', h):
        return "scope"
    if re.match(r"^(typedef )?(class|struct|union|enum)\b", h) and "(" not in h:
        return "scope"
    if h.endswith("=") or "(" not in h:
        return "other"
    return "function"


def function_name(header):
    h = strip_template(re.sub(r"\s+", " ", header))
    m = re.search(r"((?:[\w~]+::)*(?:operator\s*\S+?|[\w~]+))\s*\(", h)
    return m.group(1) if m else h[:40]


def functions(text):
    """(name, header first line, body first line, body last line) of every function."""
    b = blank(text)
    line_of = []
    ln = 1
    for ch in b:
        line_of.append(ln)
        ln += ch == "\n"
    stack = []  # [kind, `{` offset, name, header first line] of each open brace
    boundary = 0  # offset after the last ; { } at namespace/class scope
    found = []
    just_closed = False  # a function closed at namespace/class scope, nothing after it yet
    for i, ch in enumerate(b):
        if ch not in ";{}":
            continue
        if any(e[0] != "scope" for e in stack):  # inside a function or initializer
            if ch == "{":
                stack.append(["nested", i, None, None])
            elif ch == "}":
                kind, start, name, hline = stack.pop()
                if kind == "function":
                    found.append((name, hline, line_of[start], line_of[i]))
                    just_closed = True
                if kind != "nested":
                    boundary = i + 1
            continue
        if ch == "{":
            header = b[boundary:i]
            kind = classify(header)
            hline = line_of[boundary + len(header) - len(header.lstrip())] if header.strip() \
                else line_of[i]
            name = function_name(header)
            if just_closed and kind != "scope" and re.fullmatch(r"\s*(,[\s\w:()<>.,]*)?", header):
                # `: a_{x}, b_(y) {`: that `{...}` was a member initializer of this function.
                name, hline = found.pop()[:2]
                kind = "function"
            stack.append([kind, i, name, hline])
        elif ch == "}" and stack:
            stack.pop()
        boundary = i + 1
        just_closed = False
    return found


def has_reason(lines, hline):
    """`long:` on the function's first line or in the comment block right above it."""
    if "long:" in lines[hline - 1]:
        return True
    k = hline - 2
    while k >= 0 and lines[k].lstrip().startswith("//"):
        if "long:" in lines[k]:
            return True
        k -= 1
    return False


def self_test():
    """The heuristic on small sources whose answer is known: (name, body lines) found."""
    body = "  x += 1;\n" * 3
    src = (
        "namespace a {\nnamespace {\n"
        "struct S {\n  int m() const {\n" + body + "    return 1;\n  }\n  int v{2};\n};\n"
        "}  // namespace\n"
        "// a comment with { and \"\n"
        "template <class T>\nT f(T x) {\n  auto l = [&](int y) {\n" + body + "  };\n"
        "  const char* s = \"}{\";\n  return x;\n}\n"
        "Foo::Foo(int x) : a_{x}, b_(x) {\n" + body + "}\n"
        "const int kT[] = {1, 2, 3};\n"
        "extern \"C\" {\nvoid g() {\n#define M {\n  char c = '{';\n#undef M\n}\n}\n"
        "}  // namespace a\n")
    got = [(n, e - b + 1) for n, _, b, e in functions(src)]
    want = [("m", 6), ("f", 9), ("Foo::Foo", 5), ("g", 5)]
    if got != want:
        print(f"self-test failed: found {got}, want {want}")
        return False
    lines = ["// long: a table", "int f() {"]
    if not has_reason(lines, 2) or has_reason(["// short", "int f() {"], 2):
        print("self-test failed: has_reason")
        return False
    return True


def main():
    if not self_test():
        return 1
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    bad, long_allowed = [], set()
    checked = 0
    for d in DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            for f in sorted(files):
                if not f.endswith(EXTS):
                    continue
                p = os.path.join(dirpath, f)
                rel = os.path.relpath(p, root)
                text = open(p, encoding="utf-8", errors="replace").read()
                lines = text.split("\n")
                for name, hline, bstart, bend in functions(text):
                    checked += 1
                    length = bend - bstart + 1
                    if length <= MAX_LINES:
                        continue
                    key = f"{rel}:{name}"
                    if key in ALLOW:
                        long_allowed.add(key)
                        continue
                    if not has_reason(lines, hline):
                        bad.append(f"{rel}:{hline}: {name}: {length} lines (> {MAX_LINES}): split it, "
                                   "or say why above it with a `// long: <reason>` comment")
    for key in sorted(set(ALLOW) - long_allowed):
        print(f"note: {key} is in the allow-list but no longer long: remove it")
    for line in bad:
        print(line)
    print(f"# {checked} functions checked, {len(bad)} too long without a reason")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
