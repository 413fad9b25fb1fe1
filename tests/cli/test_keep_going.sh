#!/usr/bin/env bash
# Keep going after trouble (cli.md "replay"): trouble in one rank-batch (a dataset of the wrong
# dtype or shape, an unreadable KJT) is an error check of that batch and rank, and the replay
# goes on with every other rank-batch; exit 2; text, JSON and JUnit list every trouble.
# --fail-fast stops at the first, as before.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, sha, expect_rc, ...
cd "$tmp" || exit 1

mutate() {
  "$DYNEMB_PYTHON" - "$1" "$2" <<'EOF' || fail "mutate $1 failed"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    exec(sys.argv[2])
EOF
}
"$DYNEMB" synth --preset unit-seq-w8 --batches 3 --batch-size 8 --seed 4 -o clean.h5 >/dev/null ||
  fail "synth clean.h5"
"$DYNEMB" replay clean.h5 --quiet --json clean.json >/dev/null || fail "the clean capture does not pass"

# Batch 0 rank 1: a float64 ctx dataset; batch 2 rank 3: local_embs one row short.
cp clean.h5 bad.h5
mutate bad.h5 '
g = f["batches/0/rank1/ctx"]; v = g["batch_size_per_rank"][...]; del g["batch_size_per_rank"]
g["batch_size_per_rank"] = v / 1.0
g = f["batches/2/rank3"]; v = g["local_embs"][...]; del g["local_embs"]; g["local_embs"] = v[:-1]'
bad_sha=$(sha bad.h5)
"$DYNEMB" replay bad.h5 --json bad.json --junit bad.xml >bad.out 2>&1
expect_rc keep_going 2 $?
[[ "$(sha bad.h5)" == "$bad_sha" ]] || fail "keep_going: the capture was changed"
no_temps "$tmp" keep_going
has_text bad.out "bad.h5:/batches/0/rank1/ctx/batch_size_per_rank: dtype float64, want int64 (this rank's ctx/, local_embs and output are left out of the replay)" keep_going
has_text bad.out "bad.h5:/batches/2/rank3/local_embs: shape" keep_going
has_text bad.out "ERROR batch 0 rank 1 capture trouble" keep_going
has_text bad.out "result: ERROR (exit 2)" keep_going
"$DYNEMB_PYTHON" - clean.json bad.json <<'EOF' || fail "keep_going: the JSON report"
import json, sys
clean, bad = (json.load(open(p)) for p in sys.argv[1:3])
def by_rank_batch(r):
    out = {}
    for c in r["checks"]:
        out.setdefault((c["batch"], c["rank"]), []).append(c)
    return out
cb, bb = by_rank_batch(clean), by_rank_batch(bad)
errs = [(c["batch"], c["rank"], c["stage"]) for c in bad["checks"] if c["status"] == "error"]
assert errs == [(0, 1, "capture"), (2, 3, "capture")], errs
assert bad["summary"]["exit_code"] == 2 and bad["trouble"] is None, bad["summary"]
# Every other rank-batch has all the checks of the clean run, all passing; only the checks
# across ranks that need the lost rank's context (splits symmetry) are missing in batches 0, 2.
for key, checks in cb.items():
    if key in [(0, 1), (2, 3)]:
        continue
    got = {c["name"]: c["status"] for c in bb.get(key, [])}
    want = {c["name"]: c["status"] for c in checks}
    missing = set(want) - set(got)
    if key[0] in (0, 2):
        assert all(n.endswith(".symmetry") for n in missing), (key, missing)
    else:
        assert not missing, (key, missing)
    assert all(got[n] == want[n] == "pass" for n in got), (key, got)
# The troubled rank-batches keep what does not need the lost parts: the output of rank 1 of
# batch 0 is still checked against the unsharded reference (derived lookups).
names01 = {c["name"]: c["status"] for c in bb[(0, 1)]}
assert names01.get("batch0.rank1.output.reference") == "pass", names01
assert names01.get("batch0.rank1.capture.trouble") == "error", names01
print("rank-batches checked:", len(bb), "error checks:", errs)
EOF
[[ $(grep -c '<error type="trouble"' bad.xml) -eq 2 ]] || fail "keep_going: JUnit has not two <error> testcases"
grep -q 'name="batch2.rank3.capture.trouble"' bad.xml || fail "keep_going: no JUnit testcase for batch 2 rank 3"

# --fail-fast: the first trouble ends the run (exit 2, the run's trouble, no later batch).
"$DYNEMB" replay bad.h5 --fail-fast --json ff.json >ff.out 2>&1
expect_rc fail_fast 2 $?
has_text ff.out "# trouble: bad.h5:/batches/0/rank1/ctx/batch_size_per_rank: dtype float64, want int64" fail_fast
"$DYNEMB_PYTHON" -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["trouble"] and not [c for c in r["checks"] if c["batch"] > 0], r["summary"]' ff.json ||
  fail "fail_fast: later batches were replayed"

# A KJT that cannot be read (batch 1 rank 2 lengths missing): batch 1 is lost (every rank
# needs every KJT: the input dist is an all-to-all), batches 0 and 2 are checked.
cp clean.h5 nokjt.h5
mutate nokjt.h5 'del f["batches/1/rank2/lengths"]'
"$DYNEMB" replay nokjt.h5 --quiet --json nokjt.json >nokjt.out 2>&1
expect_rc kjt 2 $?
has_text nokjt.out "nokjt.h5:/batches/1/rank2/lengths" kjt
"$DYNEMB_PYTHON" -c '
import json, sys
r = json.load(open(sys.argv[1]))
errs = [(c["batch"], c["rank"]) for c in r["checks"] if c["status"] == "error"]
assert errs == [(1, 2)], errs
batches = {c["batch"] for c in r["checks"] if c["status"] == "pass"}
assert batches == {0, 2}, batches' nokjt.json || fail "kjt: batches 0 and 2 not checked around the lost batch 1"

# --write-output with trouble: not written (it would be incomplete), the target unchanged.
cp clean.h5 target.h5
target_sha=$(sha target.h5)
"$DYNEMB" replay bad.h5 --quiet --write-output target.h5 >wo.out 2>&1
expect_rc write_output 2 $?
has_text wo.out "--write-output target.h5: not written (trouble in batch 0)" write_output
[[ "$(sha target.h5)" == "$target_sha" ]] || fail "write_output: the target was changed"
no_temps "$tmp" write_output

[[ $fails -eq 0 ]] && echo "keep going: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
