#!/usr/bin/env bash
# Runs both libFuzzer targets for SECONDS each on copies of the seed corpora (plans/*.yaml,
# fixtures/plans/*.yaml; fixtures/*.h5, fixtures/torchrec/*.h5) and the crash regressions.
#   tests/fuzz/run.sh BUILD_DIR [SECONDS]      (BUILD_DIR configured with -DDYNEMB_FUZZ=ON)
# Exit 0 when neither target found a crash; artifacts go to BUILD_DIR/fuzz-artifacts/.
# FUZZ_SEED=N (default 1) fixes libFuzzer's seed and FUZZ_RUNS_PLAN / FUZZ_RUNS_CAPTURE bound
# the inputs tried, so a CI run is reproducible (SECONDS is then only a safety bound); set
# FUZZ_SEED=0 for a random seed and FUZZ_RUNS_*=-1 for time-bound exploration runs.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
secs=${2:-30}
# libhdf5 1.10 itself leaks small blocks on some error paths and mallocs whatever size a damaged
# metadata header claims (it checks for NULL): both are excluded, see docs/robustness.md.
export LSAN_OPTIONS="suppressions=$src/tests/fuzz/lsan.supp:print_suppressions=0"
export ASAN_OPTIONS="allocator_may_return_null=1:suppressions=$src/tests/fuzz/asan.supp"
work="$build/fuzz-run"
rm -rf "$work"
mkdir -p "$work/plan" "$work/capture" "$build/fuzz-artifacts"
cp "$src"/plans/*.yaml "$src"/fixtures/plans/*.yaml "$work/plan/"
cp "$src"/fixtures/*.h5 "$src"/fixtures/torchrec/*.h5 "$work/capture/"
cp "$src"/tests/fuzz/regressions/* "$work/capture/" 2>/dev/null || true
status=0
seed=${FUZZ_SEED:-1}
declare -A runs=([plan]=${FUZZ_RUNS_PLAN:-30000} [capture]=${FUZZ_RUNS_CAPTURE:-2500})
for t in plan capture; do
  echo "fuzz_$t: seed $seed, ${runs[$t]} runs, at most $secs s"
  if ! (cd "$work" && "$build/fuzz_$t" -seed="$seed" -runs="${runs[$t]}" -max_total_time="$secs" \
    -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-artifacts/$t-" "$work/$t" >"$work/$t.log" 2>&1); then
    status=1
    # The report with its stack, so a CI log alone says where (the input is an artifact).
    grep -E -A40 "^==[0-9]+==ERROR|^==[0-9]+== ERROR" "$work/$t.log" | head -60 || true
  fi
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|SUMMARY" "$work/$t.log" || true
done
[[ $status -eq 0 ]] || { echo "fuzz: a target found a crash (artifacts in $build/fuzz-artifacts)"; exit 1; }
