#!/usr/bin/env bash
# `dynemb-dist replay` on synth captures with exactly one planted context defect each: every
# kind gives exit 1 and a FAIL line naming the field, the batch, the rank and the index; the
# clean captures (sequence, pooled, pooled VBE) give exit 0.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail
run() {  # run NAME WANT_RC ARGS...
  local name=$1 want=$2
  shift 2
  "$DYNEMB" "$@" >"$tmp/$name.out" 2>&1
  local rc=$?
  if [[ $rc -ne $want ]]; then
    fail "$name: exit $rc, want $want ($*)"
    sed 's/^/    /' "$tmp/$name.out" | head -40
  fi
}
# has NAME REGEX: some line of NAME's output matches the extended regex.
has() { grep -qE -- "$2" "$tmp/$1.out" || { fail "$1: no line matches: $2"; sed 's/^/    /' "$tmp/$1.out" | head -40; }; }
hasnt() { ! grep -qE -- "$2" "$tmp/$1.out" || fail "$1: a line matches what should not be there: $2"; }
# mutate FILE PYTHON: runs PYTHON with f = h5py.File(FILE, 'r+'), numpy as np.
mutate() {
  "$DYNEMB_PYTHON" - "$1" "$2" <<'EOF' || fail "mutate $1 failed"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    exec(sys.argv[2])
EOF
}

"$DYNEMB" synth --preset unit-seq-w2 --batches 3 --seed 7 -o "$tmp/seq.h5" >/dev/null || fail "synth seq"
"$DYNEMB" synth --preset unit-pooled-w8 --batches 2 --seed 7 -o "$tmp/pooled.h5" >/dev/null || fail "synth pooled"
"$DYNEMB" synth --preset unit-pooled-w8 --vbe --batches 2 --seed 7 -o "$tmp/vbe.h5" >/dev/null || fail "synth vbe"
# Unequal batch per rank: recat expanded per bag, variable-stride sequence path.
"$DYNEMB" synth --preset unit-seq-w2 --batch-sizes 8,5 --batches 2 -o "$tmp/uneven.h5" >/dev/null || fail "synth uneven"

# ---- clean captures pass
for c in seq pooled vbe uneven; do
  run "clean_$c" 0 replay "$tmp/$c.h5"
  has "clean_$c" "^# result: PASS \(exit 0\)"
  run "clean_${c}_derived" 0 replay "$tmp/$c.h5" --ctx derived -q
done

# plant NAME BASE PYTHON: a copy of BASE.h5 with one defect, replayed; expects exit 1.
plant() {
  cp "$tmp/$2.h5" "$tmp/$1.h5"
  mutate "$tmp/$1.h5" "$3"
  run "$1" 1 replay "$tmp/$1.h5"
  has "$1" "^# result: FAIL \(exit 1\)"
}

# ---- input_splits (sequence): rank 0 of batch 1 claims one more id for rank 1
plant in_splits seq 'f["batches/1/rank0/ctx/input_splits"][1] += 1'
has in_splits "^FAIL +batch 1 rank 0 ctx input_splits: 1 of 2 elements differ; first at index 1: captured [0-9]+, derived [0-9]+ — plan routes [0-9]+ ids of rank 0 to rank 1"
has in_splits "^FAIL +batch 1 rank 0 ctx input_splits.symmetry: .*index 1"
hasnt in_splits "^FAIL +batch [02]"

# ---- output_splits (sequence)
plant out_splits seq 'f["batches/0/rank1/ctx/output_splits"][0] -= 1'
has out_splits "^FAIL +batch 0 rank 1 ctx output_splits: .*first at index 0: captured [0-9]+, derived [0-9]+ — plan routes [0-9]+ ids of rank 0 to rank 1"
has out_splits "^FAIL +batch 0 rank 1 ctx output_splits.sum: "

# ---- batch_size_per_rank (pooled, W=8)
plant bsr pooled 'f["batches/1/rank3/ctx/batch_size_per_rank"][2] += 1'
has bsr "^FAIL +batch 1 rank 3 ctx batch_size_per_rank: .*first at index 2: captured 129, derived 128 — rank 2's KJT has batch size 128"
has bsr "^FAIL +batch 1 rank 3 ctx batch_size_per_rank.sum: "

# ---- batch_size_per_rank_per_feature (pooled VBE): [W, F] = [8, 4], element (1, 3) = index 7
plant bsrpf vbe 'f["batches/1/rank2/ctx/batch_size_per_rank_per_feature"][1, 3] += 1'
has bsrpf "^FAIL +batch 1 rank 2 ctx batch_size_per_rank_per_feature: .*first at index 7, row 1, col 3: captured [0-9]+, derived [0-9]+ — rank 1's KJT has [0-9]+ samples of feature "

