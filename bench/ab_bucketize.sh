#!/usr/bin/env bash
# A/B of bucketize kernels on the hstu-e2e preset in one GPU-machine call: every (build,
# path) pair timed ROUNDS times, interleaved so clocks and thermals are shared; prints the
# bucketize row and the per-step trace of each run, then the times per pair.
#   [KERNELS="one-pass three-pass"] bash bench/ab_bucketize.sh [rounds] [build-dir...]
# KERNELS: values of `bench --bucketize-kernel`; build dirs (default build-gpu, as
# bench/run_on_gpu.sh builds it) hold a dynemb-dist each, e.g. builds of a kernel variant.
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
shift $(( $# > 0 ? 1 : 0 ))
BUILDS=("$@"); [ ${#BUILDS[@]} -eq 0 ] && BUILDS=(build-gpu)
for b in "${BUILDS[@]}"; do
  [ -x "$b/dynemb-dist" ] || { echo "ab_bucketize: $b/dynemb-dist not built"; exit 2; }
done
declare -A times
order=()
for r in $(seq 1 "$ROUNDS"); do
  for b in "${BUILDS[@]}"; do
    for k in ${KERNELS:-one-pass three-pass}; do
      key="$b:$k"
      [ "$r" = 1 ] && order+=("$key")
      # Builds from before `bench --diagnostics` print the trace lines without it.
      diag=$("$b/dynemb-dist" bench --help 2>&1 | grep -q -- --diagnostics && echo --diagnostics)
      out=$("$b/dynemb-dist" bench --preset hstu-e2e --iters 30 --bucketize-kernel "$k" $diag 2>&1)
      row=$(grep -m1 "bucketize (all ranks)" <<<"$out")
      us=$(awk '{for (i = 1; i <= NF; ++i) if ($i == "ranks)") { print $(i + 4); exit }}' <<<"$row")
      times[$key]="${times[$key]:-} ${us:-failed}"
      echo "round $r $key: $row"
      grep "steps over\|per quarter" <<<"$out" | sed 's/^/    /'
      grep -qi "mismatch\|error" <<<"$out" && { echo "    ^ $key failed:"; tail -3 <<<"$out"; }
    done
  done
done
echo "# hstu-e2e bucketize, us per (build:path) over $ROUNDS rounds:"
for key in "${order[@]}"; do echo "#   $key:${times[$key]}"; done
