#!/usr/bin/env bash
# The lockstep split of `mpirun -np P dynemb-dist replay` (docs/multi-node.md), the one
# `--backend nccl` takes under a launcher: every process replays every batch whole, runs the
# output dist on every rank, and records only its block of ranks' checks; process 0 merges them
# per batch. The test hook DYNEMB_TEAM_SPLIT=lockstep (builds with test hooks) takes it on the CPU
# backend, and each process says so on stderr. With 2 and 3 processes the text report, --json and
# --junit are byte for byte the one-process ones (argv aside): two fixtures, a pooled VBE synth
# capture, a planted golden output value and a planted context field.
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

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, expect_rc
if ! has_test_hooks; then
  echo "skipped: $DYNEMB reads no test hooks (DYNEMB_TEAM_SPLIT): configure with -DDYNEMB_TEST_HOOKS=ON"
  exit 77
fi
# As tests/cli/test_mpi.sh: root, -np 3 on 2 cores, unbound processes (the header's thread
# count), full stacks for LeakSanitizer under mpirun.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
lsan_mpi="suppressions=$DYNEMB_SRC/tests/cli/mpi_lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
cd "$tmp" || exit 1

plant() {  # plant NAME BASE PYTHON: a copy of BASE.h5 with one defect
  cp "$2.h5" "$1.h5"
  "$DYNEMB_PYTHON" - "$1.h5" "$3" <<'PY' || fail "plant $1 failed"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    exec(sys.argv[2])
PY
}
json_same() {  # the two JSON reports, argv aside
  "$DYNEMB_PYTHON" - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for r in (a, b):
    r.pop("argv")
sys.exit(0 if a == b else 1)
PY
}

export DYNEMB_TEAM_SPLIT=lockstep  # without a launcher (the one-process runs) it means nothing

# same NAME NP WANT_RC CAPTURE [ARGS...]: one process, then `mpirun -np NP` in lockstep: the same
# exit status, text report, JUnit and JSON (argv aside), and every process said it took the
# lockstep split with its block of ranks.
same() {
  local name=$1 np=$2 want=$3 cap=$4 q
  shift 4
  if [[ ! -e "$name.1.rc" ]]; then
    timeout 300 "$DYNEMB" replay "$cap" --json "$name.1.json" --junit "$name.1.xml" "$@" \
      >"$name.1.txt" 2>"$name.1.err"
    echo $? >"$name.1.rc"
    ! grep -q DYNEMB_TEAM_SPLIT "$name.1.err" || fail "$name: one process took a team split"
  fi
  LSAN_OPTIONS=$lsan_mpi timeout 300 "$MPIRUN" -np "$np" "$DYNEMB" replay "$cap" \
    --json "$name.$np.json" --junit "$name.$np.xml" "$@" >"$name.$np.txt" 2>"$name.$np.err"
  local rcn=$?
  expect_rc "$name (one process)" "$want" "$(cat "$name.1.rc")"
  expect_rc "$name (mpirun -np $np)" "$want" "$rcn"
  for ((q = 0; q < np; ++q)); do
    grep -q "DYNEMB_TEAM_SPLIT: process $q of $np: lockstep, ranks \[" "$name.$np.err" || {
      fail "$name -np $np: process $q did not say it took the lockstep split"
      sed 's/^/    /' "$name.$np.err" | head
      return
    }
  done
  if ! cmp -s "$name.1.txt" "$name.$np.txt"; then
    fail "$name: the text reports of 1 and $np processes differ"
    diff "$name.1.txt" "$name.$np.txt" | head -10
    return
  fi
  cmp -s "$name.1.xml" "$name.$np.xml" || { fail "$name -np $np: the JUnit reports differ"; return; }
  json_same "$name.1.json" "$name.$np.json" || { fail "$name -np $np: the JSON reports differ"; return; }
  ok "$name: -np $np in lockstep gives the one-process report (exit $want)"
}

for n in pooled-mean-vbe-weighted seq-mixed-dist; do
  same "$n" 2 0 "$DYNEMB_SRC/fixtures/$n.h5"
  same "$n" 3 0 "$DYNEMB_SRC/fixtures/$n.h5"
done
# W = 8 over 2 and 3 processes: ranks [0, 4) [4, 8), and [0, 2) [2, 5) [5, 8).
"$DYNEMB" synth --preset unit-pooled-w8 --vbe --batches 3 --batch-size 4 --seed 7 -o vbe.h5 >/dev/null ||
  fail "synth vbe"
same vbe 2 0 vbe.h5
grep -q "DYNEMB_TEAM_SPLIT: process 1 of 2: lockstep, ranks \[4, 8)" vbe.2.err || fail "vbe: process 1's ranks"
same vbe 3 0 vbe.h5
grep -q "DYNEMB_TEAM_SPLIT: process 2 of 3: lockstep, ranks \[5, 8)" vbe.3.err || fail "vbe: process 2's ranks"
# A golden output value of rank 6 (process 1 of 2's, process 2 of 3's).
plant gold vbe 'd = f["batches/1/rank6/output"]; v = d[...]; v.flat[2] += 1; d[...] = v'
same gold 2 1 gold.h5
same gold 3 1 gold.h5
grep -q "batch 1 rank 6 output golden" gold.3.txt || fail "gold: rank 6's golden is not reported"
# A context field of rank 1: the context checks (process 0) and the output dist's failure,
# recorded by the process of its rank before every process's skipped output checks.
"$DYNEMB" synth --preset unit-seq-w8 --batches 2 --batch-size 4 --seed 7 -o seq.h5 >/dev/null || fail "synth seq"
plant ctx seq 'd = f["batches/1/rank6/ctx/input_splits"]; v = d[...]; v[0] += 1; v[1] -= 1; d[...] = v'
same ctx 2 1 ctx.h5
same ctx 3 1 ctx.h5

[[ $fails -eq 0 ]]
