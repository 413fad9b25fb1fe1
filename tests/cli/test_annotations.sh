#!/usr/bin/env bash
# CI annotations: `--annotations github`, and the same by default under
# GITHUB_ACTIONS=true, print GitHub workflow commands for the findings of replay (on the
# capture, titled with batch/rank/field) and validate (at the plan's file:line:col);
# `--annotations none` and a plain environment print none.
set -uo pipefail
exe=${DYNEMB:?}
src=${DYNEMB_SRC:?}
py=${DYNEMB_PYTHON:-python3}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail
cd "$tmp" || exit 1
unset GITHUB_ACTIONS

# A capture with one planted context defect that the output dist still runs with: two
# entries of rank 1's unbucketize_permute in batch 1 swapped (a stale permute).
"$exe" synth --preset unit-seq-w2 --batches 2 --seed 3 -o good.h5 >/dev/null || { echo "FAIL: synth"; exit 1; }
cp good.h5 bad.h5
"$py" - <<'PY' || { echo "FAIL: planting the defect"; exit 1; }
import h5py
with h5py.File("bad.h5", "r+") as f:
    ds = f["batches/1/rank1/ctx/unbucketize_permute"]
    v = ds[...]
    v[[0, 1]] = v[[1, 0]]
    ds[...] = v
PY

