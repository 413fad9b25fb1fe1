#!/usr/bin/env bash
# A plan with `input_dist: inference` and uneven continuous shards (what `load --write-plans`
# writes as balanced.yaml): `validate` accepts it and shows the uneven rows per rank; the host
# engine routes it by the shards' offsets (block_bucketize_pos): `synth` writes a capture of it
# whose input splits are those of that rule and which `replay` passes, and `replay --plan` of an
# even-plan capture passes under it. The GPU backends (one block size per feature) refuse it
# with exit 2 and one line rather than replay the even split under its name.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON.
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, run, has, ...
cd "$tmp" || exit 1

# unit-seq-w2 with t0 (1000 rows) split 100 / 900 instead of the ceil rule's 500 / 500.
sed 's/^comm_precision: fp32$/comm_precision: fp32\ninput_dist: inference/' \
  "$DYNEMB_SRC/plans/unit-seq-w2.yaml" |
  awk '{print} /^    features: \[f0\]$/ {
    print "    shards:"
    print "      - {rank: 0, row_offset: 0, rows: 100}"
    print "      - {rank: 1, row_offset: 100, rows: 900}"
  }' >balanced.yaml
grep -q "input_dist: inference" balanced.yaml || fail "balanced.yaml: no input_dist line"

run validate 0 validate balanced.yaml
has validate "input_dist inference"
has validate "# status: ok \(0 errors, 0 warnings, 0 notes\), exit 0"
# Rank 0 holds 100 rows of t0, rank 1 900.
has validate "^     0       100 "
has validate "^     1       900 "

# The same shards under the training input dist break the ceil rule.
grep -v "input_dist" balanced.yaml >training.yaml
run training 2 validate training.yaml
has training "training routes ids \[0,500\) to rank 0 \(blk=500\), but shards give rank 0 rows \[0,100\)"

"$DYNEMB" synth --preset unit-seq-w2 --batches 2 --batch-size 4 --seed 3 -o cap.h5 >/dev/null ||
  fail "synth"
before=$(sha cap.h5)
# The even-plan capture under the balanced plan: its context is derived there, its sequence
# local_embs re-sharded there, and the outputs (the unsharded result) agree.
run replay 0 replay cap.h5 --plan balanced.yaml
has replay "--plan differs from the capture's plan: tables\[t0\].shards: even split \(capture\) -> \[rank 0: rows 0\+100, rank 1: rows 100\+900\] \(--plan\)"
has replay "^# result: PASS \(exit 0\)"
[[ "$(sha cap.h5)" == "$before" ]] || fail "replay: the capture was changed"

# synth of the balanced plan, int32 ids (past the table too: bounds_check ignore): the input
# splits it writes are those of the shards' offsets, checked here against the rule written
# out in Python (rank r takes the ids in [o_r, o_r + rows_r); an id past the table goes to
# x % W); and replay passes the capture.
sed 's/^comm_precision: fp32$/comm_precision: fp32\nbounds_check: ignore/' balanced.yaml >oob.yaml
run synth 0 synth oob.yaml --batches 2 --batch-size 6 --seed 5 --index-type int32 \
  --oob-ids 0.2 -o inf.h5
run replay_inf 0 replay inf.h5
run inspect 0 inspect inf.h5
has inspect "^#   table t0: 1000 rows \(uneven shards\), D=128"
has inspect "^#   table t1: 1001 rows \(blk 501\), D=128"
has replay_inf "^# result: PASS \(exit 0\)"
"$DYNEMB_PYTHON" - inf.h5 <<'EOF_PY' || fail "synth: input_splits are not those of the shards"
import sys, h5py, numpy as np
pos = {"f0": [0, 100, 1000]}  # t0's shards; t1..t3 keep the ceil rule
rows = {"f0": 1000, "f1": 1001, "f2": 2047, "f3": 17}
W, F = 2, 4
seen_uneven = 0
with h5py.File(sys.argv[1], "r") as f:
    for k in f["batches"]:
        for r in range(W):
            g = f[f"batches/{k}/rank{r}"]
            lengths, values = g["lengths"][()], g["values"][()].astype(np.int64)
            assert g["values"].dtype == np.int32, g["values"].dtype
            B = len(lengths) // F
            want, at = [0] * W, 0
            for i, name in enumerate(["f0", "f1", "f2", "f3"]):
                n = int(lengths[i * B:(i + 1) * B].sum())
                for v in values[at:at + n]:
                    x = int(v) & 0xFFFFFFFF  # the unsigned int32 id
                    if name in pos:
                        p = pos[name]
                        lb = max(j for j in range(len(p)) if p[j] <= x)
                        d = lb if lb < W else x % W
                        seen_uneven += 1
                    else:
                        blk = -(-rows[name] // W)
                        d = x // blk if x < blk * W else x % W
                    want[d] += 1
                at += n
            got = list(g["ctx/input_splits"][()])
            assert got == want, (k, r, got, want)
assert seen_uneven > 10, seen_uneven
EOF_PY

# Pooled, MEAN and VBE: t_item (30001 rows, pooling mean) split [1, 0, 29000, 1000] over W = 4
# (an empty shard); t_ctx's explicit shards follow the ceil rule and keep it.
sed 's/^comm_precision: fp32$/comm_precision: fp32\ninput_dist: inference/' \
  "$DYNEMB_SRC/plans/pooled-mean-mixed-dims.yaml" |
  awk '{print} /^    features: \[f_item\]$/ {
    print "    shards:"
    print "      - {rank: 0, row_offset: 0, rows: 1}"
    print "      - {rank: 1, row_offset: 1, rows: 0}"
    print "      - {rank: 2, row_offset: 1, rows: 29000}"
    print "      - {rank: 3, row_offset: 29001, rows: 1000}"
  }' >pooled.yaml
