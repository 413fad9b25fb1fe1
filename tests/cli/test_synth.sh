#!/usr/bin/env bash
# dynemb-dist synth: determinism, temp-file behaviour, chunking/deflate of fixtures, exit 2
# with a clear message for bad options, and the fixtures' KJTs reproduced by regenerate.sh.
# Env: DYNEMB (binary), DYNEMB_SRC (source root), DYNEMB_PYTHON (python3 with h5py + numpy).
set -uo pipefail
exe=${DYNEMB:?}
src=${DYNEMB_SRC:?}
py=${DYNEMB_PYTHON:-python3}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail

# ---- determinism: same seed -> identical datasets; another seed -> different ids
"$exe" synth --preset unit-seq-w2 --batches 2 --seed 9 --weighted --store ctx,local_embs,output -o "$tmp/a.h5" >/dev/null || fail "synth a"
"$exe" synth --preset unit-seq-w2 --batches 2 --seed 9 --weighted --store ctx,local_embs,output -o "$tmp/b.h5" >/dev/null || fail "synth b"
"$exe" synth --preset unit-seq-w2 --batches 2 --seed 10 --weighted --store ctx,local_embs,output -o "$tmp/c.h5" >/dev/null || fail "synth c"
# h5diff/h5dump come with hdf5-tools (CI installs them); where missing, those two checks say so.
if ! command -v h5diff >/dev/null 2>&1; then
  echo "skip: h5diff (hdf5-tools not installed); the byte comparison below still runs"
elif h5diff -q "$tmp/a.h5" "$tmp/b.h5"; then ok "same seed: h5diff finds no difference"; else fail "same seed gives different captures"; fi
cmp -s "$tmp/a.h5" "$tmp/b.h5" && ok "same seed: byte-identical files (no HDF5 timestamps)" || fail "same seed: files differ in bytes"
# (h5diff calls datasets of different shapes "not comparable" and exits 0: compare in Python)
"$py" - "$tmp/a.h5" "$tmp/c.h5" <<'PY' && ok "another seed: other ids, oracle seed = --seed" || fail "seed 9 vs 10"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as c:
    assert int(a["oracle"].attrs["seed"]) == 9 and int(c["oracle"].attrs["seed"]) == 10
    va, vc = a["batches/0/rank0/values"][()], c["batches/0/rank0/values"][()]
    assert va.shape != vc.shape or not np.array_equal(va, vc)
PY

# ---- temp-file behaviour: the target appears only when complete, no temp is left behind
"$exe" synth --preset unit-seq-w8 --batches 4 --seed 1 -o "$tmp/slow.h5" >/dev/null &
pid=$!
seen_temp=0
for _ in $(seq 1 400); do
  if compgen -G "$tmp/slow.h5.tmp-*" >/dev/null; then
    seen_temp=1
    [ -e "$tmp/slow.h5" ] && fail "target exists while the temp is still being written"
    break
  fi
  sleep 0.02
done
wait $pid || fail "slow synth failed"
[ $seen_temp = 1 ] && ok "writes to OUT.tmp-<pid> while running" || echo "note: synth finished before the temp was seen"
[ -e "$tmp/slow.h5" ] || fail "target missing after success"
compgen -G "$tmp/*.tmp-*" >/dev/null && fail "temp file left behind: $(ls "$tmp")"
ok "renamed onto the target, no temp left"
# A failing run (bad plan) leaves neither target nor temp, and an existing target untouched.
echo "old" >"$tmp/keep.h5"
printf 'format_version: 1\nworld_size: 0\n' >"$tmp/bad.yaml"
"$exe" synth "$tmp/bad.yaml" -o "$tmp/keep.h5" >/dev/null 2>&1
[ $? = 2 ] || fail "bad plan: want exit 2"
[ "$(cat "$tmp/keep.h5")" = old ] && ok "existing target untouched by a failed run" || fail "target clobbered"
compgen -G "$tmp/keep.h5.tmp-*" >/dev/null && fail "temp left by a failed run"

# ---- fixtures are chunked with shuffle + deflate
if command -v h5dump >/dev/null 2>&1; then
  hd=$(h5dump -pH "$src/fixtures/seq-w2.h5")
  grep -q CHUNKED <<<"$hd" && grep -q 'COMPRESSION DEFLATE' <<<"$hd" && grep -q 'PREPROCESSING SHUFFLE' <<<"$hd" \
    && ok "h5dump -pH fixtures/seq-w2.h5: CHUNKED, SHUFFLE, DEFLATE" || fail "fixture not chunked/deflated"
else
  echo "skip: h5dump -pH (hdf5-tools not installed)"
