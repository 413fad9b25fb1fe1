#!/usr/bin/env bash
# Every reference in the sources and docs stays inside the repository: no citation of a
# semantics or format spec, guide or issue tracker that a reader of this tree cannot open
# (the project's own pages are docs/semantics.md, docs/plan-format.md, docs/capture-format.md).
set -uo pipefail
src=${DYNEMB_SRC:?}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail

pattern='rw-semantics\|guides/\|shared/spec\|issue [0-9]\|issue #[0-9]'
dirs=(cli lib kernels backends bench man docs)

# The pattern itself catches each kind of outside reference (so a broken pattern cannot pass).
mkdir -p "$tmp/probe"
printf '%s\n' '// (rw-semantics.md §3.2)' '# guides/workloads.md' '// shared/spec/plan-format.md' \
  '// issue 12 item 2' '// (issue #24)' >"$tmp/probe/x.cpp"
n=$(grep -rc "$pattern" "$tmp/probe/x.cpp")
[[ "$n" == 5 ]] && ok "the pattern catches all 5 probe lines" || fail "the pattern catches $n of 5 probe lines"

for d in "${dirs[@]}"; do
  [[ -d "$src/$d" ]] || fail "no directory $d/ to check"
done
hits=$(cd "$src" && grep -rnI "$pattern" "${dirs[@]}")
if [[ -z "$hits" ]]; then
  ok "no reference outside the repository in ${dirs[*]}"
else
  fail "references outside the repository (cite docs/ or state the fact):"
  sed 's/^/    /' <<<"$hits"
fi

echo "# $fails failure(s)"
[[ $fails -eq 0 ]]
