#!/usr/bin/env bash
# MEAN pooling where TorchRec divides, the KJT keys of a capture, and the messages that name
# what went wrong: a capture taken after the module's mean pooling, a lookup that kept MEAN
# under RW, keys in another order than the plan's features, a rank-batch without ctx/, an id
# outside its table, and a MEAN capture written by a synth from before the rule.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail

# run NAME WANT_RC ARGS...: output in $tmp/NAME.out
run() {
  local name=$1 want=$2
  shift 2
  timeout 120 "$DYNEMB" "$@" >"$tmp/$name.out" 2>&1
  local rc=$?
  if [[ $rc -ne $want ]]; then
    fail "$name: exit $rc, want $want ($*)"
    sed 's/^/    /' "$tmp/$name.out" | head -30
  else
    ok "$name: exit $rc"
  fi
}
has() { grep -qE -- "$2" "$tmp/$1.out" && ok "$1: $3" || { fail "$1: no line matches: $2"; sed 's/^/    /' "$tmp/$1.out" | head -30; }; }
py() { "$DYNEMB_PYTHON" - "$@"; }
plan=$DYNEMB_SRC/plans/pooled-mean-mixed-dims.yaml
synth() { "$DYNEMB" synth "$plan" --batch-size 4 --hotness 0..4,0..4,0..6,0 --seed 15 "$@" >/dev/null; }

# ---- the dist carries sums; module_output is the division, checked as its own stage
synth --batches 2 --store ctx,local_embs,output,module_output -o "$tmp/mean.h5"
run mean 0 replay "$tmp/mean.h5" --json "$tmp/mean.json"
has mean "^# module +8 +8 +0 " "module stage: 8 checks passed"
py "$tmp/mean.h5" "$tmp/mean.json" <<'EOF' || fail "mean: output/module_output relation"
import sys, json, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
feats, dims, mean = ["f_user", "f_user_hist", "f_item", "f_ctx"], [16, 16, 32, 8], [0, 0, 1, 0]
for r in range(4):
    g = f[f"batches/0/rank{r}"]
    assert [k.decode() for k in g["keys"][()]] == feats, g["keys"][()]
    out, mo = g["output"][()], g["module_output"][()]
    L = g["lengths"][()].reshape(4, -1)  # [F, B]
    # the module's division, independently: float32(len) + 1e-6 on MEAN columns, 1 + 1e-6 else
    div = np.concatenate([np.repeat(((L[fi] if mean[fi] else np.ones_like(L[fi])).astype(np.float32)
                                     + np.float32(1e-6))[:, None], dims[fi], 1) for fi in range(4)], 1)
    want = (out.astype(np.float32) / div).astype(np.float32)
    assert np.array_equal(mo, want), (r, np.abs(mo - want).max())
    # SUM columns of a module with a MEAN table are divided by float32(1 + 1e-6) too
    assert mo[0, 0] == np.float32(out[0, 0] / np.float32(1 + 1e-6))
j = json.load(open(sys.argv[2]))
assert j["schema_version"] == "1.1.0"
assert j["summary"]["module_mismatches"] == 0
m = [c for c in j["checks"] if c["stage"] == "module"]
assert len(m) == 8 and all(c["status"] == "pass" for c in m), m[:1]
EOF
# a wrong module_output is a module-stage mismatch (exit 1) naming the element
cp "$tmp/mean.h5" "$tmp/mean-bad.h5"
py "$tmp/mean-bad.h5" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    d = f["batches/1/rank2/module_output"]; v = d[()]; v[3, 40] += 0.5; d[...] = v
EOF
run mean_bad 1 replay "$tmp/mean-bad.h5"
has mean_bad "^FAIL +batch 1 rank 2 module module_output: 1 of 288 elements differ.*sample 3, feature f_item" "module_output mismatch named"

