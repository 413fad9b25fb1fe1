#!/usr/bin/env bash
# The GPU side in one call on a GPU machine: build, all ctest tests (gpu label included),
# compute-sanitizer memcheck + racecheck on the GPU tests, our bench and the torch peer on the
# presets, then one table of ratios (printed last). BENCHMARKS.md is made from its output.
# Logs and JSON go to $OUT: summary.txt, bench-all.json and the logs packed in logs.tgz.
#   OUT=/tmp/out bash bench/run_on_gpu.sh [--quick]
# --quick (for a short device budget): build only dynemb-dist and the CUDA tests, run them (the
# backend's also with memcheck/racecheck on the bucketize test case), and bench + peer the
# hstu-e2e presets. Without --quick, the end-to-end table (bench/e2e.sh) comes last.
# LIBDEFLATE_DIR=<dir with include/libdeflate.h and lib/libdeflate.a> builds with that
# libdeflate (a machine without its package: carry the two files there); the e2e table names
# the inflate library that ran. E2E=0 leaves the end-to-end table out (it alone takes minutes:
# run bench/e2e.sh on its own then).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dynemb-out}
LOG=/tmp/dynemb-logs
EXP=/tmp/dynemb-export
rm -rf "$LOG" "$EXP"; mkdir -p "$OUT" "$LOG" "$EXP"
B=build-gpu
PY=${PYTHON:-python3}
ITERS=${ITERS:-20}
QUICK=0; [ "${1:-}" = "--quick" ] && QUICK=1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu \
  --format=csv > "$LOG/gpu.txt" 2>&1
stamp "build"
# -k 0: a half-written file elsewhere in the tree must not stop the CUDA targets.
DEFLATE_ARGS=()
[ -n "${LIBDEFLATE_DIR:-}" ] && DEFLATE_ARGS=(-DLIBDEFLATE_INCLUDE_DIR="$LIBDEFLATE_DIR/include"
  -DLIBDEFLATE_LIBRARY="$LIBDEFLATE_DIR/lib/libdeflate.a")
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DDYNEMB_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DDYNEMB_PYTHON="$(command -v $PY)" "${DEFLATE_ARGS[@]}" && \
  if [ $QUICK = 1 ]; then
    cmake --build $B -j 16 --target dynemb-dist gpu_test_cuda_backend gpu_test_cuda_workspace -- -k 0;
  else cmake --build $B -j 16 -- -k 0; fi; } > "$LOG/build.log" 2>&1
BUILD_RC=$?
[ $BUILD_RC -ne 0 ] && { echo "build rc=$BUILD_RC"; grep -E "error|FAILED" "$LOG/build.log" | head -20; }
if [ ! -x $B/dynemb-dist ] || [ ! -x $B/tests/gpu_test_cuda_backend ]; then
  tail -40 "$LOG/build.log"; tar czf "$OUT/logs.tgz" -C /tmp dynemb-logs; exit 1
fi
CTEST_RC=skipped
if [ $QUICK = 0 ]; then
  stamp "ctest (all labels)"
  ctest --test-dir $B --output-on-failure --timeout 150 -j 8 > "$LOG/ctest.log" 2>&1
  CTEST_RC=$?
  tail -15 "$LOG/ctest.log"
fi
stamp "gpu tests verbose"
$B/tests/gpu_test_cuda_backend -s=false > "$LOG/gpu-test.log" 2>&1; GPU_RC=$?
tail -4 "$LOG/gpu-test.log"
$B/tests/gpu_test_cuda_workspace > "$LOG/gpu-workspace.log" 2>&1; WS_RC=$?
grep -E "round 2 made|MISMATCH|Status" "$LOG/gpu-workspace.log"
stamp "compute-sanitizer"
export DYNEMB_GPU_CASES=40
SAN_TC="-tce=*2^31*"; [ $QUICK = 1 ] && SAN_TC="-tc=batched*"
# racecheck checks shared memory only: the bucketize's kernels (the batched cases, every path
# and instance) and the comparison's per-warp partial sums. Cases that replay whole batches
# (random batches, fixtures) each outlast 250 s under racecheck on an H100, so it runs the
# batched cases alone.
RACE_TC="-tc=batched*"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/gpu_test_cuda_backend \
  "$SAN_TC" > "$LOG/memcheck.log" 2>&1; MC_RC=$?
timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/gpu_test_cuda_backend \
  "$RACE_TC" > "$LOG/racecheck.log" 2>&1; RC_RC=$?