fi
# every chunk <= 1 MiB
"$py" - "$tmp/slow.h5" <<'PY' && ok "every chunk <= 1 MiB" || fail "a chunk is larger than 1 MiB"
import sys, h5py
bad = []
def visit(name, obj):
    if isinstance(obj, h5py.Dataset) and obj.chunks:
        n = obj.dtype.itemsize
        for c in obj.chunks: n *= c
        if n > (1 << 20): bad.append((name, obj.chunks))
with h5py.File(sys.argv[1], "r") as f:
    f.visititems(visit)
print(bad[:3]) if bad else None
sys.exit(1 if bad else 0)
PY

# ---- exit 2 and a clear message for bad options
expect2() {  # expect2 "message fragment" args...
  local want=$1; shift
  local err
  err=$("$exe" synth "$@" 2>&1 >/dev/null)
  local rc=$?
  if [ $rc = 2 ] && grep -qF -- "$want" <<<"$err"; then ok "exit 2: $want"
  else fail "synth $*: want exit 2 with '$want', got $rc: $err"; fi
}
o=(-o "$tmp/x.h5")
expect2 "unknown preset 'nope'" --preset nope "${o[@]}"
expect2 "give either a PLAN.yaml or --preset NAME" "${o[@]}"
expect2 "give either a PLAN.yaml or --preset NAME" "$src/plans/unit-seq-w2.yaml" --preset unit-seq-w2 "${o[@]}"
expect2 "--output is required" --preset unit-seq-w2
expect2 "--hotness: 3 entries, want 1 or F = 4" --preset unit-seq-w2 --hotness 1,2,3 "${o[@]}"
expect2 "'abc' is not an integer" --preset unit-seq-w2 --hotness abc "${o[@]}"
expect2 "want 0 <= LO <= HI" --preset unit-seq-w2 --hotness 5..2 "${o[@]}"
expect2 "--ids: want uniform or zipf:ALPHA" --preset unit-seq-w2 --ids normal "${o[@]}"
expect2 "--empty-rank 2 out of range [0, 2)" --preset unit-seq-w2 --empty-rank 2 "${o[@]}"
expect2 "--store: unknown part 'golden'" --preset unit-seq-w2 --store ctx,golden "${o[@]}"
expect2 "--index-type: want int32 or int64" --preset unit-seq-w2 --index-type int16 "${o[@]}"
expect2 "--batches must be >= 1" --preset unit-seq-w2 --batches 0 "${o[@]}"
expect2 "--batch-sizes: 3 entries, want 1 or W = 2" --preset unit-seq-w2 --batch-sizes 8,8,5 "${o[@]}"
sed 's/num_embeddings: 10$/num_embeddings: 3000000000/' "$src/fixtures/plans/pooled-sum-w4.yaml" >"$tmp/huge.yaml"
expect2 "table t_ctx has 3000000000 rows, more than int32 ids can address" "$tmp/huge.yaml" --index-type int32 "${o[@]}"
expect2 "none.yaml: cannot read the plan: No such file or directory" "$tmp/none.yaml" "${o[@]}"
expect2 "bad.yaml:1:1: error: missing required keys" "$tmp/bad.yaml" "${o[@]}"
[ -e "$tmp/x.h5" ] && fail "a failed synth left $tmp/x.h5"

# ---- synth options end to end: unequal batch, VBE, weighted, int32, empty rank, zero-length
"$exe" synth "$src/fixtures/plans/pooled-sum-w4.yaml" --batch-sizes 8,8,5,0 --hotness 0..3,0,2 --weighted \
  --index-type int32 --empty-rank 1 --seed 3 --store ctx,local_embs,output -o "$tmp/p.h5" >/dev/null || fail "pooled synth"
"$py" - "$tmp/p.h5" <<'PY' && ok "pooled options land in the file as asked" || fail "pooled options"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    B = [8, 8, 5, 0]
    for r in range(4):
        g = f[f"batches/0/rank{r}"]
        L, V, Wt = g["lengths"][()], g["values"][()], g["weights"][()]
        assert L.dtype == np.int32 and V.dtype == np.int32, (L.dtype, V.dtype)
        assert L.shape == (3 * B[r],), (r, L.shape)
        assert int(L.sum()) == V.shape[0] == Wt.shape[0]
        if B[r]:
            assert (L[B[r]:2 * B[r]] == 0).all()            # zero-length feature
            assert r == 1 or (L[2 * B[r]:] == 2).all()      # fixed 2
        if r == 1: assert V.shape[0] == 0                    # empty rank
        assert (Wt * 4 == np.round(Wt * 4)).all() and (Wt <= 2).all()
        assert g["output"].shape == (B[r], 40)
        assert list(g["ctx/batch_size_per_rank"][()]) == B
