#!/usr/bin/env bash
# dynemb-dist inspect: the summary of a capture (cli.md): plan, batches, ranks, ids per rank
# and imbalance (checked against numbers recomputed with h5py), bytes, optional parts; exit 2
# with the HDF5 path for malformed captures.
set -uo pipefail
exe=${DYNEMB:?}
src=${DYNEMB_SRC:?}
py=${DYNEMB_PYTHON:-python3}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail

out=$("$exe" inspect "$src/fixtures/seq-empty-rank.h5") || fail "inspect fixture: exit $?"
grep -q '^# plan .*sequence, W=2, F=4, D=128, data_type fp32' <<<"$out" && ok "plan summary" || fail "plan line: $out"
grep -q '^# oracle       hash64, seed 3' <<<"$out" && ok "oracle seed" || fail "oracle line"
grep -q '^# batches      1' <<<"$out" && ok "batches" || fail "batches line"
grep -q 'optional part ctx .*present in 2/2' <<<"$out" && ok "optional parts" || fail "optional parts"
# ids per rank and max/mean, recomputed from the file with h5py
want=$("$py" - "$src/fixtures/seq-empty-rank.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    n = [f[f"batches/0/rank{r}/values"].shape[0] for r in range(2)]
assert n[1] == 0  # the empty rank
m = sum(n) / 2
print(f"max {max(n)}, mean {m:.1f}, max/mean {max(n) / m:.3f}")
PY
)
grep -qF "# ids per rank (input KJT, all batches):      $want" <<<"$out" \
  && ok "imbalance: $want" || fail "imbalance: want '$want' in: $(grep 'ids per rank' <<<"$out")"
grep -qE '^ +0 +1 +5 +0 +' <<<"$out" && ok "rank 1 row: B=5, 0 ids" || fail "rank row: $(grep -E '^ +0 +1 ' <<<"$out")"
grep -qE '^ +local_embs +[0-9]+ +[0-9]+$' <<<"$out" && ok "bytes of local_embs" || fail "bytes table"

# VBE, weighted, int32 are reported
out=$("$exe" inspect "$src/fixtures/pooled-vbe.h5") || fail "inspect pooled-vbe"
grep -qE '^ +1 +3 +[0-9]+\.\.[0-9]+ +[0-9]+ +[0-9]+ +yes' <<<"$out" && ok "VBE ranks show B_f range" || fail "vbe row"
out=$("$exe" inspect "$src/fixtures/pooled-int32-empty.h5") || fail "inspect int32"
grep -qE ' int32 ' <<<"$out" && ok "int32 index type shown" || fail "int32"

# a KJT-only capture: no optional parts
"$exe" synth --preset unit-seq-w2 --store none -o "$tmp/k.h5" >/dev/null
out=$("$exe" inspect "$tmp/k.h5") || fail "inspect KJT-only"
grep -q 'optional part local_embs  absent' <<<"$out" && ok "absent parts" || fail "absent parts"

# malformed: exit 2 with the HDF5 path
cp "$src/fixtures/seq-w2.h5" "$tmp/bad.h5"
"$py" - "$tmp/bad.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    v = f["batches/1/rank0/values"][()]
    del f["batches/1/rank0/values"]
    f["batches/1/rank0/values"] = v[:-1]
PY
err=$("$exe" inspect "$tmp/bad.h5" 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && grep -q "bad.h5:/batches/1/rank0/lengths: sum [0-9]* != len(values) [0-9]*" <<<"$err" \
  && ok "malformed: exit 2, $err" || fail "malformed: rc $rc: $err"
printf 'not hdf5' >"$tmp/txt.h5"
err=$("$exe" inspect "$tmp/txt.h5" 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && grep -q "txt.h5:/: not an HDF5 file" <<<"$err" && ok "not HDF5: exit 2" || fail "not hdf5: $rc $err"
head -c 3000 "$src/fixtures/seq-w2.h5" >"$tmp/trunc.h5"
err=$("$exe" inspect "$tmp/trunc.h5" 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && grep -q "trunc.h5:/: .*truncated file" <<<"$err" && ok "truncated: exit 2" || fail "truncated: $rc $err"
"$exe" inspect >/dev/null 2>&1; [ $? = 2 ] && ok "no argument: exit 2" || fail "no argument"

echo "# $fails failure(s)"
[ $fails = 0 ]
