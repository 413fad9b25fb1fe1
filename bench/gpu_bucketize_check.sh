#!/usr/bin/env bash
# The bucketize alone on the GPU machine, in one short call (a ~6-minute limit): build
# dynemb-dist and the CUDA test, the bucketize test cases, bench rows with their floors and
# path (--diagnostics), bench --sweep over B per rank, compute-sanitizer memcheck and racecheck
# on the partition case, the partition's two kernels on the batches where auto takes its one
# launch, the torch peer on ec-bench-criteo and unit-pooled-w8 x64; a summary printed last.
#   OUT=/tmp/out bash bench/gpu_bucketize_check.sh
# Each step runs under `timeout` and is skipped when the budget (BUDGET seconds, default 330)
# cannot hold it; no step runs past the budget. The summary says what ran, the rows, and
# bench/compare.py's targets. The build reuses $BUILD_DIR (default build-gpu) when present.
# Logs: $OUT/*.log, $OUT/ours-*.json (bench), $OUT/peer-*.json (torch).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dynemb-bucketize-out}
mkdir -p "$OUT"
B=${BUILD_DIR:-build-gpu}
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-330}
ITERS=${ITERS:-20}
EXP=/tmp/dynemb-bucketize-export
rm -rf "$EXP"; mkdir -p "$EXP"
t0=$(date +%s)
SUMMARY="$OUT/summary.txt"; : > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
# step NAME NEED_S LIMIT_S cmd...: runs cmd (log $OUT/NAME.log) when NEED_S seconds are left.
step() {
  local name=$1 need=$2 limit=$3; shift 3
  if [ "$(left)" -lt "$need" ] || [ "$(left)" -lt 1 ]; then note "SKIP  $name (budget: $(left) s left)"; return 0; fi
  [ "$limit" -gt "$(left)" ] && limit=$(left)  # no step runs past the budget
  local s=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  note "$( [ $rc -eq 0 ] && echo 'ok   ' || echo "rc=$rc" ) $name ($(( $(date +%s) - s )) s)"
  return $rc
}

export PATH=/usr/local/cuda/bin:$PATH
step build 0 280 bash -c "cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DDYNEMB_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DDYNEMB_PYTHON=$(command -v $PY) && cmake --build $B -j 16 --target dynemb-dist gpu_test_cuda_backend"
if [ ! -x $B/dynemb-dist ] || [ ! -x $B/tests/gpu_test_cuda_backend ]; then
  grep -E "error|warning" "$OUT/build.log" | head -20; tail -20 "$OUT/build.log"; exit 1
fi
grep -E "warning" "$OUT/build.log" | grep -v "^ninja" | head -5 | tee -a "$SUMMARY"
T=$B/tests/gpu_test_cuda_backend
D=$B/dynemb-dist
step gpu-test-bucketize 20 90 $T '-tc=batched bucketize*' -s=false
tail -3 "$OUT/gpu-test-bucketize.log" | tee -a "$SUMMARY"

bench() {  # name, time limit (s), bench args...
  local name=$1 limit=$2; shift 2
  step "bench-$name" 10 "$limit" $D bench "$@" --backend cuda --diagnostics --iters $ITERS --json "$OUT/ours-$name.json"
}
# The acceptance rows first, then the sweep, the sanitizers, the rest.
bench criteo 90 --preset ec-bench-criteo --export $EXP/criteo
bench pooled16 45 --preset unit-pooled-w8 --scale 16
bench pooled64 45 --preset unit-pooled-w8 --scale 64 --export $EXP/pooled64
bench hstu 45 --preset hstu-e2e
bench hstu16 60 --preset hstu-e2e --scale 16
step sweep-criteo 30 90 $D bench --backend cuda --preset ec-bench-criteo --sweep --diagnostics --iters 10 \
  --json "$OUT/ours-sweep-criteo.json"
export DYNEMB_GPU_CASES=40
step memcheck 25 80 compute-sanitizer --tool memcheck --error-exitcode 9 $T '-tc=*partition path*'
step racecheck 25 80 compute-sanitizer --tool racecheck --error-exitcode 9 $T '-tc=*partition path*'
unset DYNEMB_GPU_CASES
bench pooled 30 --preset unit-pooled-w8
step sweep-pooled 25 60 $D bench --backend cuda --preset unit-pooled-w8 --sweep --diagnostics --iters 10 \
  --json "$OUT/ours-sweep-pooled.json"
# The partition's two kernels where auto takes its one launch (same batches, same run); the
# JSON goes to two-kernels-*.json, outside the targets' files (ours-*.json: the default path).
two_kernels() {  # name, time limit (s), bench args...
  local name=$1 limit=$2; shift 2
  step "two-kernels-$name" 10 "$limit" $D bench "$@" --backend cuda --bucketize-kernel partition \
    --diagnostics --iters $ITERS --json "$OUT/two-kernels-$name.json"
}
two_kernels pooled16 45 --preset unit-pooled-w8 --scale 16
two_kernels pooled64 45 --preset unit-pooled-w8 --scale 64
two_kernels sweep-pooled 60 --preset unit-pooled-w8 --sweep
two_kernels criteo 90 --preset ec-bench-criteo
# The previous path on the same batch (a warp per bag), for the comparison in one run.
bench criteo-3pass 90 --preset ec-bench-criteo --bucketize-kernel three-pass
for n in criteo pooled64; do  # torch's composition of the same steps on the same data
  [ -f $EXP/$n/meta.json ] && step peer-$n 20 60 $PY bench/peer_torch.py $EXP/$n \
    --iters 10 --json "$OUT/peer-$n.json"
done

# The rows that matter, from the JSON: time, % of copy, the path (diagnostics) and floors.
$PY - "$OUT" <<'PYEOF' | tee -a "$SUMMARY"
import glob, json, os, sys
d = sys.argv[1]
for p in sorted(glob.glob(d + "/ours-*.json")) + sorted(glob.glob(d + "/two-kernels-*.json")):
    try:
        js = json.load(open(p))
    except Exception as e:
        print(f"{os.path.basename(p)}: unreadable ({e})"); continue
    print(f"# {js.get('workload')}" + (" (two kernels)" if "two-kernels-" in p else ""))
    for st in js.get("stages", []):
        if "bucketize" in st["name"] or "pipeline" in st["name"] or "fused" in st["name"]:
            pc = st.get("pct_copy")
            print(f"  {st['name']:<48} {st['time_us']:>10.1f} us  "
                  f"{(pc if pc is not None else float('nan')):6.1f} % of copy  {st.get('note','')}")
    for line in js.get("diagnostics", []):
        if "path" in line or "floors" in line or "steps" in line or "durations" in line:
            print(f"  # {line}")
PYEOF
for n in criteo pooled64; do
  [ -f "$OUT/peer-$n.log" ] && grep -E "^#|bucketize|sequence|pipeline" "$OUT/peer-$n.log" \
    | head -14 | tee -a "$SUMMARY"
done
$PY bench/compare.py "$OUT" 2>&1 | grep "^#  " | tee -a "$SUMMARY"  # the targets, PASS/MISS
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/memcheck.log" "$OUT/racecheck.log" 2>/dev/null \
  | tee -a "$SUMMARY"
note "total $(( $(date +%s) - t0 )) s"
echo "=== summary ==="; cat "$SUMMARY"
