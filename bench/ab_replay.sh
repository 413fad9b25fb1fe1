#!/usr/bin/env bash
# Whole replays of two builds on the same captures, taking turns: the machines' speed drifts
# by up to a quarter from run to run, so only turns on one machine compare. Per capture and
# backend, each run's wall time, cores busy and peak RSS for base and dev; then the dev
# build's timeline of each replay (DYNEMB_TRACE, bench/trace_summary.py).
#
#   BASE=DIR | BASE_REV=REV  bash bench/ab_replay.sh [--runs N] [--only a,b,c] [--quick]
#
# BASE: a source tree to build as the base (a machine without git: carry it there);
# BASE_REV: a git revision of this repository, archived into a temporary tree. The dev build
# is this tree. Captures: bench/e2e.sh's (a), (b), (c) (--quick: its smaller ones). cuda runs
# where the build has the backend and a GPU is there, cpu always. Env: OUT (logs and traces),
# LIBDEFLATE_DIR (as bench/run_on_gpu.sh), JOBS (build parallelism).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/.." && pwd)
runs=2
only=a,b
quick=0
while (($#)); do
  case $1 in
    --runs) runs=$2; shift ;;
    --only) only=$2; shift ;;
    --quick) quick=1 ;;
    *) echo "usage: BASE=DIR|BASE_REV=REV $0 [--runs N] [--only a,b,c] [--quick]" >&2; exit 2 ;;
  esac
  shift
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${OUT:-$work/out}
mkdir -p "$out"
if [[ -n ${BASE:-} ]]; then
  base_src=$(cd "$BASE" && pwd)
elif [[ -n ${BASE_REV:-} ]]; then
  base_src=$work/base-src
  mkdir -p "$base_src"
  git -C "$src" archive "$BASE_REV" | tar -x -C "$base_src" || { echo "ab: no revision $BASE_REV" >&2; exit 2; }
else
  echo "ab: set BASE (a source tree) or BASE_REV (a git revision)" >&2
  exit 2
fi

cuda_arg=-DDYNEMB_CUDA=OFF
command -v nvcc >/dev/null 2>&1 && cuda_arg="-DDYNEMB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"
deflate=()
[[ -n ${LIBDEFLATE_DIR:-} ]] && deflate=(-DLIBDEFLATE_INCLUDE_DIR="$LIBDEFLATE_DIR/include"
  -DLIBDEFLATE_LIBRARY="$LIBDEFLATE_DIR/lib/libdeflate.a")
jobs=${JOBS:-$(nproc)}
build() {  # build SRC DIR: the tool alone, Release
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDYNEMB_TESTS=OFF $cuda_arg \
    "${deflate[@]}" >"$2.log" 2>&1 && cmake --build "$2" -j "$jobs" --target dynemb-dist >>"$2.log" 2>&1
}
echo "ab: building base ($base_src) and dev ($src)"
build "$base_src" "$work/base" || { tail -20 "$work/base.log"; exit 1; }
build "$src" "$work/dev" || { tail -20 "$work/dev.log"; exit 1; }
declare -A exe=([base]=$work/base/dynemb-dist [dev]=$work/dev/dynemb-dist)

backends=(cpu)
if "${exe[dev]}" --version | grep -q cuda && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  backends=(cuda cpu)
fi
declare -A args
if ((quick)); then
  args[a]="--preset unit-seq-w8 --batch-size 256 --hotness 0..64 --batches 2"
  args[b]="--preset unit-pooled-w8 --batch-size 4096 --batches 2"
  args[c]="--preset ec-bench-criteo --store ctx --batch-size 1024 --batches 1"
else
  args[a]="--preset unit-seq-w8 --batch-size 1024 --hotness 0..64 --batches 2"
  args[b]="--preset unit-pooled-w8 --batch-size 16384 --batches 2"
  args[c]="--preset ec-bench-criteo --store ctx"
fi

# measure LOG CMD...: "wall busy rss_mb rc" of the child (bench/measure.py's figures)
measure() {
  python3 "$here/measure.py" "$@" |
    awk '{ printf "%.3f %.1f %d %s\n", $1, ($2 + $3) / $1, $4 / 1024, $5 }'
}

echo "ab: $(nproc) cores; backends: ${backends[*]}; $runs runs, taking turns"
echo "| capture | backend | base: wall s (cores busy, peak RSS MB) | dev: wall s (cores busy, peak RSS MB) |"
echo "| --- | --- | --- | --- |"
for k in ${only//,/ }; do
  file=$work/$k.h5
  "${exe[dev]}" synth ${args[$k]} -o "$file" >"$out/$k-synth.log" 2>&1 || { echo "ab: synth $k failed"; continue; }
  for be in "${backends[@]}"; do
    declare -A cell=([base]="" [dev]="")
    for ((i = 1; i <= runs; ++i)); do
      for who in base dev; do
        read -r wall busy rss rc < <(measure "$out/$k-$be-$who.log" "${exe[$who]}" replay "$file" --backend "$be" --quiet)
        [[ $rc == 0 ]] || wall="$wall (exit $rc)"
        cell[$who]+="${cell[$who]:+, }$wall ($busy, $rss)"
      done
    done
    echo "| ($k) | $be | ${cell[base]} | ${cell[dev]} |"
  done
  for be in "${backends[@]}"; do
    DYNEMB_TRACE=$out/$k-$be.json "${exe[dev]}" replay "$file" --backend "$be" --quiet >/dev/null 2>&1
    python3 "$here/trace_summary.py" "$out/$k-$be.json" --min-ms 15 >"$out/$k-$be-trace.txt"
  done
done
if [[ -n ${OUT:-} ]]; then
  echo "ab: logs and the dev build's traces (text: *-trace.txt) in $out"
else
  echo "ab: set OUT to keep the logs and the dev build's traces"
fi
