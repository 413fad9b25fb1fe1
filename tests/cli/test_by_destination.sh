#!/usr/bin/env bash
# One destination rank at a time (lib/engine/dest_blocks.hpp): a batch whose lookups are all
# captured is replayed reading only the rows of one destination's output at a time; its report
# must be exactly the whole batch's. Every capture below is replayed whole (the test hook
# DYNEMB_BY_DESTINATION=off) and by destination (=report, which also says on stderr how each
# batch ran), and again with pooled destinations made three rows at a time
# (DYNEMB_DESTINATION_ROWS=3); the JSON reports must agree check for check (messages, counts,
# first mismatch coordinates, causes), timings aside. The captures: every fixture, synth'd sequence,
# pooled, VBE, weighted and mixed-dims captures, and planted faults: golden outputs and
# local_embs changed at elements of several destinations (--max-mismatches 2 cutting inside a
# later destination's), which run by destination; a swapped unbucketize_permute and a
# batch_size_per_rank the reduce-scatter cannot run with (the contexts are not the derived
# ones), which the planner cuts whole; and a damaged chunk of one rank's local_embs, whose units
# are trouble while the others run.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py);
# DYNEMB_BACKEND (default cpu): the backend both replays use (cuda on the GPU machine, which
# also compares large units on cuda with the CPU).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }
. "$(dirname "$0")/common.sh"
need_test_hooks
cd "$tmp" || exit 1
backend=${DYNEMB_BACKEND:-cpu}

# same NAME CAPTURE HOW [REPLAY ARGS...]: whole vs by destination; HOW is what the hook must
# say of every batch: "one destination at a time", "whole", or "-" (no batch is tried).
same() {
  local name=$1 cap=$2 how=$3
  shift 3
  DYNEMB_BY_DESTINATION=off "$DYNEMB" replay "$cap" --backend "$backend" --quiet \
    --json "$name.whole.json" "$@" >/dev/null 2>"$name.whole.err"
  local rc_whole=$?
  DYNEMB_BY_DESTINATION=report "$DYNEMB" replay "$cap" --backend "$backend" --quiet \
    --json "$name.dest.json" "$@" >/dev/null 2>"$name.dest.err"
  local rc_dest=$?
  ((rc_whole < 126)) || fail "$name: exit $rc_whole: the replay did not run ($DYNEMB)"
  [[ $rc_whole == "$rc_dest" ]] || fail "$name: exit $rc_whole whole, $rc_dest by destination"
  local said
  said=$(grep "DYNEMB_BY_DESTINATION: batch" "$name.dest.err" | sed 's/.*: //' | sort -u)
  if [[ $how == "-" ]]; then
    [[ -z $said ]] || fail "$name: a batch was tried by destination ($said)"
  else
    [[ $said == "$how" ]] || fail "$name: batches ran '$said', want '$how'"
  fi
  grep -v "DYNEMB_BY_DESTINATION" "$name.dest.err" | cmp -s - "$name.whole.err" ||
    fail "$name: stderr differs"
  # Pooled destinations a few rows at a time (the hook caps a unit's rows).
  DYNEMB_DESTINATION_ROWS=3 DYNEMB_BY_DESTINATION=report "$DYNEMB" replay "$cap" \
    --backend "$backend" --quiet --json "$name.rows.json" "$@" >/dev/null 2>"$name.rows.err"
  [[ $? == "$rc_whole" ]] || fail "$name: exit differs with units of 3 rows"
  cmp -s "$name.rows.err" "$name.dest.err" || fail "$name: stderr differs with units of 3 rows"
  reports_equal "$name.whole.json" "$name.rows.json" ||
    fail "$name: reports differ with units of 3 rows"
  reports_equal "$name.whole.json" "$name.dest.json" || fail "$name: reports differ"
  ok "$name (exit $rc_whole, $how)"
}

