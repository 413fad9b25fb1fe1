#!/usr/bin/env bash
# Outputs kept where the backend makes them (Place::kept, engine/backend.hpp): a replay on a
# device backend compares the dist's outputs there with the golden output and the unsharded
# reference, and brings back only the tiles that differ. Those paths are the same code on the
# host when the CPU reference keeps what a step may keep, as a device does (the test hook
# DYNEMB_HOLD_OUTPUTS=host, which makes it say on stderr how many outputs it kept, how many
# checks were made on them and how many lookups it kept for a dist, as a device keeps a column
# slice's). Every capture below is replayed both ways, and
# the JSON reports must agree check for check (messages, counts, first mismatch coordinates,
# causes), the exit codes and stderr too; and the held paths must have run (or, where the host
# needs whole outputs, must not have). Each of the replay's three ways is covered: one
# destination at a time (the fixtures as they are), the whole batch (DYNEMB_BY_DESTINATION=off)
# and column slices (DYNEMB_SLICE_COLUMNS), on clean captures and on ones with planted faults.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
# DYNEMB_BACKEND=cuda (on the GPU machine): the second replay of each pair runs on the CUDA
# backend, which holds and keeps on the device, instead of the wrapped CPU reference; the same
# reports are required (the held counts are the wrapper's and are not checked then).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }
. "$(dirname "$0")/common.sh"
need_test_hooks
cd "$tmp" || exit 1

# same NAME CAPTURE [REPLAY ARGS...]: unheld vs held. HELD=0 when no output may be held;
# KEPT=1 when the dist's lookups must have been kept (column slices: lookups with Place::kept).
same() {
  local name=$1 cap=$2
  shift 2
  "$DYNEMB" replay "$cap" --backend cpu --quiet --json "$name.host.json" "$@" \
    >/dev/null 2>"$name.host.err"
  local rc_host=$?
  if [[ "${DYNEMB_BACKEND:-cpu}" == cuda ]]; then
    "$DYNEMB" replay "$cap" --backend cuda --quiet --json "$name.held.json" "$@" \
      >/dev/null 2>"$name.held.err"
  else
    DYNEMB_HOLD_OUTPUTS=host "$DYNEMB" replay "$cap" --backend cpu --quiet \
      --json "$name.held.json" "$@" >/dev/null 2>"$name.held.err"
  fi
  local rc_held=$?
  [[ $rc_host == "$rc_held" ]] || fail "$name: exit $rc_host unheld, $rc_held held"
  ((rc_host < 2)) || fail "$name: exit $rc_host: $(head -3 "$name.host.err")"
  # The hooks' own lines aside (the two runs may cut different column slices).
  cmp -s <(grep -v "^DYNEMB_\(HOLD_OUTPUTS\|SLICE_COLUMNS\):" "$name.held.err") \
    <(grep -v "^DYNEMB_SLICE_COLUMNS:" "$name.host.err") || fail "$name: stderr differs"
  reports_equal "$name.host.json" "$name.held.json" || fail "$name: reports differ"
  if [[ -n "${SLICES:-}" ]]; then  # the kept run's slices, as its device memory sizes them
    grep -q "^DYNEMB_SLICE_COLUMNS: batch 0: slices of $SLICES columns" "$name.held.err" ||
      fail "$name: want slices of $SLICES columns: $(grep -m1 SLICE_COLUMNS "$name.held.err")"
  fi
  if [[ "${DYNEMB_BACKEND:-cpu}" == cuda ]]; then
    ok "$name (exit $rc_host, cuda)"
    return
  fi
  local line
  line=$(grep "^DYNEMB_HOLD_OUTPUTS:" "$name.held.err")
  local checks
  checks=$(sed -n 's/.* held, \([0-9]*\) checks .*/\1/p' <<<"$line")
  local kept
  kept=$(sed -n 's/.* them, \([0-9]*\) lookups kept.*/\1/p' <<<"$line")
  if [[ "${KEPT:-0}" == 1 ]]; then
    [[ -n "$kept" && "$kept" -gt 0 ]] || fail "$name: '$line', want lookups kept"
  fi
  if [[ "${HELD:-1}" == 0 ]]; then
    [[ "$checks" == 0 ]] || fail "$name: $line, want no held check"
  else
    [[ -n "$checks" && "$checks" -gt 0 ]] || fail "$name: '$line', want held checks"
  fi
  ok "$name (exit $rc_host, $checks held checks, ${kept:-0} lookups kept)"
}

