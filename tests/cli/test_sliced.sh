#!/usr/bin/env bash
# Column slices (lib/replay/column_slice.hpp): a batch whose lookups are derived runs over
# slices of the embedding columns; its report must be exactly the whole batch's. Every capture
# below is replayed whole and again forced into slices of a few columns (DYNEMB_SLICE_COLUMNS,
# the test hook, which also says on stderr that the slices were taken), and the JSON reports
# must agree check for check (messages, counts, first mismatch coordinates, causes), timings
# aside. The captures: every fixture with its local_embs and module_output removed (so the
# lookups are derived), and synth'd ctx-only (or ctx + output) captures of sequence, pooled,
# mixed dims, MEAN, VBE and weighted presets, with planted faults: a swapped
# unbucketize_permute (context and reference checks fail), golden outputs changed at elements of
# different slices (the first mismatches must be those of the whole tensor in row-major order,
# with --max-mismatches 2 cutting inside a later slice's), and a batch_size_per_rank that the
# reduce-scatter cannot run with (the whole shapes' failure message).
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }
. "$(dirname "$0")/common.sh"
need_test_hooks
cd "$tmp" || exit 1

# same NAME CAPTURE WIDTH [REPLAY ARGS...]: whole vs slices of WIDTH columns.
same() {
  local name=$1 cap=$2 width=$3
  shift 3
  "$DYNEMB" replay "$cap" --backend cpu --quiet --json "$name.whole.json" "$@" >/dev/null 2>"$name.whole.err"
  local rc_whole=$?
  DYNEMB_SLICE_COLUMNS=$width "$DYNEMB" replay "$cap" --backend cpu --quiet \
    --json "$name.sliced.json" "$@" >/dev/null 2>"$name.sliced.err"
  local rc_sliced=$?
  [[ $rc_whole == "$rc_sliced" ]] || fail "$name: exit $rc_whole whole, $rc_sliced sliced"
  if [[ -n "${WHOLE:-}" ]]; then  # a batch slice_width keeps whole
    grep -q "DYNEMB_SLICE_COLUMNS: batch" "$name.sliced.err" && fail "$name: sliced, want whole"
  else
    grep -q "DYNEMB_SLICE_COLUMNS: batch" "$name.sliced.err" || fail "$name: no slices taken"
  fi
  grep -v "DYNEMB_SLICE_COLUMNS" "$name.sliced.err" | cmp -s - "$name.whole.err" ||
    fail "$name: stderr differs"
  reports_equal "$name.whole.json" "$name.sliced.json" || fail "$name: reports differ"
  ok "$name (exit $rc_whole)"
}

# Fixtures without their captured lookups and module outputs: the lookups are derived. A MEAN
# pooled capture with golden outputs stays whole (the MEAN diagnosis divides whole outputs);
# without them it is sliced.
for fx in "$DYNEMB_SRC"/fixtures/*.h5; do
  base=$(basename "$fx" .h5)
  cp "$fx" "$base.h5"
  strip_datasets "$base.h5" /local_embs /module_output
  if [[ $base == pooled-mean* ]]; then
    WHOLE=1 same "fixture-$base-golden" "$base.h5" 3
    strip_datasets "$base.h5" /output
  fi
  same "fixture-$base" "$base.h5" 3
done
cp "$DYNEMB_SRC/fixtures/seq-w2.h5" seq-w2-all.h5
WHOLE=1 same fixture-seq-w2-local-embs seq-w2-all.h5 3  # captured local_embs: whole
same fixture-seq-w2-ctx-derived seq-w2.h5 1 --ctx derived

# Synth'd captures with the lookups derived.
synth() { "$DYNEMB" synth "$@" --seed 3 >/dev/null 2>&1 || fail "synth $*"; }
synth --preset unit-seq-w8 --store ctx -o seq.h5 --batches 2
synth --preset unit-pooled-w8 --store ctx,output -o pooled.h5 --batches 2
synth --preset odd-dims --store ctx,output -o odd.h5
synth --preset odd-dims-d15 --store ctx -o d15.h5
synth --preset pooled-mean-mixed-dims --store ctx -o mean.h5 --vbe --weighted
synth --preset unit-pooled-w8 --store ctx,output -o vbe.h5 --vbe --batches 2
synth --preset unit-seq-w8 --store ctx -o seqvbe.h5 --vbe --batch-sizes 8,8,5,0,8,3,8,8
for c in seq pooled odd d15 mean vbe seqvbe; do
  same "$c" "$c.h5" 5
done
same mean-1 mean.h5 1  # slices without some features (D_f = 0 in the slice)

# Planted faults.
"$DYNEMB_PYTHON" - <<'EOF'
import shutil, h5py
shutil.copy("seq.h5", "seq-perm.h5")
with h5py.File("seq-perm.h5", "r+") as f:  # rank 1 gathers two rows in each other's place
    p = f["batches/0/rank1/ctx/unbucketize_permute"]
    v = p[...]
    v[[3, 10]] = v[[10, 3]]
    p[...] = v
shutil.copy("pooled.h5", "pooled-gold.h5")
with h5py.File("pooled-gold.h5", "r+") as f:  # elements of different slices, rows out of order
    o = f["batches/1/rank2/output"]
    v = o[...]
    for row, col in ((5, 0), (3, 20), (3, 2), (6, 11)):
        v[row, col] += 1
    o[...] = v
shutil.copy("pooled.h5", "pooled-bspr.h5")
with h5py.File("pooled-bspr.h5", "r+") as f:  # the reduce-scatter cannot match
    b = f["batches/0/rank3/ctx/batch_size_per_rank"]
    v = b[...]
    v[0] += 1
    v[1] -= 1
    b[...] = v
EOF
same seq-perm seq-perm.h5 5
same seq-perm-1 seq-perm.h5 1 --max-mismatches 3
same pooled-gold pooled-gold.h5 3 --max-mismatches 2
same pooled-gold-all pooled-gold.h5 7
same pooled-bspr pooled-bspr.h5 4
grep -q '"column"' pooled-gold.sliced.json || fail "pooled-gold: no mismatch coordinates"
grep -q '"status": "fail"' seq-perm.sliced.json || fail "seq-perm: no failed check"

[[ $fails -eq 0 ]] && echo "column slices: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