PY
"$exe" synth "$src/fixtures/plans/pooled-sum-w4.yaml" --vbe --batch-size 6 --seed 3 -o "$tmp/v.h5" >/dev/null || fail "vbe synth"
"$py" - "$tmp/v.h5" <<'PY' && ok "--vbe: stride_per_feature, 1-D VBE tensors, flag set" || fail "vbe"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    tot_local = 0
    dims = [16, 16, 8]
    for r in range(4):
        g = f[f"batches/0/rank{r}"]
        s = g["stride_per_feature"][()]
        assert s.dtype == np.int64 and s.shape == (3,) and (s >= 1).all() and (s <= 6).all()
        assert g["lengths"].shape == (int(s.sum()),)
        assert g["output"].shape == (int((s * dims).sum()),)
        assert int(g["ctx"].attrs["variable_batch_per_feature"]) == 1
        tot_local += int((s * dims).sum())
    assert f["batches/0/rank0/local_embs"].shape == (tot_local,)
PY

# ---- the committed fixtures' KJTs are what regenerate.sh writes with this binary
bash "$src/fixtures/regenerate.sh" "$exe" "$tmp/fx" >/dev/null || fail "regenerate.sh"
"$py" - "$src/fixtures" "$tmp/fx" <<'PY' && ok "fixtures regenerate to identical KJTs, plans and oracle" || fail "fixtures differ from regenerate.sh output (rerun fixtures/regenerate.sh?)"
import os, sys, h5py, numpy as np
a_dir, b_dir = sys.argv[1:]
bad = []
for name in sorted(os.listdir(b_dir)):
    with h5py.File(os.path.join(a_dir, name), "r") as a, h5py.File(os.path.join(b_dir, name), "r") as b:
        if a["plan"][()] != b["plan"][()]: bad.append((name, "plan"))
        if int(a["oracle"].attrs["seed"]) != int(b["oracle"].attrs["seed"]): bad.append((name, "seed"))
        for k in range(int(b.attrs["num_batches"])):
            for r in range(int(b.attrs["world_size"])):
                for d in ("lengths", "values", "weights", "stride_per_feature"):
                    p = f"batches/{k}/rank{r}/{d}"
                    if (p in a) != (p in b) or (p in a and not np.array_equal(a[p][()], b[p][()])):
                        bad.append((name, p))
print(bad[:5]) if bad else None
sys.exit(1 if bad else 0)
PY

# ---- the output dist one destination at a time (a rank's lookup freed once written) makes
# the same file, byte for byte, as the whole batch's dist (DYNEMB_SYNTH_BY_DESTINATION=off);
# a pooled destination of 40 rows in units of 7 (DYNEMB_SYNTH_UNIT_ROWS) too (test hooks: a
# build without them skips these)
has_test_hooks || echo "skipped by destination == whole: no test hooks in this build"
while IFS= read -r args; do
  [ -z "$args" ] && continue
  has_test_hooks || break
  # shellcheck disable=SC2086
  "$exe" synth $args -o "$tmp/dest.h5" --force >/dev/null 2>&1; a=$?
  # shellcheck disable=SC2086
  DYNEMB_SYNTH_BY_DESTINATION=off "$exe" synth $args -o "$tmp/whole.h5" --force >/dev/null 2>&1; b=$?
  # shellcheck disable=SC2086
  DYNEMB_SYNTH_UNIT_ROWS=7 "$exe" synth $args -o "$tmp/units.h5" --force >/dev/null 2>&1; c=$?
  if [ $a = 0 ] && [ $b = 0 ] && [ $c = 0 ] && cmp -s "$tmp/dest.h5" "$tmp/whole.h5" &&
     cmp -s "$tmp/units.h5" "$tmp/whole.h5"; then
    ok "by destination == whole: $args"
  else
    fail "by destination != whole (rc $a/$b/$c): $args"
  fi
done <<'ARGS'
--preset unit-seq-w2 --batches 2 --seed 3 --weighted
--preset unit-seq-w8 --batch-size 40 --hotness 0..9 --batches 2 --vbe
--preset unit-pooled-w8 --batch-size 40 --batches 2 --seed 4
--preset unit-pooled-w8 --batch-size 40 --batches 2 --weighted --index-type int32
--preset unit-pooled-w8 --batch-sizes 40,40,13,0,40,40,40,1 --batches 2 --vbe
--preset unit-pooled-w8 --batch-sizes 40,9,13,0,40,40,40,1 --batches 2
--preset pooled-mean-mixed-dims --batch-size 40 --batches 2 --store ctx,local_embs,output,module_output
--preset pooled-mean-mixed-dims --batch-size 40 --plant output-after-callback
--preset mixed-dist-types --batch-size 40 --batches 2 --store output
--preset odd-dims-d15 --batch-size 40 --empty-rank 1
ARGS

echo "# $fails failure(s)"
[ $fails = 0 ]
