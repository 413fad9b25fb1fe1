#!/usr/bin/env bash
# Every environment variable the product reads (lib/, cli/, backends/, bench/, kernels/) by its
# name is either a documented setting, listed in the man page's ENVIRONMENT and in docs/cli.md's
# Environment table, or one of the tests' hooks, read only through lib/common/test_hooks.cpp
# (a build configured with -DDYNEMB_TEST_HOOKS=ON); a hook is no documented setting.
set -uo pipefail
src=${DYNEMB_SRC:?}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail

cd "$src" || exit 1
hooks=$(grep -ohE '"DYNEMB_[A-Z0-9_]+"' lib/common/test_hooks.cpp | tr -d '"' | sort -u)
[[ -n "$hooks" ]] || fail "no hooks found in lib/common/test_hooks.cpp"
# NAME<TAB>FILE for each read by name: getenv("X") or env::seconds/count/size/choice("X").
grep -rnoE --include='*.cpp' --include='*.hpp' --include='*.cu' --include='*.cuh' \
  '(getenv|env::(seconds|count|size|choice))\("[A-Z][A-Z0-9_]*"' lib cli backends bench kernels |
  grep -v '^lib/common/test_hooks.cpp:' |
  sed -E 's/^([^:]+):([0-9]+):.*\("([A-Z0-9_]+)"$/\3\t\1:\2/' | sort -u >"$tmp/reads"
[[ -s "$tmp/reads" ]] || fail "no environment reads found"
man_env=$(awk '$0 == ".SH ENVIRONMENT" {on = 1; next} on && /^\.SH / {exit} on' man/dynemb-dist.1 |
  sed -n 's/^\.B \([A-Z][A-Z0-9_]*\).*/\1/p' | sort -u)
doc_env=$(awk '$0 == "## Environment" {on = 1; next} on && /^## / {exit} on' docs/cli.md |
  sed -n 's/^| `\([A-Z][A-Z0-9_]*\)`.*/\1/p' | sort -u)
[[ -n "$doc_env" ]] || fail "docs/cli.md has no Environment table"

while IFS=$'\t' read -r name where; do
  if grep -qx "$name" <<<"$hooks"; then
    fail "$where reads the test hook $name itself: read it through common/test_hooks.hpp"
  fi
done <"$tmp/reads"
for name in $(cut -f1 "$tmp/reads" | sort -u); do
  grep -qx "$name" <<<"$hooks" && continue
  [[ $name == NCCL_* ]] && name='NCCL_*'
  before=$fails
  grep -qxF "$name" <<<"$man_env" || fail "$name is read but not in the man page's ENVIRONMENT"
  grep -qxF "$name" <<<"$doc_env" || fail "$name is read but not in docs/cli.md's Environment table"
  [[ $fails -eq $before ]] && ok "$name documented"
done
# check_all (lib/common/env.cpp) judges only the documented settings and the hooks.
for name in $(grep -ohE '"DYNEMB_[A-Z0-9_]+"' lib/common/env.cpp | tr -d '"' | sort -u); do
  printf '%s\n%s\n' "$hooks" "$man_env" | grep -qx "$name" || fail "env.cpp judges $name, neither documented nor a hook"
done
for name in $hooks; do
  grep -qx "$name" <<<"$man_env" && fail "the test hook $name is listed in the man page's ENVIRONMENT"
  grep -qx "$name" <<<"$doc_env" && fail "the test hook $name is listed in docs/cli.md's Environment"
done
[[ $fails -eq 0 ]]
