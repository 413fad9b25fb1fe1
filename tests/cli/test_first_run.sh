#!/usr/bin/env bash
# First run: no arguments prints a short usage with the commands to start with, and
# the common mistakes get an error that says what to do next.
set -uo pipefail
exe=${DYNEMB:?}
py=${DYNEMB_PYTHON:-python3}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail
cd "$tmp" || exit 1
unset GITHUB_ACTIONS

out=$("$exe" 2>&1)
rc=$?
[[ $rc -eq 0 ]] && ok "no arguments: exit 0" || fail "no arguments: exit $rc"
for c in 'dynemb-dist validate PLAN.yaml' 'dynemb-dist synth --preset' 'dynemb-dist replay CAPTURE.h5' "dynemb-dist --help"; do
  grep -qF -- "$c" <<<"$out" && ok "short usage shows '$c'" || fail "short usage lacks '$c': $out"
done
[[ $(wc -l <<<"$out") -le 15 ]] && ok "short usage is short" || fail "short usage has $(wc -l <<<"$out") lines"

# A mistyped command: the commands, and the closest one.
out=$("$exe" replya x.h5 2>&1)
rc=$?
[[ $rc -eq 2 ]] && grep -qF "unknown command 'replya'; did you mean 'replay'?" <<<"$out" \
  && grep -qF "commands: validate, synth, inspect, replay, bench, merge" <<<"$out" \
  && ok "unknown command: did you mean, exit 2" || fail "unknown command: exit $rc: $out"

# A usage error in a subcommand points at that subcommand's --help.
out=$("$exe" replay 2>&1)
rc=$?
[[ $rc -eq 2 ]] && grep -qF "dynemb-dist replay: error: CAPTURE is required" <<<"$out" \
  && grep -qF "Run 'dynemb-dist replay --help' for its options" <<<"$out" \
  && ok "missing argument: names the command's --help" || fail "missing argument: exit $rc: $out"
out=$("$exe" replay x.h5 --ctx capturd 2>&1)
rc=$?
[[ $rc -eq 2 ]] && grep -q "captured" <<<"$out" && ok "bad --ctx value lists the choices" || fail "bad --ctx: exit $rc: $out"

# Unknown preset: the presets.
out=$("$exe" synth --preset unit-seq-w4 -o c.h5 2>&1)
rc=$?
[[ $rc -eq 2 ]] && grep -qF "unknown preset 'unit-seq-w4' (presets: " <<<"$out" && grep -q "unit-seq-w2" <<<"$out" \
  && ok "unknown preset lists the presets" || fail "unknown preset: exit $rc: $out"
[[ ! -e c.h5 ]] && ok "nothing written" || fail "c.h5 written after an error"

# --ctx captured on a capture without ctx/: the warning says to use --ctx derived.
"$exe" synth --preset unit-seq-w2 --seed 1 --store local_embs,output -o noctx.h5 >/dev/null || fail "synth noctx"
out=$("$exe" replay noctx.h5 --ctx captured --quiet 2>&1)
rc=$?
[[ $rc -eq 0 ]] && grep -q "has no ctx/ group.*--ctx derived" <<<"$out" \
  && ok "no ctx/: warning suggests --ctx derived" || fail "no ctx/: exit $rc: $out"

# No oracle, no weights, no local_embs: the output dist cannot run; say what would let it.
"$exe" synth --preset unit-seq-w2 --seed 1 --store ctx,output -o nolocal.h5 >/dev/null || fail "synth nolocal"
"$py" -c 'import h5py; f = h5py.File("nolocal.h5", "r+"); del f["oracle"]' || fail "removing /oracle"
out=$("$exe" replay nolocal.h5 --quiet 2>&1)
rc=$?
grep -q "no local_embs and there is no embedding source.*--store local_embs, or add /oracle" <<<"$out" \
  && ok "no source: warning says how to get one (exit $rc)" || fail "no source: exit $rc: $out"

[[ $fails -eq 0 ]] || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
