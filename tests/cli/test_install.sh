#!/usr/bin/env bash
# `cmake --install BUILD --prefix P` puts bin/dynemb-dist and share/man/man1/dynemb-dist.1 in
# place, and the installed binary and man page are the ones of this build/tree.
# The build dir is the parent of $DYNEMB (the test environment's binary path).
set -uo pipefail
exe=${DYNEMB:?}
src=${DYNEMB_SRC:?}
build=$(dirname "$exe")
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail

if [[ ! -f "$build/cmake_install.cmake" ]]; then
  echo "FAIL: $build is not a CMake build directory (no cmake_install.cmake)"
  exit 1
fi
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/log" 2>&1 || fail "cmake --install: $(cat "$tmp/log")"

bin="$tmp/prefix/bin/dynemb-dist"
man="$tmp/prefix/share/man/man1/dynemb-dist.1"
[[ -x "$bin" ]] && ok "bin/dynemb-dist installed and executable" || fail "no executable $bin"
[[ -f "$man" ]] && ok "share/man/man1/dynemb-dist.1 installed" || fail "no $man"
cmp -s "$man" "$src/man/dynemb-dist.1" && ok "man page is the tree's" || fail "installed man page differs from man/dynemb-dist.1"

# The installed binary runs (its RPATH does not point into the build) and is this build.
v_inst=$("$bin" --version 2>&1) || fail "installed binary: --version exit $?"
v_build=$("$exe" --version 2>&1)
[[ -n "$v_inst" && "$v_inst" == "$v_build" ]] && ok "installed --version: $v_inst" || fail "--version '$v_inst' vs build '$v_build'"
out=$("$bin" 2>&1) && grep -q 'dynemb-dist validate PLAN.yaml' <<<"$out" && ok "installed binary prints the short usage" || fail "short usage: $out"

# man finds the page under the prefix (MANPATH); skipped where man or its formatter (nroff,
# from groff) is not installed (CI installs both).
if command -v man >/dev/null 2>&1 && command -v nroff >/dev/null 2>&1; then
  if MANPATH="$tmp/prefix/share/man" MANWIDTH=100 man dynemb-dist 2>/dev/null | grep -q 'EXIT STATUS'; then
    ok "man dynemb-dist renders from the prefix"
  else
    fail "man dynemb-dist with MANPATH=$tmp/prefix/share/man"
  fi
else
  echo "skip: man dynemb-dist from the prefix (man or nroff not installed)"
fi

[[ $fails -eq 0 ]] || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