# ---- diagnoses: output captured after the callback; local_embs holding per-rank means
synth --plant output-after-callback -o "$tmp/after.h5"
run after 1 replay "$tmp/after.h5" --junit "$tmp/after.xml"
has after "FAIL +batch 0 rank 0 output golden: output equals the MEAN-divided result: it was captured after the module's mean-pooling callback" "output after the callback diagnosed"
grep -q "output equals the MEAN-divided result: it was captured after the module.*mean-pooling callback" "$tmp/after.xml" && ok "after: diagnosis in JUnit" || fail "after: diagnosis not in JUnit"
synth --plant local-embs-means --store ctx,local_embs,output,module_output -o "$tmp/means.h5"
run means 1 replay "$tmp/means.h5"
has means "FAIL +batch 0 rank [0-3] lookup local_embs: local_embs of MEAN table\(s\) t_item hold per-rank means, not per-rank sums \(first at source_rank [0-9]+, sample [0-9]+, feature f_item" "per-rank means diagnosed with table, batch, rank, sample"
has means "kept PoolingMode.MEAN under row-wise sharding" "the cause is named"
run plant_sum 2 synth "$DYNEMB_SRC/fixtures/plans/pooled-sum-w4.yaml" --plant local-embs-means -o "$tmp/x.h5"
has plant_sum "need a plan with a MEAN table" "plants need a MEAN table"

# ---- a synthetic MEAN capture whose output holds divided values: exit 1, how to remake it
run old 1 replay "$DYNEMB_SRC/tests/data/pooled-mean-synth-before-2026-12.h5"
has old "a synthetic capture whose output holds divided values is remade by synth" "divided synthetic capture: how to remake it"

# ---- KJT keys in another order than the plan's features: exit 2, one message with both orders
cp "$tmp/mean.h5" "$tmp/keys.h5"
py "$tmp/keys.h5" <<'EOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    for k in range(2):
        for r in range(4):
            g = f[f"batches/{k}/rank{r}"]
            del g["keys"]
            g["keys"] = np.array([b"f_user", b"f_item", b"f_user_hist", b"f_ctx"])
EOF
want_keys='/batches/0/rank0/keys: the KJT keys at the input dist are \[f_user, f_item, f_user_hist, f_ctx\] but the plan .* lists its features as \[f_user, f_user_hist, f_item, f_ctx\]: the same features in another order'
run keys 2 replay "$tmp/keys.h5"
has keys "$want_keys" "replay names both orders"
# every rank-batch is reported (the replay keeps going), each in one message naming both orders
[[ $(grep "KJT keys" "$tmp/keys.out" | grep -vc "are \[f_user, f_item, f_user_hist, f_ctx\] but .* as \[f_user, f_user_hist, f_item, f_ctx\]") -eq 0 ]] && ok "keys: each message names both orders" || fail "keys: a message without both orders"
# merge checks the assembled capture the same way: per-rank files with the keys in that order
py "$tmp/keys.h5" "$tmp" <<'EOF'
import sys, shutil, h5py, numpy as np
for r in range(4):
    out = f"{sys.argv[2]}/rank{r}.h5"
    shutil.copy(sys.argv[1], out)
    with h5py.File(out, "r+") as f:
        f.attrs["rank"] = np.int64(r)
        for k in range(2):
            for q in range(4):
                if q != r:
                    del f[f"batches/{k}/rank{q}"]
EOF
run keys_merge 2 merge "$tmp"/rank0.h5 "$tmp"/rank1.h5 "$tmp"/rank2.h5 "$tmp"/rank3.h5 -o "$tmp/merged.h5"
has keys_merge "the KJT keys at the input dist are \[f_user, f_item, f_user_hist, f_ctx\] but the plan" "merge names both orders"
[[ ! -e "$tmp/merged.h5" ]] && ok "keys_merge: no output written" || fail "keys_merge: wrote merged.h5"
run keys_validate 2 validate "$plan" --capture "$tmp/keys.h5"
has keys_validate "the KJT keys at the input dist are \[f_user, f_item, f_user_hist, f_ctx\]" "validate --capture names both orders"
# variable-length strings (h5py's default) read the same
py "$tmp/keys.h5" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    for k in range(2):
        for r in range(4):
            g = f[f"batches/{k}/rank{r}"]
            del g["keys"]
            g["keys"] = ["f_user", "f_user_hist", "f_item", "f_ctx"]
