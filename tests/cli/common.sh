# Shared by tests/cli/test_*.sh (sourced, not run): a scratch directory removed on exit, and
# the ok/fail reporting every CLI test uses; a test ends with `[[ $fails -eq 0 ]]` or its own
# summary of $fails.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
