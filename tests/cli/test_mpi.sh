#!/usr/bin/env bash
# `mpirun -np P dynemb-dist replay` (docs/multi-node.md): the processes split the batches, or each
# batch by destination rank blocks, and process 0 writes the one report, byte for byte what one
# process writes (argv aside): the text report, --json, --junit and --write-output, for every
# fixture, multi-batch synth captures, a W = 512 capture of one and of two batches split by rank
# blocks, and planted faults (a golden output, a ctx field, a missing dataset, an id out of its
# table, --fail-fast, the passes listed or counted). A process killed mid-run ends
# the run with exit 2 and a line naming it, in bounded time, with no temporary left.
# Env (tests/CMakeLists.txt): DYNEMB, DYNEMB_SRC, DYNEMB_PYTHON, DYNEMB_HAVE_MPI, DYNEMB_MPIEXEC.
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
if [[ "${DYNEMB_HAVE_MPI:-OFF}" != "ON" ]]; then
  echo "skipped: this build has no MPI (configure with -DDYNEMB_MPI=ON, libopenmpi-dev)"
  exit 77
fi
MPIRUN=${DYNEMB_MPIEXEC:-}
[[ -x "$MPIRUN" ]] || MPIRUN=$(command -v mpirun || true)
if [[ -z "$MPIRUN" ]]; then
  echo "skipped: no mpirun on PATH (apt-get install openmpi-bin)"
  exit 77
fi
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "skipped: no h5py for $DYNEMB_PYTHON"; exit 77; }

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, expect_rc, no_temps
# CI runs as root; Open MPI refuses root without these. Its own allocations kept to exit are
# not ours (LeakSanitizer under the ASan build).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1  # -np 3 on 2 cores
# Unbound (mpirun --bind-to none): the CPU backend's threads follow the process's affinity mask,
# and the report's header names their count; bound to one core each, it would say 1, not the
# one-process run's count.
export OMPI_MCA_hwloc_base_binding_policy=none
# Under mpirun, full stacks (fast_unwind_on_malloc=0, slower): the fast unwinder stops in
# libraries built without frame pointers, before the Open MPI frame the suppressions name.
lsan_mpi="suppressions=$DYNEMB_SRC/tests/cli/mpi_lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
cd "$tmp" || exit 1

mutate() {
  "$DYNEMB_PYTHON" - "$1" "$2" <<'PY' || fail "mutate $1 failed"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    exec(sys.argv[2])
PY
}
plant() {  # plant NAME BASE PYTHON: a copy of BASE.h5 with one defect
  cp "$2.h5" "$1.h5"
  mutate "$1.h5" "$3"
}
json_same() {  # the two JSON reports, argv aside
  "$DYNEMB_PYTHON" - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for r in (a, b):
    r.pop("argv")
if a != b:
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            print("first difference in", k)
            break
    sys.exit(1)
PY
}

# solo NAME CAPTURE [ARGS...]: the one-process run, NAME.1.{txt,json,xml} and its exit status
# in NAME.1.rc. same NAME NP WANT_RC CAPTURE [ARGS...]: `mpirun -np NP` gives the same exit
# status, text report, JSON (argv aside) and JUnit as NAME's one-process run (made first when
# there is none).
solo() {
  local name=$1 cap=$2
  shift 2
  timeout 600 "$DYNEMB" replay "$cap" --json "$name.1.json" --junit "$name.1.xml" "$@" \
    >"$name.1.txt" 2>"$name.1.err"
  echo $? >"$name.1.rc"
}
same() {
  local name=$1 np=$2 want=$3 cap=$4
  shift 4
  [[ -e "$name.1.rc" ]] || solo "$name" "$cap" "$@"
  LSAN_OPTIONS=$lsan_mpi timeout 600 "$MPIRUN" -np "$np" "$DYNEMB" replay "$cap" --json "$name.$np.json" \
    --junit "$name.$np.xml" "$@" >"$name.$np.txt" 2>"$name.$np.err"
  local rcn=$?
  expect_rc "$name (one process)" "$want" "$(cat "$name.1.rc")"
  expect_rc "$name (mpirun -np $np)" "$want" "$rcn"
  if ! cmp -s "$name.1.txt" "$name.$np.txt"; then
    fail "$name: the text reports of 1 and $np processes differ"
    diff "$name.1.txt" "$name.$np.txt" | head -10
    sed 's/^/    /' "$name.$np.err" | head -20
    return
  fi
  cmp -s "$name.1.xml" "$name.$np.xml" || { fail "$name -np $np: the JUnit reports differ"; return; }
  json_same "$name.1.json" "$name.$np.json" || { fail "$name -np $np: the JSON reports differ"; return; }
  ok "$name: -np $np gives the one-process report (exit $want)"
}

