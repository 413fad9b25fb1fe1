#!/usr/bin/env bash
# What a CUDA process pays to start its context and to end, by the way it ends (return from
# main; _exit at once; everything freed, then _exit; the context destroyed, then _exit): each
# mode run RUNS times (default 3) as a whole process; "after main" is the process's wall time
# after main's last clock, "in main" the time main spent freeing or destroying. GPU machine.
#   [CUDA_ARCH=sm_90] bench/process_end.sh [RUNS [DEVICE_MIB [REGISTERED_MIB]]]
set -euo pipefail
cd "$(dirname "$0")"
runs=${1:-3}
exe=$(mktemp)
trap 'rm -f "$exe"' EXIT
nvcc -O2 -arch="${CUDA_ARCH:-native}" -o "$exe" process_end/process_end.cu  # no PTX JIT at start
nvidia-smi --query-gpu=name,persistence_mode --format=csv,noheader 2>/dev/null || true
printf '| mode | whole process (s) | context start (s) | in main (s) | after main (s) |\n'
printf '| --- | ---: | ---: | ---: | ---: |\n'
for ((i = 0; i < runs; ++i)); do
  for mode in return _exit free reset; do
    a=$(date +%s.%N)
    line=$("$exe" "$mode" ${2:-} ${3:-} | tr '\n' ' ')
    b=$(date +%s.%N)
    # line: init S work S main_end EPOCH_S [free S | reset S]
    read -r _ init _ _ _ end _ teardown <<<"$line"
    awk -v m="$mode" -v a="$a" -v b="$b" -v i="$init" -v e="$end" -v t="${teardown:-0}" \
      'BEGIN { printf "| %s | %.3f | %.3f | %.3f | %.3f |\n", m, b - a, i, t, b - e - t }'
  done
done
