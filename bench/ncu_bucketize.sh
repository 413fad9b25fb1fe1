#!/usr/bin/env bash
# Memory and issue counters of one warm launch of the hstu-e2e bucketize (the one-pass kernel),
# as `bench` runs it: caches left as the previous launch left them (--cache-control none), SM
# clocks not locked (--clock-control none), launch 4 profiled (after 3 warm-up launches); then
# the same counters for bench's streaming floor of the same bytes.
# Answers "where do the stage's bytes come from and go" (DRAM or L2) and how busy the issue
# slots, the L2 and DRAM are over the launch. Builds dynemb-dist like run_on_gpu.sh if needed.
#   bash bench/ncu_bucketize.sh [build-dir] [bench args...]     (default: build-gpu, hstu-e2e)
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-gpu}
shift $(( $# > 0 ? 1 : 0 ))
ARGS=("$@"); [ ${#ARGS[@]} -eq 0 ] && ARGS=(--preset hstu-e2e)
if [ ! -x "$B/dynemb-dist" ]; then
  { cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDYNEMB_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build "$B" -j 16 --target dynemb-dist; } \
    > /tmp/ncu-bucketize-build.log 2>&1 || { tail -20 /tmp/ncu-bucketize-build.log; exit 1; }
fi
command -v ncu > /dev/null || { echo "ncu_bucketize: ncu not on PATH"; exit 2; }
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
METRICS+=,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed
METRICS+=,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum
METRICS+=,smsp__issue_active.avg.pct_of_peak_sustained_active
METRICS+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
METRICS+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
# The one-pass kernel, then bench's streaming floor (the same bytes read and written, no
# routing, no exchange) for comparison.
for k in one_pass stream_floor; do
  ncu --clock-control none --cache-control none -k regex:$k --launch-skip 3 --launch-count 1 \
    --metrics "$METRICS" "$B/dynemb-dist" bench "${ARGS[@]}" --diagnostics --iters 3 2>&1 |
    grep -E "$k|^ +[a-z0-9_]+__" || { echo "ncu_bucketize: no profiled launch of $k"; exit 1; }
done
