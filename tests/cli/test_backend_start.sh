#!/usr/bin/env bash
# A backend that is still starting (a GPU's context takes a sizeable part of a second): the replay
# goes on without it as far as it can. The checks that need no backend (the contexts') are
# decided meanwhile and recorded once it has started, and a batch run one destination at a time
# reads its units ahead while it waits. The test hook DYNEMB_BACKEND_START_MS makes the CPU
# reference start that late. Every capture below is replayed with and without the delay: the text
# report, --json (argv aside) and --junit must be the same bytes, clean or with planted faults (a
# golden output, a ctx field, a missing dataset with and without --fail-fast), with the passes
# kept (a JSON or JUnit report asked for) or only counted (the text report alone). Then the timeline (DYNEMB_TRACE): more than one unit of the first batch
# was read before the backend had started.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "skipped: no h5py for $DYNEMB_PYTHON"; exit 77; }
. "$(dirname "$0")/common.sh"
need_test_hooks
cd "$tmp" || exit 1

mutate() {  # mutate FILE PYTHON: run PYTHON with f = the file opened r+
  "$DYNEMB_PYTHON" - "$1" "$2" <<'PY' || fail "mutate $1"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    exec(sys.argv[2])
PY
}

# same NAME CAPTURE WANT [REPLAY ARGS...]: the reports of a backend ready at once and of one
# that starts 400 ms late are the same bytes (exit WANT both ways).
same() {
  local name=$1 cap=$2 want=$3
  shift 3
  "$DYNEMB" replay "$cap" --backend cpu --json "$name.0.json" --junit "$name.0.xml" "$@" \
    >"$name.0.txt" 2>"$name.0.err"
  local rc0=$?
  DYNEMB_BACKEND_START_MS=400 "$DYNEMB" replay "$cap" --backend cpu --json "$name.1.json" \
    --junit "$name.1.xml" "$@" >"$name.1.txt" 2>"$name.1.err"
  local rc1=$?
  expect_rc "$name (ready at once)" "$want" "$rc0"
  expect_rc "$name (starting late)" "$want" "$rc1"
  cmp -s "$name.0.txt" "$name.1.txt" || {
    fail "$name: the text reports differ"
    diff "$name.0.txt" "$name.1.txt" | head -8
    return
  }
  cmp -s "$name.0.xml" "$name.1.xml" || { fail "$name: the JUnit reports differ"; return; }
  "$DYNEMB_PYTHON" - "$name.0.json" "$name.1.json" <<'PY' || { fail "$name: the JSON reports differ"; return; }
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for r in (a, b):
    r.pop("argv")
sys.exit(0 if a == b else 1)
PY
  ok "$name: the same report with a backend starting late (exit $want)"
}

# same_text NAME CAPTURE WANT: the same with the text report alone (the passes only counted).
same_text() {
  local name=$1 cap=$2 want=$3
  "$DYNEMB" replay "$cap" --backend cpu >"$name.0.txt" 2>/dev/null
  local rc0=$?
  DYNEMB_BACKEND_START_MS=400 "$DYNEMB" replay "$cap" --backend cpu >"$name.1.txt" 2>/dev/null
  local rc1=$?
  expect_rc "$name (ready at once)" "$want" "$rc0"
  expect_rc "$name (starting late)" "$want" "$rc1"
  cmp -s "$name.0.txt" "$name.1.txt" || { fail "$name: the text reports differ"; return; }
  ok "$name: the same text report with a backend starting late (exit $want)"
}

"$DYNEMB" synth --preset unit-pooled-w8 --batch-size 512 --batches 3 --seed 5 -o pooled.h5 \
  >/dev/null || fail "synth pooled"
"$DYNEMB" synth --preset unit-seq-w8 --batches 3 --seed 5 -o seq.h5 >/dev/null || fail "synth seq"
"$DYNEMB" synth --preset unit-seq-w8 --store ctx,output --batches 2 --seed 5 -o derived.h5 \
  >/dev/null || fail "synth derived"
cp pooled.h5 gold.h5
mutate gold.h5 'd = f["batches/1/rank3/output"]; v = d[...]; v.flat[7] += 1; d[...] = v'
cp seq.h5 ctx.h5
mutate ctx.h5 'd = f["batches/0/rank1/ctx/input_splits"]; v = d[...]; v[0] += 1; v[1] -= 1; d[...] = v'
cp pooled.h5 gone.h5
mutate gone.h5 'del f["batches/1/rank2/values"]'

for c in pooled seq derived; do
  same "$c" "$c.h5" 0
  same_text "$c-counted" "$c.h5" 0
done
same_text gold-counted gold.h5 1
same gold gold.h5 1
same ctx ctx.h5 1
same gone gone.h5 2
same gone-ff gone.h5 2 --fail-fast
same fixture "$DYNEMB_SRC/fixtures/pooled-vbe.h5" 0

# While the backend starts (1.5 s late), the first batch's units are read ahead: more than the
# one a replay keeps in flight otherwise (a unit is two reads: its blocks, its golden rows).
DYNEMB_BACKEND_START_MS=1500 DYNEMB_TRACE=trace.json "$DYNEMB" replay pooled.h5 --backend cpu -q \
  >/dev/null 2>trace.err || fail "trace: exit $?: $(head -3 trace.err)"
"$DYNEMB_PYTHON" - trace.json <<'PY' || fail "trace: the units were not read ahead while the backend started"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
started = [e["ts"] + e["dur"] for e in ev if e["name"] == "backend start"]
assert len(started) == 1, started
units = [e for e in ev if e["name"] == "read rows" and e["ts"] + e["dur"] <= started[0]]
print(f"{len(units)} reads of unit rows done before the backend started")
sys.exit(0 if len(units) >= 3 else 1)
PY
[[ $fails -eq 0 ]] && ok "trace: units read while the backend started"

[[ $fails -eq 0 ]] && echo "backend start: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
