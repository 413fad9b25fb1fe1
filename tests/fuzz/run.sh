#!/usr/bin/env bash
# Runs both libFuzzer targets for SECONDS each on copies of the seed corpora (plans/*.yaml,
# fixtures/plans/*.yaml; fixtures/*.h5, fixtures/torchrec/*.h5) and the crash regressions.
#   tests/fuzz/run.sh BUILD_DIR [SECONDS]      (BUILD_DIR configured with -DDYNEMB_FUZZ=ON)
# Exit 0 when neither target found a crash; artifacts go to BUILD_DIR/fuzz-artifacts/.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
secs=${2:-30}
# libhdf5 1.10 itself leaks small blocks on some error paths and mallocs whatever size a damaged
# metadata header claims (it checks for NULL): both are excluded, see docs/robustness.md.
export LSAN_OPTIONS="suppressions=$src/tests/fuzz/lsan.supp:print_suppressions=0"
export ASAN_OPTIONS="allocator_may_return_null=1"
work="$build/fuzz-run"
rm -rf "$work"
mkdir -p "$work/plan" "$work/capture" "$build/fuzz-artifacts"
cp "$src"/plans/*.yaml "$src"/fixtures/plans/*.yaml "$work/plan/"
cp "$src"/fixtures/*.h5 "$src"/fixtures/torchrec/*.h5 "$work/capture/"
cp "$src"/tests/fuzz/regressions/* "$work/capture/" 2>/dev/null || true
status=0
for t in plan capture; do
  echo "fuzz_$t: $secs s"
  (cd "$work" && "$build/fuzz_$t" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t-" "$work/$t" >"$work/$t.log" 2>&1) ||
    status=1
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|ERROR|SUMMARY" "$work/$t.log" || true
done
[[ $status -eq 0 ]] || { echo "fuzz: a target found a crash (artifacts in $build/fuzz-artifacts)"; exit 1; }