# ---- every fixture, with 2 processes and with 3 (more processes than batches: idle ones)
for f in "$DYNEMB_SRC"/fixtures/*.h5; do
  n=$(basename "$f" .h5)
  solo "fx-$n" "$f" -q
  want=0
  [[ $n == *oob* ]] && want=$(cat "fx-$n.1.rc")  # the bounds check the fixture's plan asks for
  same "fx-$n" 2 "$want" "$f" -q
  # Two batches: with 3 processes, one has none.
  [[ $("$DYNEMB_PYTHON" -c "import h5py, sys; print(len(h5py.File(sys.argv[1])['batches']))" "$f") -gt 1 ]] &&
    same "fx-$n" 3 "$want" "$f" -q
done

# ---- multi-batch captures: each process has batches of its own
"$DYNEMB" synth --preset unit-seq-w8 --batches 5 --batch-size 4 --seed 7 -o seq.h5 >/dev/null || fail "synth seq"
"$DYNEMB" synth --preset unit-pooled-w8 --vbe --batches 5 --batch-size 4 --seed 7 -o vbe.h5 >/dev/null || fail "synth vbe"
"$DYNEMB" synth "$DYNEMB_SRC/bench/plans/scale-seq-w512.yaml" --batches 2 --batch-size 1 --seed 7 \
  -o w512.h5 >/dev/null || fail "synth w512"
same seq 2 0 seq.h5
same seq 3 0 seq.h5
same seq-some 3 0 seq.h5 --batches 1-4
same vbe 3 0 vbe.h5
grep -q '"message": "1 matches the mode latched at batch 0"' vbe.3.json 2>/dev/null ||
  fail "vbe3: the latch checks of the later processes do not name batch 0"
same w512 2 0 w512.h5 -q

# ---- column slices on a device the processes share: each plans for its share of the free
# memory the backend reports (a keeping CPU reference with DYNEMB_DEVICE_MEMORY stands in for a
# GPU): 10 columns a slice alone, 5 with two processes, and the one-process report.
if has_test_hooks; then
  "$DYNEMB" synth --preset unit-seq-w8 --store ctx,output --batches 2 --seed 5 -o devslice.h5 \
    >/dev/null || fail "synth devslice"
  DYNEMB_HOLD_OUTPUTS=host DYNEMB_DEVICE_MEMORY=4M same devslice 2 0 devslice.h5 -q --max-memory 32M \
    --backend cpu
  grep -q "^DYNEMB_SLICE_COLUMNS: batch 0: slices of 10 columns" devslice.1.err ||
    fail "devslice: one process: $(grep -m1 SLICE devslice.1.err)"
  grep -q "^DYNEMB_SLICE_COLUMNS: batch [01]: slices of 5 columns" devslice.2.err ||
    fail "devslice: two processes: $(grep -m1 SLICE devslice.2.err)"

  # The memory budget is the host's, shared by the processes on it: under --max-memory 32M a
  # batch of this capture runs as one slice of all 128 columns in one process (it does not fit
  # whole), and in slices of 22 columns in each of two processes (16M each), with the
  # one-process report. (A slice-column hook past every width only makes the cut visible.)
  DYNEMB_SLICE_COLUMNS=100000 same budget 2 0 devslice.h5 -q --max-memory 32M --backend cpu
  grep -q "^DYNEMB_SLICE_COLUMNS: batch 0: slices of 128 columns" budget.1.err ||
    fail "budget: one process: $(grep -m1 SLICE budget.1.err)"
  grep -q "^DYNEMB_SLICE_COLUMNS: batch [01]: slices of 22 columns" budget.2.err ||
    fail "budget: two processes: $(grep -m1 SLICE budget.2.err)"
fi
# A budget that one process may use but two may not share (8M each) is refused up front by each,
# naming the share: exit 2, process 0's error report, no temporary left.
"$DYNEMB" synth --preset unit-seq-w8 --store ctx,output --batches 2 --seed 5 -o budget.h5 \
  >/dev/null || fail "synth budget"
"$DYNEMB" replay budget.h5 -q --max-memory 16M --backend cpu >/dev/null 2>budget-16.1.err
expect_rc "budget 16M (one process)" 0 $?
LSAN_OPTIONS=$lsan_mpi timeout 600 "$MPIRUN" -np 2 "$DYNEMB" replay budget.h5 -q --max-memory 16M \
  --backend cpu --json budget-16.json >budget-16.2.txt 2>budget-16.2.err
expect_rc "budget 16M (mpirun -np 2)" 2 $?
grep -q "replaying batch 0 needs about .* more than the 8.00 MiB --max-memory allows for each of the 2 processes on this host" \
  budget-16.2.err || fail "budget 16M: the refusal does not name the share: $(grep -m1 error budget-16.2.err)"
"$DYNEMB_PYTHON" - budget-16.json <<'PY' || fail "budget 16M: the JSON report is not the error report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["summary"]["status"] == "error" and r["summary"]["checks"] == 0, r["summary"]
assert "for each of the 2 processes on this host" in r["trouble"], r["trouble"]
PY
no_temps . "budget 16M"

# ---- planted faults in batches that the workers replay
plant gold seq 'd = f["batches/4/rank3/output"]; v = d[...]; v.flat[7] += 1; d[...] = v'
same gold 3 1 gold.h5
grep -q "batch 4 rank 3 output golden" gold.3.txt || fail "gold: batch 4's planted golden is not reported"
plant ctx seq 'd = f["batches/2/rank1/ctx/input_splits"]; v = d[...]; v[0] += 1; v[1] -= 1; d[...] = v'
same ctx 2 1 ctx.h5
plant latch vbe 'f["batches/3/rank0/ctx"].attrs["variable_batch_per_feature"] = 0 if f["batches/3/rank0/ctx"].attrs.get("variable_batch_per_feature", 1) else 1' 
same latch 3 1 latch.h5
grep -q "batch 3 rank 0 ctx variable_batch_per_feature" latch.3.txt ||
  { fail "latch: batch 3's flipped mode is not reported"; head -20 latch.3.txt; }
plant gone seq 'del f["batches/3/rank2/values"]'
same gone 2 2 gone.h5
same gone 3 2 gone.h5
same gone-ff 3 2 gone.h5 --fail-fast
grep -q "batches/3" gone.2.txt gone.2.err 2>/dev/null || fail "gone: the missing dataset of batch 3 is not named"

# ---- fewer batches than processes, split by destination rank blocks (captured local_embs and
# contexts): every process runs the destinations of its block, [q W / P, (q + 1) W / P); the
# DYNEMB_BY_DESTINATION=report hook (builds with test hooks) says so on stderr. The reports do
# not depend on the hook.
split_seen() {  # split_seen NAME NP LINE...: each LINE is in NAME.NP.err
  local name=$1 np=$2 line
  shift 2
  has_test_hooks || return 0
  for line in "$@"; do
    grep -qF "$line" "$name.$np.err" ||
      { fail "$name -np $np: no '$line' on stderr: the batch was not split by rank blocks"; return; }
  done
  ok "$name -np $np: split by destination rank blocks"
}
# same_text NAME NP WANT_RC CAPTURE [ARGS...]: the text report alone (the passes only counted).
same_text() {
  local name=$1 np=$2 want=$3 cap=$4
  shift 4
  timeout 600 "$DYNEMB" replay "$cap" "$@" >"$name.1.txt" 2>"$name.1.err"
  expect_rc "$name (one process)" "$want" $?
  LSAN_OPTIONS=$lsan_mpi timeout 600 "$MPIRUN" -np "$np" "$DYNEMB" replay "$cap" "$@" \
    >"$name.$np.txt" 2>"$name.$np.err"
  expect_rc "$name (mpirun -np $np)" "$want" $?
  if cmp -s "$name.1.txt" "$name.$np.txt"; then
    ok "$name: -np $np gives the one-process text report (passes counted)"
  else
    fail "$name: the text reports of 1 and $np processes differ"
    diff "$name.1.txt" "$name.$np.txt" | head -10
  fi
}
export DYNEMB_BY_DESTINATION=report
same w512-one 2 0 w512.h5 --batches 0
split_seen w512-one 2 "batch 0: one destination at a time; process 0: ranks [0, 256)" \
  "batch 0: one destination at a time; process 1: ranks [256, 512)"
same w512-one 3 0 w512.h5 --batches 0
split_seen w512-one 3 "process 1: ranks [170, 341)" "process 2: ranks [341, 512)"
same w512-both 3 0 w512.h5 -q
split_seen w512-both 3 "batch 1: one destination at a time; process 2: ranks [341, 512)"
# A planted fault in a rank of process 1's block: a golden output value.
plant w512-gold w512 'd = f["batches/0/rank300/output"]; v = d[...]; v.flat[3] += 1; d[...] = v'
same w512-gold 2 1 w512-gold.h5 --batches 0
split_seen w512-gold 2 "process 1: ranks [256, 512)"
grep -q "batch 0 rank 300 output golden" w512-gold.2.txt || fail "w512-gold: rank 300's golden is not reported"
# Pooled (one batch, not VBE; VBE with its latch), sequence: W = 8 over 2 and 3 processes, and
# their faults: a golden output, an id out of its table (--fail-fast too), a missing golden
# output, a missing local_embs and a context field (those batches then run whole, on process 0);
# the passes listed (--json, --junit) and counted (the text report alone).
"$DYNEMB" synth --preset unit-pooled-w8 --batches 1 --batch-size 4 --seed 3 -o pooled.h5 >/dev/null ||
  fail "synth pooled"
same pooled 3 0 pooled.h5
split_seen pooled 3 "process 0: ranks [0, 2)" "process 1: ranks [2, 5)" "process 2: ranks [5, 8)"
same vbe-split 3 0 vbe.h5 --batches 2-3
split_seen vbe-split 3 "batch 3: one destination at a time; process 1: ranks [2, 5)"
plant vbe-gold vbe 'd = f["batches/1/rank6/output"]; v = d[...]; v.flat[2] += 1; d[...] = v'
same vbe-gold 3 1 vbe-gold.h5 --batches 1
same_text vbe-gold-counted 2 1 vbe-gold.h5 --batches 1
same seq-one 3 0 seq.h5 --batches 4
split_seen seq-one 3 "process 2: ranks [5, 8)"
# Rank 6's third id of f0 (934, on rank 7's shard of t0) out of the table, routed to rank 7 still:
# the contexts hold, and the units of destination 6 (process 2's, of 3) meet it.
plant seq-oob seq 'd = f["batches/1/rank6/values"]; v = d[...]; assert v[2] == 934; v[2] = 1007; d[...] = v'
same seq-oob 3 2 seq-oob.h5 --batches 1
grep -q "ERROR batch 1 rank 7 lookup trouble" seq-oob.3.txt || fail "seq-oob: the id out of t0 is not reported"
split_seen seq-oob 3 "batch 1: one destination at a time; process 2: ranks [5, 8)"
grep -q "trouble in batch 1 (destination 6)" seq-oob.3.json ||
  fail "seq-oob: the skipped checks do not name destination 6 (process 2's)"
same seq-oob-ff 3 2 seq-oob.h5 --batches 0-1 --fail-fast
same_text seq-oob-counted 3 2 seq-oob.h5 --batches 1
# Rank 3's local_embs off in many rows: its blocks to every destination differ, the lookup check
# merges every process's part (--max-mismatches keeps the first 3 of all), and every output
# check, whichever process decides it, names the lookup as its cause.
plant seq-local seq 'd = f["batches/1/rank3/local_embs"]; v = d[...]; v.flat[::257] += 1; d[...] = v'
same seq-local 2 1 seq-local.h5 --batches 1 --max-mismatches 3
same seq-local 3 1 seq-local.h5 --batches 1 --max-mismatches 3
grep -q "cause: lookup/local_embs" seq-local.3.txt || fail "seq-local: no output check names the lookup"
plant seq-noout seq 'del f["batches/2/rank6/output"]'
same seq-noout 3 "$(solo seq-noout seq-noout.h5 --batches 2; cat seq-noout.1.rc)" seq-noout.h5 --batches 2
plant seq-lost seq 'del f["batches/2/rank5/local_embs"]'
same seq-lost 3 "$(solo seq-lost seq-lost.h5 --batches 2; cat seq-lost.1.rc)" seq-lost.h5 --batches 2
plant seq-ctx seq 'd = f["batches/1/rank6/ctx/input_splits"]; v = d[...]; v[0] += 1; v[1] -= 1; d[...] = v'
same seq-ctx 3 1 seq-ctx.h5 --batches 1
same_text seq-ctx-counted 3 1 seq-ctx.h5 --batches 1
# A batch without a dataset after a batch split by ranks: process 0 meets it alone (with
# --fail-fast every process stops there).
same gone-split 3 2 gone.h5 --batches 2-3
split_seen gone-split 3 "batch 2: one destination at a time; process 2: ranks [5, 8)"
same gone-ff-split 3 2 gone.h5 --batches 2-3 --fail-fast
unset DYNEMB_BY_DESTINATION

# ---- --write-output: the same file
timeout 120 "$DYNEMB" replay seq.h5 -q --write-output wo.1.h5 >/dev/null 2>&1
rc1=$?
LSAN_OPTIONS=$lsan_mpi timeout 120 "$MPIRUN" -np 2 "$DYNEMB" replay seq.h5 -q --write-output wo.2.h5 >/dev/null 2>&1
rc2=$?
expect_rc "write-output (one process)" 0 "$rc1"
expect_rc "write-output (mpirun -np 2)" 0 "$rc2"
if cmp -s wo.1.h5 wo.2.h5; then ok "--write-output: the same bytes"; else fail "--write-output: the files differ"; fi

# ---- a process killed as its first batch begins: exit 2, a line naming it, nothing left
# (the DYNEMB_MPI_KILL hook: builds with test hooks only, as scripts/test.sh makes them)
if has_test_hooks; then
  mkdir -p out
  start=$SECONDS
  before=$fails
  LSAN_OPTIONS=$lsan_mpi timeout 60 "$MPIRUN" -np 2 -x DYNEMB_MPI_KILL=1 "$DYNEMB" replay seq.h5 --json out/k.json \
    --junit out/k.xml >kill.out 2>kill.err
  rc=$?
  expect_rc "killed process" 2 "$rc"
  grep -q "process 1 of 2 (pid [0-9]*) was killed by SIGKILL" kill.err ||
    { fail "killed process: no line names it"; sed 's/^/    /' kill.err | head -20; }
  [[ -z "$(ls -A out)" ]] || fail "killed process: files left in out/: $(ls -A out)"
  no_temps "$tmp" "killed process"
  ((SECONDS - start < 60 && fails == before)) && ok "killed process: exit 2 in $((SECONDS - start)) s, nothing left"
  # Under the rank split (2 batches, 3 processes), the others wait for it in an exchange.
  start=$SECONDS
  before=$fails
  LSAN_OPTIONS=$lsan_mpi timeout 60 "$MPIRUN" -np 3 -x DYNEMB_MPI_KILL=2 "$DYNEMB" replay seq.h5 --batches 0-1 \
    --json out/k.json --junit out/k.xml >kill.out 2>kill.err
  expect_rc "killed process (rank split)" 2 $?
  grep -q "process 2 of 3 (pid [0-9]*) was killed by SIGKILL" kill.err ||
    { fail "killed process (rank split): no line names it"; sed 's/^/    /' kill.err | head -20; }
  [[ -z "$(ls -A out)" ]] || fail "killed process (rank split): files left in out/: $(ls -A out)"
  no_temps "$tmp" "killed process (rank split)"
  ((SECONDS - start < 60 && fails == before)) &&
    ok "killed process (rank split): exit 2 in $((SECONDS - start)) s, nothing left"
else
  echo "skipped: killed process ($DYNEMB reads no test hooks: a build without -DDYNEMB_TEST_HOOKS=ON)"
fi

# ---- trouble before the replay (a report onto the capture): exit 2 and its message, no hang
LSAN_OPTIONS=$lsan_mpi timeout 60 "$MPIRUN" -np 2 "$DYNEMB" replay seq.h5 --json seq.h5 >clash.out 2>&1
expect_rc "output clash" 2 $?
grep -q "json" clash.out || fail "output clash: no message names --json"

# ---- without a launcher the hook means nothing: the same binary replays as one process
DYNEMB_MPI_KILL=1 timeout 120 "$DYNEMB" replay seq.h5 -q >solo.out 2>&1
expect_rc "no launcher" 0 $?

[[ $fails -eq 0 ]]