# plant CAPTURE: golden outputs and captured lookups changed at a few elements of every rank of
# batch 0 (first, middle and last element, and one made NaN), so that the held checks must
# find the same mismatches, first coordinates and maxima as the host's.
plant() {
  "$DYNEMB_PYTHON" - "$1" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    for r in f["batches/0"]:
        g = f["batches/0"][r]
        for name in ("output", "local_embs"):
            if name not in g or g[name].size == 0:
                continue
            a = g[name][...]
            flat = a.reshape(-1)
            for i, delta in ((0, 0.5), (flat.size // 2, -3.0), (flat.size - 1, 1e-3)):
                flat[i] = flat[i] + np.float32(delta)
            if flat.size > 3 and np.issubdtype(flat.dtype, np.floating):
                flat[flat.size // 3] = np.nan
            g[name][...] = a
PY
}

for fx in "$DYNEMB_SRC"/fixtures/*.h5; do
  base=$(basename "$fx" .h5)
  # module_output, or a MEAN pooled golden output, needs whole outputs on the host.
  held=1
  [[ $base == pooled-mean* ]] && held=0
  HELD=$held same "$base" "$fx"
  DYNEMB_BY_DESTINATION=off HELD=$held same "$base-whole" "$fx"
  cp "$fx" "$base.h5"
  plant "$base.h5"
  HELD=$held same "$base-planted" "$base.h5" --max-mismatches 2
  DYNEMB_BY_DESTINATION=off HELD=$held same "$base-planted-whole" "$base.h5" --max-mismatches 2
  # Lookups derived and the batch over column slices of 3 (MEAN without golden outputs).
  strip_datasets "$base.h5" /local_embs /module_output
  [[ $base == pooled-mean* ]] && strip_datasets "$base.h5" /output
  KEPT=1 DYNEMB_SLICE_COLUMNS=3 same "$base-sliced" "$base.h5"
done
# --write-output keeps whole outputs for the file: nothing held.
HELD=0 DYNEMB_BY_DESTINATION=off same write-output "$DYNEMB_SRC/fixtures/seq-w2.h5" \
  --write-output out.h5

# Synth'd captures of more ranks, variable batch and codecs.
synth() { "$DYNEMB" synth "$@" --seed 5 >/dev/null 2>&1 || fail "synth $*"; }
synth --preset unit-seq-w8 -o seq.h5 --batches 2
synth --preset unit-pooled-w8 -o pooled.h5 --batches 2
synth --preset unit-pooled-w8 -o vbe.h5 --vbe --batches 2
synth --preset unit-seq-w8 --store ctx,output -o seqctx.h5 --vbe --batch-sizes 8,8,5,0,8,3,8,8
for c in seq pooled vbe; do
  plant "$c.h5"
  same "$c" "$c.h5"
  DYNEMB_BY_DESTINATION=off same "$c-whole" "$c.h5"
done
KEPT=1 DYNEMB_SLICE_COLUMNS=5 same seqctx-sliced seqctx.h5

# Column slices sized by the device's memory (Backend::device_memory_for_kept), not the host's:
# under --max-memory 16M the whole batch does not fit, so the host run cuts slices of 22 of
# the 128 columns (a first of one), while the kept run, whose lookups and outputs stay on its
# "device" (DYNEMB_DEVICE_MEMORY, which only a keeping CPU backend reads), cuts all 128 in one
# slice with 1G and 10 a slice (the estimate's width for half of 4M) with 4M. Planted golden
# values lie in different slices of each cut; the reports must be the same. On cuda the device
# reports its own free memory: one slice of all 128.
synth --preset unit-seq-w8 --store ctx,output -o devslice.h5 --batches 2
plant devslice.h5
KEPT=1 SLICES=128 DYNEMB_DEVICE_MEMORY=1G same devslice-1g devslice.h5 --max-memory 16M \
  --max-mismatches 2
[[ "${DYNEMB_BACKEND:-cpu}" == cuda ]] ||
  KEPT=1 SLICES=10 DYNEMB_DEVICE_MEMORY=4M same devslice-4m devslice.h5 --max-memory 16M

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