"$DYNEMB" synth --preset pooled-mean-mixed-dims --batches 2 --batch-size 4 --seed 7 \
  -o pcap.h5 >/dev/null || fail "synth pooled"
run pooled_plan 0 replay pcap.h5 --plan pooled.yaml
has pooled_plan "tables\[t_item\].shards: even split \(capture\) -> \[rank 0: rows 0\+1, rank 1: rows 1\+0, rank 2: rows 1\+29000, rank 3: rows 29001\+1000\]"
has pooled_plan "^# result: PASS \(exit 0\)"
run pooled_synth 0 synth pooled.yaml --batches 2 --batch-size 5 --vbe --weighted --seed 8 \
  -o pinf.h5
run pooled_inf 0 replay pinf.h5
has pooled_inf "^# result: PASS \(exit 0\)"

# The GPU backends take one block size per feature: refused, naming the backend, at the
# replay's start (where there is a GPU; without one, through the test hook of a device node).
want="the cuda backend cannot replay this plan: table 't0' has uneven explicit shards under input_dist inference, which the GPU bucketize (one block size per feature, docs/semantics.md §2) cannot route; --backend cpu does"
if [[ "${DYNEMB_HAVE_CUDA:-OFF}" != "ON" ]]; then
  echo "skipped: the cuda backend refusal (a build without CUDA)"
elif nvidia-smi -L >/dev/null 2>&1; then
  # run() caps the address space, and a CUDA context reserves far more of it than that cap:
  # the GPU runs go without the cap.
  run_gpu() {
    local name=$1 want=$2 rc
    shift 2
    timeout 120 "$DYNEMB" "$@" >"$tmp/$name.out" 2>&1
    rc=$?
    [[ $rc -eq $want ]] || { fail "$name: exit $rc, want $want ($*)"; sed 's/^/    /' "$tmp/$name.out" | head -30; }
  }
  run_gpu cuda 2 replay inf.h5 --backend cuda
  has_text cuda.out "$want" cuda
  run_gpu cuda_plan 2 replay cap.h5 --plan balanced.yaml --backend cuda
  has_text cuda_plan.out "$want" cuda_plan
  run_gpu auto 2 replay inf.h5
  has_text auto.out "$want" auto
elif has_test_hooks; then
  DYNEMB_GPU_NODE=/dev/null run cuda 2 replay inf.h5 --backend cuda
  has_text cuda.out "$want" cuda
else
  echo "skipped: the cuda backend refusal (no GPU and no test hooks)"
fi
run bench_cuda 2 bench inf.h5 --backend cuda
has bench_cuda "the cuda backend cannot bench this plan: table 't0' has uneven explicit shards"
run bench_cpu 0 bench inf.h5 --backend cpu --iters 1

# An inference plan whose shards follow the ceil rule routes as training does: replayed.
sed 's/rows: 100}/rows: 500}/; s/row_offset: 100, rows: 900/row_offset: 500, rows: 500/' \
  balanced.yaml >even.yaml
run even 0 replay cap.h5 --plan even.yaml
has even "--plan differs from the capture's plan: input_dist: training \(capture\) -> inference \(--plan\)"

[[ $fails -eq 0 ]] && echo "all ok"
[[ $fails -eq 0 ]]
