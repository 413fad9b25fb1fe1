#!/usr/bin/env bash
# `replay CAPTURE --plan OTHER.yaml` (cli.md: same inputs, another plan) on any capture: what
# differs between the plans is printed key by key, the contexts are derived under OTHER,
# sequence local_embs (one row per id) are re-sharded to OTHER and checked there, pooled
# partial sums use the oracle when there is one and are skipped with the reason when there is
# not; never a bare shape error.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, sha, expect_rc, ...
cd "$tmp" || exit 1
drop_oracle() { "$DYNEMB_PYTHON" -c 'import sys, h5py; del h5py.File(sys.argv[1], "r+")["oracle"]' "$1"; }

# ---- sequence, with local_embs; the other plan: larger t0 and t3 (other shard sizes: ids
# move to other ranks, so every local_embs shape differs)
"$DYNEMB" synth --preset unit-seq-w8 --batches 2 --batch-size 16 --seed 6 -o seq.h5 >/dev/null || fail "synth seq"
sed 's/num_embeddings: 1000$/num_embeddings: 4000/; s/num_embeddings: 17$/num_embeddings: 40/' \
  "$DYNEMB_SRC/plans/unit-seq-w8.yaml" >other.yaml
cmp -s other.yaml "$DYNEMB_SRC/plans/unit-seq-w8.yaml" && fail "other.yaml is the same plan"
seq_sha=$(sha seq.h5)
"$DYNEMB" replay seq.h5 --plan other.yaml --json seq.json >seq.out 2>&1
rc=$?
((rc == 0 || rc == 1)) || fail "seq: exit $rc, want 0 or 1"
expect_rc seq 0 $rc
has_text seq.out "# warning: --plan differs from the capture's plan: tables[t0].num_embeddings: 1000 (capture) -> 4000 (--plan)" seq
has_text seq.out "# warning: --plan differs from the capture's plan: tables[t3].num_embeddings: 17 (capture) -> 40 (--plan)" seq
has_text seq.out "sequence local_embs (one row per id) are re-sharded to --plan" seq
grep -q "shape \[" seq.out && fail "seq: a shape error"
[[ "$(sha seq.h5)" == "$seq_sha" ]] || fail "seq: the capture was changed"
# The re-sharded local_embs are checked against the oracle under the other plan, every rank;
# the outputs against the golden output and the reference.
"$DYNEMB_PYTHON" - seq.json <<'EOF' || fail "seq: the JSON report"
import json, sys
r = json.load(open(sys.argv[1]))
names = {c["name"]: c["status"] for c in r["checks"]}
for k in range(2):
    for rank in range(8):
        for n in ("lookup.local_embs", "output.golden", "output.reference"):
            assert names.get(f"batch{k}.rank{rank}.{n}") == "pass", (k, rank, n, names.get(f"batch{k}.rank{rank}.{n}"))
assert r["plan"]["path"] == "other.yaml", r["plan"]
EOF
# Without an oracle the re-sharded local_embs are what the output dist runs on.
cp seq.h5 seq-noor.h5
drop_oracle seq-noor.h5
"$DYNEMB" replay seq-noor.h5 --plan other.yaml --json noor.json >noor.out 2>&1
expect_rc seq_no_oracle 0 $?
"$DYNEMB_PYTHON" -c '
import json, sys
r = json.load(open(sys.argv[1]))
gold = [c for c in r["checks"] if c["check"] == "golden"]
assert len(gold) == 16 and all(c["status"] == "pass" for c in gold), [(c["name"], c["status"]) for c in gold]' \
  noor.json || fail "seq_no_oracle: the golden outputs are not all checked and passing"
# A wrong row in the captured local_embs shows up after the re-shard (a mismatch, exit 1).
cp seq-noor.h5 seq-bad.h5
"$DYNEMB_PYTHON" -c 'import sys, h5py; d = h5py.File(sys.argv[1], "r+")["batches/1/rank2/local_embs"]; v = d[...]; v[0, 3] += 1; d[...] = v' seq-bad.h5
"$DYNEMB" replay seq-bad.h5 --plan other.yaml -q >bad.out 2>&1
expect_rc seq_bad_row 1 $?
has_text bad.out "result: FAIL (exit 1)" seq_bad_row

# ---- pooled: partial sums cannot be re-sharded; with /oracle the lookups are derived
"$DYNEMB" synth --preset unit-pooled-w8 --batches 2 --batch-size 4 --seed 6 -o pooled.h5 >/dev/null ||
  fail "synth pooled"
sed '0,/num_embeddings: 1000$/s//num_embeddings: 5000/' "$DYNEMB_SRC/plans/unit-pooled-w8.yaml" >otherp.yaml
"$DYNEMB" replay pooled.h5 --plan otherp.yaml --json pooled.json >pooled.out 2>&1
expect_rc pooled 0 $?
has_text pooled.out "tables[t0].num_embeddings: 1000 (capture) -> 5000 (--plan)" pooled
has_text pooled.out "pooled local_embs are partial sums over the capture's shards and cannot be re-sharded; the output dist runs on lookups from /oracle or /tables" pooled
"$DYNEMB_PYTHON" -c '
import json, sys
r = json.load(open(sys.argv[1]))
gold = [c for c in r["checks"] if c["check"] == "golden"]
assert len(gold) == 16 and all(c["status"] == "pass" for c in gold), gold' pooled.json ||
  fail "pooled: golden outputs not checked"
# ... and without /oracle they are skipped, with the reason; a run whose every check was
# skipped checked nothing: trouble, exit 2.
cp pooled.h5 pooled-noor.h5
drop_oracle pooled-noor.h5
"$DYNEMB" replay pooled-noor.h5 --plan otherp.yaml --json pn.json >pn.out 2>&1
expect_rc pooled_no_oracle 2 $?
has_text pn.out "pooled-noor.h5: nothing was checked: all 16 checks" pooled_no_oracle
"$DYNEMB_PYTHON" -c '
import json, sys
r = json.load(open(sys.argv[1]))
gold = [c for c in r["checks"] if c["check"] == "golden"]
assert len(gold) == 16 and all(c["status"] == "skipped" for c in gold), gold
assert all("cannot be re-sharded to another plan" in c["message"] for c in gold), gold[0]' pn.json ||
  fail "pooled_no_oracle: golden outputs not skipped with the reason"

# ---- the same plan (another file, same sharding): no differences, the captured ctx is used
cp "$DYNEMB_SRC/plans/unit-seq-w8.yaml" same.yaml
"$DYNEMB" replay seq.h5 --plan same.yaml -q >same.out 2>&1
expect_rc same 0 $?
grep -q "differs from the capture's plan" same.out && fail "same: differences reported for the same plan"
has_text same.out "# ctx        captured" same

no_temps "$tmp" replan

[[ $fails -eq 0 ]] && echo "another plan: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
