# Shared by tests/cli/test_*.sh (sourced, not run): a scratch directory removed on exit, and
# the ok/fail reporting every CLI test uses; a test ends with `[[ $fails -eq 0 ]]` or its own
# summary of $fails.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
# Helpers of the nothing-lost tests (tests/cli/test_outputs.sh, test_disk_full.sh, ...):
# sha FILE: its sha256. expect_rc NAME WANT GOT: a signal exit (>= 128) is always a failure.
# no_temps DIR NAME: no "*.tmp-*" left under DIR. has_text FILE TEXT NAME: fixed-string grep.
sha() { sha256sum "$1" | cut -d' ' -f1; }
expect_rc() {
  if (($3 >= 128)); then
    fail "$1: exit $3 (by signal $(($3 - 128))), want $2"
  elif [[ "$3" != "$2" ]]; then
    fail "$1: exit $3, want $2"
  fi
}
no_temps() {
  local left
  left=$(find "$1" -name '*.tmp-*' 2>/dev/null)
  [[ -z "$left" ]] || fail "$2: temporary files left: $left"
}
has_text() {
  grep -qF -- "$2" "$1" || {
    fail "$3: no '$2' in $1:"
    sed 's/^/    /' "$1" | head -20
  }
}