EOF
run keys_vlen 0 replay "$tmp/keys.h5"
# old captures without keys still replay
py "$tmp/keys.h5" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    for k in range(2):
        for r in range(4):
            del f[f"batches/{k}/rank{r}/keys"]
EOF
run keys_absent 0 replay "$tmp/keys.h5"

# ---- a rank-batch without ctx/ while others have one: a warning and skipped ctx checks
cp "$tmp/mean.h5" "$tmp/noctx.h5"
py "$tmp/noctx.h5" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    del f["batches/1/rank2/ctx"]
EOF
run noctx 0 replay "$tmp/noctx.h5" --json "$tmp/noctx.json" --junit "$tmp/noctx.xml"
has noctx "^# warning: batch 1: rank\(s\) 2 have no ctx/ group while other rank-batches have one" "warning line"
has noctx "^# ctx +80 +70 +0 +0 +10 *$|^# ctx +[0-9]+ +[0-9]+ +0 +0 +1 *$" "ctx check counted as skipped"
py "$tmp/noctx.json" "$tmp/noctx.xml" <<'EOF' || fail "noctx: JSON/JUnit"
import sys, json
j = json.load(open(sys.argv[1]))
s = [c for c in j["checks"] if c["status"] == "skipped"]
assert len(s) == 1 and s[0]["batch"] == 1 and s[0]["rank"] == 2 and s[0]["stage"] == "ctx", s
assert "no ctx/ group in this rank-batch" in s[0]["message"]
assert any("rank(s) 2 have no ctx/" in w for w in j["warnings"])
x = open(sys.argv[2]).read()
assert 'name="batch1.rank2.ctx.context"' in x and "<skipped" in x and "no ctx/ group" in x
EOF

# ---- an id outside its table: the id itself, its feature, rank, sample and bag position
sed 's/^bounds_check:.*/bounds_check: error/' "$DYNEMB_SRC/fixtures/plans/seq-oob-w4.yaml" >"$tmp/oob.yaml"
"$DYNEMB" synth "$tmp/oob.yaml" --batch-size 4 --hotness 0..6 --oob-ids 0.3 --seed 19 --store none -o "$tmp/oob.h5" >/dev/null
run oob 2 replay "$tmp/oob.h5"
has oob "id -?[0-9]+ of feature f_[a-z]+ \(rank [0-9], sample [0-9]+, position [0-9]+ in its bag\) is outside table .*bounds_check: warn_zero_row" "oob message"
line=$(grep -m1 -oE "id -?[0-9]+ of feature f_[a-z]+ \(rank [0-9], sample [0-9]+, position [0-9]+" "$tmp/oob.out")
py "$tmp/oob.h5" "$line" <<'EOF' || fail "oob: the named id is not at the named place ($line)"
import re, sys, h5py
m = re.match(r"id (-?\d+) of feature (\w+) \(rank (\d), sample (\d+), position (\d+)", sys.argv[2])
idv, feat, (r, b, p) = int(m.group(1)), m.group(2), map(int, m.groups()[2:])
g = h5py.File(sys.argv[1], "r")[f"batches/0/rank{r}"]
L, V = g["lengths"][()], g["values"][()]
j = ["f_small", "f_hash"].index(feat) * (len(L) // 2) + b  # key-major lengths [F*B]
assert p < L[j] and V[L[:j].sum() + p] == idv, (V[L[:j].sum():L[:j].sum() + L[j]], idv)
EOF
[[ $fails -eq 0 ]]