"$exe" replay bad.h5 --quiet --annotations github >out.txt 2>err.txt
rc=$?
[[ $rc -eq 1 ]] && ok "replay exit 1" || fail "replay exit $rc"
grep '^::' out.txt >ann.txt
nerr=$(grep -c '^::error ' ann.txt)
# One annotation per failing check of the JSON report.
"$exe" replay bad.h5 --quiet --json r.json >/dev/null 2>&1
nfail=$("$py" -c 'import json; r = json.load(open("r.json")); print(sum(c["status"] in ("fail", "error") for c in r["checks"]))')
[[ $nerr -ge 1 && $nerr -eq $nfail ]] && ok "$nerr ::error lines = failing checks" || fail "$nerr ::error lines, $nfail failing checks"
want=$("$py" -c '
import json
r = json.load(open("r.json"))
c = next(c for c in r["checks"] if c["name"] == "batch1.rank1.ctx.unbucketize_permute")
print("::error file=bad.h5,title=dynemb-dist replay%3A batch 1 rank 1 ctx.unbucketize_permute::" + c["message"])')
grep -qxF "$want" ann.txt && ok "unbucketize_permute annotation: file, title, message" || fail "want '$want' in: $(cat ann.txt)"
# Output mismatches carry the verdict on the cause.
grep -q '^::error file=bad.h5,title=dynemb-dist replay%3A batch 1 rank 1 output\.golden::.*(cause: context)$' ann.txt \
  && ok "output annotation names the cause" || fail "no output annotation with cause: $(cat ann.txt)"
grep -q '^::' err.txt && fail "annotations on stderr" || ok "annotations on stdout only"

GITHUB_ACTIONS=true "$exe" replay bad.h5 --quiet >auto.txt 2>&1
cmp -s <(grep '^::' auto.txt) ann.txt && ok "GITHUB_ACTIONS=true: same annotations by default" || fail "GITHUB_ACTIONS=true: $(grep '^::' auto.txt)"
GITHUB_ACTIONS=true "$exe" replay bad.h5 --quiet --annotations none >none.txt 2>&1
grep -q '^::' none.txt && fail "--annotations none still annotates" || ok "--annotations none: no annotations"
GITHUB_ACTIONS=false "$exe" replay bad.h5 --quiet >plain.txt 2>&1
grep -q '^::' plain.txt && fail "annotations without GITHUB_ACTIONS=true" || ok "no annotations by default"
GITHUB_ACTIONS=true "$exe" replay good.h5 --quiet >clean.txt 2>&1
rc=$?
[[ $rc -eq 0 ]] && ! grep -q '^::' clean.txt && ok "clean capture: exit 0, no annotations" || fail "clean: exit $rc, $(grep '^::' clean.txt)"
"$exe" replay good.h5 --annotations gitlab >/dev/null 2>&1
rc=$?
[[ $rc -eq 2 ]] && ok "--annotations gitlab: exit 2" || fail "--annotations gitlab: exit $rc"

# Many failing checks: the first 50 annotated, then one line counting the rest. 30 batches x
# 2 ranks with a golden output off by 1/64: 60 golden checks fail (and nothing else).
"$exe" synth --preset unit-seq-w2 --batches 30 --batch-size 2 --hotness 1..3 --seed 4 -o many.h5 >/dev/null || fail "synth many"
"$py" - <<'PY' || fail "planting 60 golden defects"
import h5py
with h5py.File("many.h5", "r+") as f:
    for k in range(30):
        for r in range(2):
            ds = f[f"batches/{k}/rank{r}/output"]
            v = ds[...]
            v[0, 0] += 1.0 / 64
            ds[...] = v
PY
"$exe" replay many.h5 --quiet --annotations github --json many.json >many.txt 2>&1
nfail=$("$py" -c 'import json; r = json.load(open("many.json")); print(r["summary"]["failed"] + r["summary"]["errors"])')
[[ $(grep -c '^::error file=many.h5,title=dynemb-dist replay%3A batch' many.txt) -eq 50 ]] \
  && grep -qxF "::error file=many.h5,title=dynemb-dist replay::$((nfail - 50)) more failing checks; the text, --json or --junit report lists every one" many.txt \
  && [[ $nfail -ge 60 ]] && ok "$nfail failing checks: 50 annotations + 1 counting the rest" \
  || fail "cap: $nfail failing, $(grep -c '^::' many.txt) annotations, last: $(grep '^::' many.txt | tail -1)"

# Trouble is an annotation too.
echo "not hdf5" >junk.h5
"$exe" replay junk.h5 --quiet --annotations github >junk.txt 2>/dev/null
grep -qxF '::error file=junk.h5,title=dynemb-dist replay%3A trouble::junk.h5:/: not an HDF5 file (no HDF5 signature)' junk.txt \
  && ok "trouble annotation" || fail "trouble: $(cat junk.txt)"

# validate: file:line:col of the finding; ',' and ':' in the path escaped.
cat >"a,b.yaml" <<'YAML'
format_version: 1
world_size: 2
module: sequence
tables:
  - name: t0
    num_embeddings: 10
    embedding_dim: 0
    features: [f0]
YAML
"$exe" validate "a,b.yaml" --annotations github >v.txt 2>&1
rc=$?
[[ $rc -eq 2 ]] && ok "validate exit 2" || fail "validate exit $rc"
grep -qxF '::error file=a%2Cb.yaml,line=7,col=20,title=dynemb-dist validate%3A tables[0].embedding_dim::must be >= 1, got 0' v.txt \
  && ok "validate ::error at line 7 col 20" || fail "validate annotation: $(grep '^::' v.txt)"
GITHUB_ACTIONS=true "$exe" validate "$src/plans/ec-bench-criteo.yaml" >w.txt 2>&1
rc=$?
[[ $rc -eq 0 ]] && grep -q "^::warning file=$src/plans/ec-bench-criteo.yaml,line=[0-9]*,col=[0-9]*,title=" w.txt \
  && ok "validate warning -> ::warning with line (exit 0)" || fail "warning: exit $rc, $(grep '^::' w.txt)"
# '%' in a message is escaped as %25 (the runner would decode "%2C" in a name otherwise).
cat >pct.yaml <<'YAML'
format_version: 1
world_size: 2
module: sequence
tables:
  - name: t0
    num_embeddings: 10
    embedding_dim: 4
    features: ["a%2C"]
  - name: t1
    num_embeddings: 10
    embedding_dim: 4
    features: ["a%2C"]
YAML
"$exe" validate pct.yaml --annotations github >p.txt 2>&1
grep -qxF "::error file=pct.yaml,line=12,col=16,title=dynemb-dist validate%3A tables[1].features[0]::duplicate feature name 'a%252C' (first at line 8:16); feature names are unique across the plan" p.txt \
  && ok "'%' escaped as %25" || fail "escaping: $(grep '^::' p.txt)"

# --format json: only when asked for explicitly (scripts merging the streams keep valid
# JSON under GITHUB_ACTIONS), and then on stderr.
GITHUB_ACTIONS=true "$exe" validate "a,b.yaml" --format json >j.json 2>&1
"$py" -c 'import json, sys; json.load(open("j.json"))' && ok "--format json under GITHUB_ACTIONS: no annotations" || fail "--format json output is not JSON: $(cat j.json)"
"$exe" validate "a,b.yaml" --format json --annotations github >j.json 2>j.err
"$py" -c 'import json, sys; json.load(open("j.json"))' && ok "--format json: stdout stays JSON" || fail "--format json stdout is not JSON"
grep -q '^::error file=a%2Cb.yaml,line=7' j.err && ok "--format json --annotations github: on stderr" || fail "json annotations: $(cat j.err)"

[[ $fails -eq 0 ]] || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
