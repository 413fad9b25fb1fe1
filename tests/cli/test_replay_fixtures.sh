#!/usr/bin/env bash
# Golden checks over the shipped fixtures (fixtures/*.h5, fixtures/torchrec/*.h5): each
# replays with exit 0; a copy with one planted context defect (the first ctx field of batch 0,
# rank 0) gives exit 1 naming that field; a copy with one NaN in a golden output gives exit 1
# with a data verdict, whatever the default tolerance of the fixture.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }
shopt -s nullglob
fixtures=("$DYNEMB_SRC"/fixtures/*.h5 "$DYNEMB_SRC"/fixtures/torchrec/*.h5)
[[ ${#fixtures[@]} -gt 0 ]] || { echo "no fixtures under $DYNEMB_SRC/fixtures"; exit 77; }

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail
planted_ctx=0
planted_gold=0

for fx in "${fixtures[@]}"; do
  name=$(basename "$fx" .h5)
  "$DYNEMB" replay "$fx" >"$tmp/$name.out" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]] || ! grep -q "^# result: PASS (exit 0)" "$tmp/$name.out"; then
    fail "$name: exit $rc, want 0"
    sed 's/^/    /' "$tmp/$name.out" | head -30
  fi

  # A planted context defect: the first integer ctx field of batch 0 rank 0, element 0 + 1.
  cp "$fx" "$tmp/$name.ctx.h5"
  field=$("$DYNEMB_PYTHON" - "$tmp/$name.ctx.h5" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    g = f.get("batches/0/rank0/ctx")
    for name in ("input_splits", "output_splits", "batch_size_per_rank",
                 "batch_size_per_rank_per_feature", "sparse_features_recat"):
        if g is not None and name in g and g[name].size > 0:
            d = g[name]
            v = d[...]
            v.flat[0] += 1
            d[...] = v
            print(name)
            break
EOF
)
  if [[ -n "$field" ]]; then
    planted_ctx=$((planted_ctx + 1))
    "$DYNEMB" replay "$tmp/$name.ctx.h5" >"$tmp/$name.ctx.out" 2>&1
    rc=$?
    [[ $rc -eq 1 ]] || fail "$name with a wrong $field: exit $rc, want 1"
    grep -qE "^FAIL +batch 0 rank 0 ctx $field: .*first at index 0[,:]" "$tmp/$name.ctx.out" ||
      { fail "$name: no FAIL line naming $field, batch 0, rank 0, index 0"; head -20 "$tmp/$name.ctx.out"; }
  fi

  # A NaN in the golden output of the last rank of batch 0 (bf16 goldens are uint16 bits).
  cp "$fx" "$tmp/$name.gold.h5"
  planted=$("$DYNEMB_PYTHON" - "$tmp/$name.gold.h5" <<'EOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    W = int(f.attrs["world_size"])
    for r in reversed(range(W)):
        p = f"batches/0/rank{r}/output"
        if p in f and f[p].size > 0:
            d = f[p]
            v = d[...]
            v.flat[0] = 0x7FC0 if v.dtype == np.uint16 else np.nan
            d[...] = v
            print(r)
            break
EOF
)
  if [[ -n "$planted" ]]; then
    planted_gold=$((planted_gold + 1))
    "$DYNEMB" replay "$tmp/$name.gold.h5" >"$tmp/$name.gold.out" 2>&1
    rc=$?
    [[ $rc -eq 1 ]] || fail "$name with a NaN golden: exit $rc, want 1"
    grep -qE "^FAIL +batch 0 rank $planted output golden: 1 of [0-9]+ elements differ .*golden nan.*\[cause: data \(golden output\)\]" "$tmp/$name.gold.out" ||
      { fail "$name: the NaN golden of rank $planted is not reported as a data mismatch"; head -20 "$tmp/$name.gold.out"; }
  fi
done

# Every synth fixture carries ctx and output: the planted checks must have run on them.
[[ $planted_ctx -ge 20 && $planted_gold -ge 20 ]] ||
  fail "only $planted_ctx context and $planted_gold golden defects planted"
echo "${#fixtures[@]} fixtures ($planted_ctx context, $planted_gold golden defects planted), $fails failure(s)"
[[ $fails -eq 0 ]]