# ---- sparse_features_recat (sequence, F=4, W=2): swap segments 1 and 2
plant recat seq 'd = f["batches/0/rank0/ctx/sparse_features_recat"]; v = d[...]; v[[1, 2]] = v[[2, 1]]; d[...] = v'
has recat "^FAIL +batch 0 rank 0 ctx sparse_features_recat: 2 of 8 elements differ; first at index 1: captured 1, derived 4 — segment \(feature f0, source rank 1\) takes input segment 4"

# ---- unbucketize_permute, not a bijection (index 5 repeats index 4's position)
plant perm_dup seq 'd = f["batches/2/rank1/ctx/unbucketize_permute"]; v = d[...]; v[5] = v[4]; d[...] = v'
has perm_dup "^FAIL +batch 2 rank 1 ctx unbucketize_permute.bijection: not a bijection: 1 bad entries, first at index 5: value [0-9]+ duplicate of index 4"
has perm_dup "^FAIL +batch 2 rank 1 ctx unbucketize_permute: 1 of [0-9]+ elements differ; first at index 5: captured [0-9]+, derived [0-9]+ — id -?[0-9]+ \(feature f[0-3], sample [0-9]+, position [0-9]+\) is routed to rank [01]"

# ---- unbucketize_permute, wrong but bijective (swap indices 3 and 7)
plant perm_swap seq 'd = f["batches/2/rank1/ctx/unbucketize_permute"]; v = d[...]; v[[3, 7]] = v[[7, 3]]; d[...] = v'
has perm_swap "^FAIL +batch 2 rank 1 ctx unbucketize_permute: 2 of [0-9]+ elements differ; first at index 3: "
hasnt perm_swap "unbucketize_permute.bijection"
# the wrong permute also scrambles the output of rank 1: a context verdict, not data
has perm_swap "^FAIL +batch 2 rank 1 output golden: .*\[cause: context\]"

# ---- lengths_after_input_dist (sequence, [F, sum_s B_s] = [4, 16]): element (2, 5) = index 37
plant lad seq 'f["batches/0/rank1/ctx/lengths_after_input_dist"][2, 5] += 1'
has lad "^FAIL +batch 0 rank 1 ctx lengths_after_input_dist: .*first at index 37, row 2, col 5: captured [0-9]+, derived [0-9]+ — plan routes [0-9]+ ids of bag \(feature f2, source rank 0, sample 5\) to rank 1"
has lad "^FAIL +batch 0 rank 1 ctx lengths_after_input_dist.sum: sum\(lengths_after_input_dist\) [0-9]+ != local_embs rows [0-9]+"

# ---- sparse_features_recat on an uneven batch (expanded per bag)
plant recat_uneven uneven 'd = f["batches/1/rank1/ctx/sparse_features_recat"]; v = d[...]; v[[0, 1]] = v[[1, 0]]; d[...] = v'
has recat_uneven "^FAIL +batch 1 rank 1 ctx sparse_features_recat: 2 of [0-9]+ elements differ; first at index 0: .*expanded per bag"

# ---- variable_batch_per_feature flag vs the latch: batch 1 of a non-VBE pooled capture
# says variable batch on rank 2; the module was latched non-VBE at batch 0.
plant latch pooled 'f["batches/1/rank2/ctx"].attrs["variable_batch_per_feature"] = np.int64(1)'
has latch "^FAIL +batch 1 rank 2 ctx variable_batch_per_feature: at index 0: captured 1, derived 0"
has latch "^FAIL +batch 1 rank 2 ctx variable_batch_per_feature.latch: at index 0: flag 1, latched 0 — the output dist was built non-variable-batch at batch 0"
has latch "^FAIL +batch 1 rank 2 ctx output_dist: the output dist cannot run with this context \(field variable_batch_per_feature\)"
hasnt latch "^FAIL +batch 0"

# ---- --ctx derived: the defect is still reported, but the output dist runs on the derived
# context, so the outputs match.
run lad_derived 1 replay "$tmp/lad.h5" --ctx derived
has lad_derived "^FAIL +batch 0 rank 1 ctx lengths_after_input_dist: "
hasnt lad_derived "^FAIL .* output "

# ---- --quiet: no per-check lines, the summary stays
run quiet 1 replay "$tmp/in_splits.h5" --quiet
hasnt quiet "^FAIL"
has quiet "^# result: FAIL \(exit 1\): [1-9][0-9]* context mismatches"

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