# Fixtures as they are: MEAN pooled plans and captures with module_output stay whole (their
# diagnoses and the mean-pooling step take whole tensors), the others run by destination.
for fx in "$DYNEMB_SRC"/fixtures/*.h5; do
  base=$(basename "$fx" .h5)
  how="one destination at a time"
  [[ $base == pooled-mean* ]] && how="-"
  "$DYNEMB_PYTHON" -c "import h5py,sys; f=h5py.File(sys.argv[1]); n=[]; f.visit(n.append); \
sys.exit(0 if any(x.endswith('module_output') for x in n) else 1)" "$fx" && how="-"
  same "fixture-$base" "$fx" "$how"
done

synth() { "$DYNEMB" synth "$@" --seed 5 >/dev/null 2>&1 || fail "synth $*"; }
synth --preset unit-seq-w8 -o seq.h5 --batches 2
synth --preset unit-pooled-w8 -o pooled.h5 --batches 2
synth --preset odd-dims -o odd.h5
synth --preset unit-pooled-w8 -o vbe.h5 --vbe --weighted --batches 2
synth --preset unit-seq-w8 -o seqvbe.h5 --vbe --batch-sizes 8,8,5,0,8,3,8,8
for c in seq pooled odd vbe seqvbe; do
  same "$c" "$c.h5" "one destination at a time"
done
same seq-ctx-derived seq.h5 whole --ctx derived  # the dist runs on derived lookups

# Planted faults.
"$DYNEMB_PYTHON" - <<'EOF'
import shutil, h5py, numpy as np
def edit(src, dst, path, fn):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        d = f[path]
        v = d[...]
        fn(v)
        d[...] = v
def bump(cells):
    def fn(v):
        for c in cells:
            v[c] += 1
    return fn
# golden outputs of two destinations, rows out of order
edit("pooled.h5", "pooled-gold.h5", "batches/1/rank2/output", bump([(5, 0), (3, 20), (3, 2)]))
with h5py.File("pooled-gold.h5", "r+") as f:
    f["batches/1/rank6/output"][0, 1] += 1
edit("seq.h5", "seq-gold.h5", "batches/0/rank3/output", bump([(7, 1), (2, 0)]))
# captured lookups: elements sent to several destinations (rows far apart in local_embs)
def far(v):
    n = v.shape[0]
    for r in (n - 1, 0, n // 2, n // 3):
        v[r, 0] += 1
edit("seq.h5", "seq-local.h5", "batches/1/rank4/local_embs", far)
edit("pooled.h5", "pooled-local.h5", "batches/0/rank1/local_embs", far)
# contexts that are not the derived ones
def swap(v):
    v[[3, 10]] = v[[10, 3]]
edit("seq.h5", "seq-perm.h5", "batches/0/rank1/ctx/unbucketize_permute", swap)
def bspr(v):
    v[0] += 1
    v[1] -= 1
edit("pooled.h5", "pooled-bspr.h5", "batches/0/rank3/ctx/batch_size_per_rank", bspr)
# a damaged chunk in the middle of rank 2's local_embs of batch 1
shutil.copy("seq.h5", "seq-damaged.h5")
with h5py.File("seq-damaged.h5", "r") as f:
    d = f["batches/1/rank2/local_embs"]
    info = d.id.get_chunk_info(d.id.get_num_chunks() // 2)
with open("seq-damaged.h5", "r+b") as f:
    f.seek(info.byte_offset + info.size // 2)
    f.write(b"\xff" * 64)
# dense weights for t0 and t2 (they win over /oracle): the lookups and references of their
# features made from them, unlike the captured ones
rng = np.random.default_rng(7)
for src in ("seq", "pooled"):
    shutil.copy(src + ".h5", src + "-dense.h5")
    with h5py.File(src + "-dense.h5", "r+") as f:
        for name, rows in (("t0", 1000), ("t2", 2047)):
            w = rng.integers(-64, 64, size=(rows, 128)).astype(np.float32) / 64
            f.create_dataset("tables/%s/weight" % name, data=w)
EOF
same pooled-gold pooled-gold.h5 "one destination at a time" --max-mismatches 2
same pooled-gold-all pooled-gold.h5 "one destination at a time"
same seq-gold seq-gold.h5 "one destination at a time" --max-mismatches 1
same seq-local seq-local.h5 "one destination at a time" --max-mismatches 3
same pooled-local pooled-local.h5 "one destination at a time" --max-mismatches 2
same seq-perm seq-perm.h5 "$(printf 'one destination at a time\nwhole')"
same pooled-bspr pooled-bspr.h5 "$(printf 'one destination at a time\nwhole')"
# A damaged chunk: the whole read leaves the rank's ctx/, local_embs and output out of its batch;
# cut by destination, the units whose rows hold the chunk are trouble, the others still run, and
# no check is decided on part of its data. Both exit 2 naming the chunk; batch 0 is the same.
damaged() {
  DYNEMB_BY_DESTINATION=off "$DYNEMB" replay seq-damaged.h5 --backend "$backend" --quiet \
    --json seq-damaged.whole.json >/dev/null 2>&1
  local rc_whole=$?
  DYNEMB_BY_DESTINATION=report "$DYNEMB" replay seq-damaged.h5 --backend "$backend" --quiet \
    --json seq-damaged.dest.json >/dev/null 2>seq-damaged.dest.err
  local rc_dest=$?
  [[ $rc_whole == 2 && $rc_dest == 2 ]] || fail "seq-damaged: exit $rc_whole whole, $rc_dest by destination, want 2"
  "$DYNEMB_PYTHON" - seq-damaged.whole.json seq-damaged.dest.json <<'PYEOF' || fail "seq-damaged: $(cat damaged.why)"
import json, sys
whole, dest = (json.load(open(p))["checks"] for p in sys.argv[1:])
why = open("damaged.why", "w")
def trouble(checks):
    return [c for c in checks if c["check"] == "trouble"]
for name, checks in (("whole", whole), ("by destination", dest)):
    t = trouble(checks)
    if not t or any(c["batch"] != 1 or c["rank"] != 2 or "/batches/1/rank2/local_embs: chunk" not in c["message"] for c in t):
        why.write("%s: troubles %r" % (name, [(c["batch"], c["rank"], c["message"][:80]) for c in t])); sys.exit(1)
b0 = lambda checks: [c for c in checks if c["batch"] == 0]
if b0(whole) != b0(dest):
    why.write("batch 0 differs"); sys.exit(1)
d1 = [c for c in dest if c["batch"] == 1]
# every output check of batch 1 is there once, decided or skipped; the lookups the damage
# touches are skipped, never passed on part of their data
outs = [(c["rank"], c["check"]) for c in d1 if c["stage"] == "output"]
lookups = [c for c in d1 if c["stage"] == "lookup"]
if sorted(outs) != sorted(set(outs)) or len(outs) != 16 or len(lookups) != 8 or \
        any(c["status"] != "skipped" for c in lookups):
    why.write("batch 1: outputs %r, lookups %r" % (outs, [c["status"] for c in lookups])); sys.exit(1)
PYEOF
  ok "seq-damaged (exit 2 both ways, every check of the damaged batch decided or skipped once)"
}
damaged
for c in seq pooled; do
  same "$c-dense" "$c-dense.h5" "one destination at a time" --max-mismatches 3
  same "$c-dense-rtol" "$c-dense.h5" "one destination at a time" --tolerance rtol:0.5,atol:0.5
done
grep -q '"status": "fail"' pooled-dense.dest.json || fail "pooled-dense: no failed check"
grep -q '"column"' pooled-gold.dest.json || fail "pooled-gold: no mismatch coordinates"
grep -q '"status": "fail"' seq-local.dest.json || fail "seq-local: no failed check"

# On the GPU: units large enough that their rows are lent to the device (pinned once, uploaded
# without staging, HostLending), clean and with planted faults in several destinations' golden
# outputs and lookups (and, in big-seq-bad, a context): the cuda replay's report is the CPU's,
# and the trace shows the pinning and the GPU's bucketize.
if [[ $backend == cuda ]]; then
  synth --preset unit-pooled-w8 -o big-pooled.h5 --batch-size 4096 --batches 2
  synth --preset unit-seq-w8 -o big-seq.h5 --batch-size 512 --hotness 0..64 --batches 2
  "$DYNEMB_PYTHON" - <<'EOF'
import shutil, h5py
for src in ("big-pooled", "big-seq"):
    shutil.copy(src + ".h5", src + "-bad.h5")
    with h5py.File(src + "-bad.h5", "r+") as f:
        for path, at in (("batches/1/rank2/output", (7, 3)), ("batches/1/rank5/output", (-1, 0)),
                         ("batches/0/rank6/local_embs", (0, 1)),
                         ("batches/1/rank1/local_embs", (-1, -1))):
            d = f[path]
            v = d[...]
            v[at] += 0.5
            d[...] = v
        if src == "big-seq":  # a context the GPU's input dist must find wrong, as the host's does
            d = f["batches/1/rank3/ctx/unbucketize_permute"]
            v = d[...]
            v[[4, 9]] = v[[9, 4]]
            d[...] = v
EOF
  for c in big-pooled big-seq big-pooled-bad big-seq-bad; do
    "$DYNEMB" replay "$c.h5" --backend cpu --quiet --json "$c.cpu.json" >/dev/null 2>&1
    rc_cpu=$?
    DYNEMB_TRACE="$c.trace.json" "$DYNEMB" replay "$c.h5" --backend cuda --quiet \
      --json "$c.cuda.json" >/dev/null 2>&1
    rc_cuda=$?
    [[ $rc_cpu == "$rc_cuda" ]] || fail "$c: exit $rc_cpu on cpu, $rc_cuda on cuda"
    reports_equal "$c.cpu.json" "$c.cuda.json" || fail "$c: the cuda report is not the cpu one"
    grep -q '"pin host"' "$c.trace.json" || fail "$c: no unit's rows were lent to the GPU"
    # Batch 1 at least finds the backend started: the GPU bucketizes its ranks in one launch.
    grep -q '"bucketize upload"' "$c.trace.json" || fail "$c: no batch was bucketized on the GPU"
    ok "$c: cuda = cpu (exit $rc_cpu), unit rows lent to the GPU, bucketized on the GPU"
  done
  "$DYNEMB_PYTHON" - big-seq-bad.cuda.json <<'EOF' || fail "big-seq-bad: the swapped context"
import json, sys
c = {x["name"]: x for x in json.load(open(sys.argv[1]))["checks"]}
x = c["batch1.rank3.ctx.unbucketize_permute"]
assert x["status"] == "fail" and x["mismatches"] == 2, x
assert [d["where"]["index"] for d in x["details"]] == [4, 9], x["details"]
EOF
  grep -q '"status": "fail"' big-seq-bad.cuda.json || fail "big-seq-bad: no failed check"
  grep -q '"status": "fail"' big-pooled-bad.cuda.json || fail "big-pooled-bad: no failed check"
fi

[[ $fails -eq 0 ]] && echo "by destination: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
