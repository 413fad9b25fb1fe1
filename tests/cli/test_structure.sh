#!/usr/bin/env bash
# The shape the code keeps (docs/architecture.md): every file of lib/replay under 400 lines and
# every kernel file under 500; one routine checks the outputs of every unit and one the lookups;
# the Backend seam has at most 8 virtual methods and no class forwards it; BENCHMARKS.md stays
# a page (under 150 lines).
source "$(dirname "$0")/common.sh"
cd "$DYNEMB_SRC" || exit 1

# longer NAME MAX FILES...: every file has fewer than MAX lines.
longer() {
  local name=$1 max=$2 f n over=0
  shift 2
  for f in "$@"; do
    n=$(wc -l <"$f")
    if ((n >= max)); then fail "$name: $f has $n lines (want fewer than $max)"; over=1; fi
  done
  ((over)) || ok "$name: $# files under $max lines"
}
longer replay 401 lib/replay/*.cpp lib/replay/*.hpp
longer kernels 500 $(find kernels -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.hpp' -o -name '*.h' \))
longer benchmarks 151 BENCHMARKS.md

# The one output check and the one lookup check: each defined once, and nothing else in
# lib/replay diffs an output against its golden output or reference.
n=$(grep -hE '^[A-Za-z].*OutputChecks::check\(' lib/replay/*.cpp | wc -l)
[[ $n -eq 1 ]] && ok "one output-check routine" || fail "OutputChecks::check defined $n times"
n=$(grep -hE '^[A-Za-z].*LookupChecks::check\(' lib/replay/*.cpp | wc -l)
[[ $n -eq 1 ]] && ok "one lookup-check routine" || fail "LookupChecks::check defined $n times"
others=$(grep -lE '"golden", "replayed", "golden"|"reference", "replayed", "reference"' lib/replay/*.cpp | grep -v output_check.cpp)
[[ -z $others ]] && ok "golden and reference checks made in output_check.cpp only" ||
  fail "output checks made outside output_check.cpp: $others"

# The seam: virtual methods of class Backend (between its line and the next class).
n=$(awk '/^class Backend \{/{on=1} on&&/^};/{on=0} on&&/virtual /&&!/~Backend/' lib/engine/backend.hpp | wc -l)
((n >= 1 && n <= 8)) && ok "Backend has $n virtual methods" || fail "Backend has $n virtual methods (want 1 to 8)"
fwd=$(grep -rlE 'class [A-Za-z]*Forwarding|Backend& inner\(\)' lib backends bench || true)
[[ -z $fwd ]] && ok "no forwarding backend" || fail "a forwarding backend: $fwd"

[[ $fails -eq 0 ]]