unset DYNEMB_GPU_CASES
tail -n 2 "$LOG/memcheck.log" "$LOG/racecheck.log"
D=$B/dynemb-dist
FIX_FAIL=0
[ $QUICK = 0 ] && stamp "replay every fixture on the GPU (auto -> cuda)"
for f in $( [ $QUICK = 0 ] && ls fixtures/*.h5 fixtures/torchrec/*.h5 ); do
  $D replay "$f" --backend cuda --quiet > "$LOG/replay-$(basename "$f" .h5).txt" 2>&1
  rc=$?
  [ $rc -ne 0 ] && { FIX_FAIL=$((FIX_FAIL+1)); echo "replay --backend cuda $f: exit $rc"; tail -5 "$LOG/replay-$(basename "$f" .h5).txt"; }
done
[ $QUICK = 0 ] && echo "fixtures replayed on cuda: $(ls fixtures/*.h5 fixtures/torchrec/*.h5 | wc -l), failing: $FIX_FAIL"
stamp "bench"
run() {  # name, args...
  local name=$1; shift
  $D bench "$@" --diagnostics --iters $ITERS --json "$LOG/ours-$name.json" > "$LOG/ours-$name.txt" 2>&1 \
    || echo "bench $name failed: $(tail -2 "$LOG/ours-$name.txt")"
}
[ $QUICK = 0 ] && run criteo --preset ec-bench-criteo --dims 4,8,16,32,64,128 --export $EXP/criteo
run hstu --preset hstu-e2e --export $EXP/hstu
run hstu-launch --preset hstu-e2e --queue-ahead 0   # the same, launch latency included
run hstu16 --preset hstu-e2e --scale 16 --export $EXP/hstu16
if [ $QUICK = 0 ]; then
  run pooled64 --preset unit-pooled-w8 --scale 64 --export $EXP/pooled64
  run pooled16 --preset unit-pooled-w8 --scale 16
  run sweep-criteo --preset ec-bench-criteo --sweep
  run sweep-pooled --preset unit-pooled-w8 --sweep
  run seqw2 --preset unit-seq-w2
  run seqw8 --preset unit-seq-w8
  run odd --preset odd-dims
  run pooled --preset unit-pooled-w8
fi
ncu_profile() {  # name, kernel regex, launches, bench args...: one profiled bench, summarized
  local name=$1 re=$2 count=$3; shift 3
  timeout 150 ncu --clock-control none -k regex:"$re" -c "$count" --set full \
    --import-source no -o "$LOG/$name" \
    $D bench "$@" --diagnostics --iters 1 --queue-ahead 0 > "$LOG/$name-run.txt" 2>&1 \
    || echo "ncu $name failed: $(tail -3 "$LOG/$name-run.txt")"
  ncu -i "$LOG/$name.ncu-rep" --print-details all > "$LOG/$name.txt" 2>&1
  grep -E "$re|Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|stalled|Warp Cycles Per Issued|Executed Instructions  |Spilling Requests  " \
    "$LOG/$name.txt" | head -40
}
if [ "${NCU:-0}" = 1 ]; then  # evidence for the bucketize: profiled launches of the stage
  stamp "ncu (hstu-e2e bucketize: the one-pass kernel; x16: the three-pass kernels)"
  ncu_profile ncu-bucketize 'one_pass|count_|place_' 1 --preset hstu-e2e
  ncu -i "$LOG/ncu-bucketize.ncu-rep" --page source --csv --print-source sass \
    > "$LOG/ncu-sass.csv" 2>&1 || echo "ncu source page failed: $(head -3 "$LOG/ncu-sass.csv")"
  ncu_profile ncu-bucketize16 'count_block|place_block' 2 --preset hstu-e2e --scale 16
fi
stamp "peer"
for n in criteo hstu hstu16 pooled64; do
  [ -f $EXP/$n/meta.json ] || continue  # not exported by this mode (--quick: hstu only)
  $PY bench/peer_torch.py $EXP/$n --iters $ITERS --json "$LOG/peer-$n.json" \
    > "$LOG/peer-$n.txt" 2>&1 || echo "peer $n failed: $(tail -3 "$LOG/peer-$n.txt")"
done
stamp "summary"
$PY bench/compare.py "$LOG" > "$LOG/summary.txt" 2>&1
cp "$LOG/summary.txt" "$OUT/summary.txt"
$PY - "$LOG" "$OUT/bench-all.json" <<'PYEOF'
import glob, json, os, sys
d = sys.argv[1]
out = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(d + "/*.json"))}
json.dump(out, open(sys.argv[2], "w"), indent=1)
PYEOF
E2E_RC=skipped
if [ $QUICK = 0 ] && [ "${E2E:-1}" = 1 ]; then
  stamp "end to end (bench/e2e.sh)"
  DYNEMB=$PWD/$B/dynemb-dist PYTHON=$PY OUT="$LOG" bash bench/e2e.sh > "$LOG/e2e.log" 2>&1
  E2E_RC=$?
  [ -f "$LOG/e2e.md" ] && cp "$LOG/e2e.md" "$OUT/e2e.md"
fi
tar czf "$OUT/logs.tgz" -C /tmp dynemb-logs
for n in criteo hstu hstu-launch hstu16 pooled64 seqw8; do [ -f "$LOG/ours-$n.txt" ] && cat "$LOG/ours-$n.txt"; done
echo "fixture replays failing on cuda: $FIX_FAIL"
echo "build rc=$BUILD_RC  ctest rc=$CTEST_RC  gpu-test rc=$GPU_RC  workspace rc=$WS_RC  memcheck rc=$MC_RC  racecheck rc=$RC_RC  ($(( $(date +%s) - t0 )) s)"
cat "$LOG/summary.txt"
[ -f "$LOG/e2e.md" ] && cat "$LOG/e2e.md" || echo "e2e: $E2E_RC"
