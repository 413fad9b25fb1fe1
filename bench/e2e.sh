#!/usr/bin/env bash
# End to end, capture data in and out: for each capture below, synth it, replay it (cuda when
# this build has it and a GPU is present, then cpu), take its load under the captured plan and
# every dist_type (`load --alternatives dist-types`), read it with plain h5py, and take its read
# floor (`bench CAPTURE --read-floor`: every dataset read and inflated on every core, no
# checks; the least any replay of the file could take on this CPU); per step the wall time,
# the cores kept busy ((user + sys) / wall), the peak RSS, and the logical GB/s (the
# uncompressed bytes of every dataset, as bench/h5py_read.py counts them, per second).
# The replays run with DYNEMB_STEP_TIMES=1 (it only reads clocks at each step's start): their
# seconds per step are listed under the table. One markdown table per run, with the targets
# and PASS/MISS, printed last and written to $OUT/e2e.md when OUT is set (with each step's
# log).
#
#   bench/e2e.sh [--quick] [--only a,b,c,d] [--runs N]
#
# (d) is (b) with ten times the batches (asked for by --only; no h5py row): its replay's GB/s
# against (b)'s shows whether the cost grows linearly with the capture.
# --quick: smaller batches (for a 2-core machine without a GPU); the time targets are then
# not judged (n/a), the memory targets still are. --runs N: the whole table N times.
# Env: DYNEMB (the binary; default build/dynemb-dist), PYTHON (python3 with h5py; default
# /usr/bin/python3 when it has h5py, else python3), E2E_DIR (scratch for the captures;
# default a temporary directory, removed at the end).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exe=${DYNEMB:-$here/../build/dynemb-dist}
quick=0
only=a,b,c
runs=1
while (($#)); do
  case $1 in
    --quick) quick=1 ;;
    --only) only=$2; shift ;;
    --runs) runs=$2; shift ;;
    *) echo "usage: $0 [--quick] [--only a,b,c] [--runs N]" >&2; exit 2 ;;
  esac
  shift
done
[[ -x $exe ]] || { echo "e2e: no dynemb-dist at $exe (set DYNEMB)" >&2; exit 2; }
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  /usr/bin/python3 -c 'import h5py' 2>/dev/null && PYTHON=/usr/bin/python3
fi
have_h5py=0
$PYTHON -c 'import h5py' 2>/dev/null && have_h5py=1

# ---- the captures: synth arguments, full size and --quick
declare -A synth full_args quick_args
full_args[a]="--preset unit-seq-w8 --batch-size 1024 --hotness 0..64 --batches 2"
full_args[b]="--preset unit-pooled-w8 --batch-size 16384 --batches 2"
full_args[c]="--preset ec-bench-criteo --store ctx"  # big: inputs and the context only
# (d): (b) with 10x the batches, to see the cost grow linearly with the capture (not default)
full_args[d]="--preset unit-pooled-w8 --batch-size 16384 --batches 20"
quick_args[a]="--preset unit-seq-w8 --batch-size 256 --hotness 0..64 --batches 2"
quick_args[b]="--preset unit-pooled-w8 --batch-size 4096 --batches 2"
quick_args[c]="--preset ec-bench-criteo --store ctx --batch-size 1024 --batches 1"
quick_args[d]="--preset unit-pooled-w8 --batch-size 4096 --batches 20"
for k in a b c d; do
  if ((quick)); then synth[$k]=${quick_args[$k]}; else synth[$k]=${full_args[$k]}; fi
done

# ---- the targets (seconds; peak RSS in MB), per step and capture; none: "-"
declare -A target
target[synth.a]=4;        target[synth.b]=10
target[replay-cuda.a]=1.5; target[replay-cuda.b]=3.0
target[replay-cpu.a]=3;   target[replay-cpu.b]=6  # on the 16-core GPU machine
target[rss.a]=1024;       target[rss.b]=1024;       target[rss.c]=2048

# ---- what runs
version=$("$exe" --version 2>&1 | head -1)
inflate=$(sed -n 's/.*inflate: \([^)]*\)).*/\1/p' <<<"$version")
backends=$(sed -n 's/.*backends: \([^;)]*\).*/\1/p' <<<"$version")
cuda=0
if [[ $backends == *cuda* ]] && command -v nvidia-smi >/dev/null 2>&1 &&
   nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  cuda=1
fi
scratch=${E2E_DIR:-}
if [[ -z $scratch ]]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
fi
mkdir -p "$scratch"
logs=${OUT:+$OUT/e2e-logs}
logs=${logs:-$scratch/logs}
mkdir -p "$logs"

# measure LOG CMD...: runs CMD (stdout and stderr to LOG), prints "wall user sys maxrss_kb rc"
# from the child's own rusage.
measure() { python3 "$here/measure.py" "$@"; }

# judge VALUE TARGET: PASS / MISS against an upper bound, "-" without one, n/a for --quick
# time targets.
judge() {
  local v=$1 t=$2 kind=$3
  if [[ $t == - ]]; then echo "-"; return; fi
  if ((quick)) && [[ $kind == time ]]; then echo "n/a (quick)"; return; fi
  awk -v v="$v" -v t="$t" 'BEGIN { print (v <= t) ? "PASS" : "MISS" }'
}

have_load=0
"$exe" load --help >/dev/null 2>&1 && have_load=1
have_floor=0
"$exe" bench --help 2>/dev/null | grep -q -- --read-floor && have_floor=1
echo "e2e: $version"
echo "e2e: inflate library: ${inflate:-not reported by this build}"
echo "e2e: $(nproc) cores, cuda replay: $([[ $cuda == 1 ]] && echo yes || echo "skipped (no CUDA backend or no GPU)")"
echo "e2e: h5py: $([[ $have_h5py == 1 ]] && echo "$PYTHON" || echo "not found (no logical bytes, no h5py row)")"
echo "e2e: read floor: $([[ $have_floor == 1 ]] && echo yes || echo "not in this build (no read floor row)")"
((quick)) && echo "e2e: --quick: smaller batches, time targets not judged"

# step_times LOG: a replay's DYNEMB_STEP_TIMES table in LOG as "read 0.40, input dist 0.43, ..."
# (the lines "#   <step>  <seconds>  <percent> %" after its heading).
step_times() {
  awk '/^# step times \(DYNEMB_STEP_TIMES\)/ { on = 1; next }
       on && /^#   [^(].* %$/ {
         sub(/^#   /, ""); sub(/ +[0-9.]+ +%$/, "")
         secs = $NF; sub(/ +[0-9.]+$/, "")
         out = out (out == "" ? "" : ", ") $0 " " sprintf("%.2f", secs)
       }
       END { print out }' "$1"
}

# linear KIND: (d) holds ten times (b)'s batches; its replay should run at (b)'s logical GB/s
# within 20 % (target: cost grows linearly with the capture).
declare -A rate
linear() {
  local kind=$1 b=${rate[$1.b]:-} d=${rate[$1.d]:-}
  [[ -n $b && -n $d && $b != - && $d != - ]] || return 0
  awk -v b="$b" -v d="$d" -v k="$kind" 'BEGIN {
    r = d / b
    printf "- %s: (d), ten times (b), at %.2f GB/s against (b)'"'"'s %.2f: %.2fx (target 0.8 to 1.2: %s)\n", k, d, b, r, (r >= 0.8 && r <= 1.2) ? "PASS" : "MISS" }'
}

tables=()
for ((run = 1; run <= runs; run++)); do
  rows=()
  steps=()
  for k in ${only//,/ }; do
    [[ -n ${synth[$k]:-} ]] || { echo "e2e: no capture '$k'" >&2; exit 2; }
    file=$scratch/$k.h5
    rm -f "$file"
    echo "e2e: run $run ($k) synth ${synth[$k]}" >&2
    # shellcheck disable=SC2086  # the arguments split on purpose
    read -r wall user sys rss rc < <(measure "$logs/$k-synth.log" "$exe" synth ${synth[$k]} -o "$file")
    ((rc == 0)) || { echo "e2e: synth ($k) failed, see $logs/$k-synth.log" >&2; tail -5 "$logs/$k-synth.log" >&2; exit 1; }
    bytes=0; h5row=""
    if ((have_h5py)) && [[ $k != d ]]; then  # (d): ten times (b)'s, one thread: too long
      read -r hwall huser hsys hrss hrc < <(measure "$logs/$k-h5py.log" "$PYTHON" "$here/h5py_read.py" "$file")
      bytes=$(sed -n 's/.*bytes=\([0-9]*\).*/\1/p' "$logs/$k-h5py.log" | head -1)
      hsec=$(sed -n 's/.*seconds=\([0-9.]*\).*/\1/p' "$logs/$k-h5py.log" | head -1)
      # the read's own seconds (no interpreter start-up); cores busy over the whole process
      hbusy=$(awk -v u="$huser" -v s="$hsys" -v w="$hwall" 'BEGIN { printf "%.2f", (u + s) / w }')
      ((hrc == 0)) && h5row="h5py read (1 thread)|$hsec|$hbusy|$((hrss / 1024))|$hsec"
    fi
    floorrow=""
    if ((have_floor)); then
      read -r fwall fuser fsys frss frc < <(measure "$logs/$k-floor.log" "$exe" bench "$file" --read-floor --json "$logs/$k-floor.json")
      if ((frc == 0)); then
        # the reads' own seconds (not the process's start or the walk that sizes the buffer);
        # cores busy over the whole process
        read -r fsec fbytes < <(python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(j["seconds"], j["logical_bytes"])' "$logs/$k-floor.json")
        fbusy=$(awk -v u="$fuser" -v s="$fsys" -v w="$fwall" 'BEGIN { printf "%.2f", (u + s) / w }')
        ((bytes > 0)) || bytes=$fbytes  # no h5py: the floor's own count (the same sum)
        floorrow="read floor (every dataset inflated on every core, no checks)|$fsec|$fbusy|$((frss / 1024))|$fbytes"
      else
        echo "e2e: read floor ($k) failed, see $logs/$k-floor.log" >&2
        floorrow="read floor (every dataset inflated on every core, no checks)|-|-|$((frss / 1024))|0|$frc"
      fi
    fi
    gb=$(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1e9 }')
    row() {  # step wall user sys rss_kb rc target_key
      local busy gbs t rsst
      busy=$(awk -v u="$2" -v s="$3" -v w="$1" 'BEGIN { printf "%.2f", (u + s) / w }')
      gbs=$(awk -v b="$bytes" -v w="$1" 'BEGIN { if (b > 0) printf "%.2f", b / 1e9 / w; else print "-" }')
      t=${target[$6.$k]:--}
      rsst=${target[rss.$k]:--}
      rows+=("| ($k) | $6 | $1 | $busy | $(($4 / 1024)) | $gbs | $t | $(judge "$1" "$t" time) | $rsst | $(judge $(($4 / 1024)) "$rsst" mem) | $5 |")
      rate[$6.$k]=$gbs
    }
    row "$wall" "$user" "$sys" "$rss" "$rc" synth
    if ((cuda)); then
      read -r wall user sys rss rc < <(DYNEMB_STEP_TIMES=1 measure "$logs/$k-replay-cuda.log" "$exe" replay "$file" --backend cuda --quiet)
      row "$wall" "$user" "$sys" "$rss" "$rc" replay-cuda
      steps+=("($k) replay --backend cuda: $(step_times "$logs/$k-replay-cuda.log")")
    fi
    read -r wall user sys rss rc < <(DYNEMB_STEP_TIMES=1 measure "$logs/$k-replay-cpu.log" "$exe" replay "$file" --backend cpu --quiet)
    row "$wall" "$user" "$sys" "$rss" "$rc" replay-cpu
    steps+=("($k) replay --backend cpu: $(step_times "$logs/$k-replay-cpu.log")")
    target[load.$k]=$wall  # load: no slower than replay --backend cpu of the same file
    if ((have_load)); then  # per-rank load and traffic of the same batches (KJTs only)
      read -r wall user sys rss rc < <(measure "$logs/$k-load.log" "$exe" load "$file" --alternatives dist-types)
      row "$wall" "$user" "$sys" "$rss" "$rc" load
    fi
    if [[ -n $floorrow ]]; then  # beside its peer, the h5py read
      IFS='|' read -r step fsec busy frss fbytes frc <<<"$floorrow"
      fgbs=$(awk -v b="$fbytes" -v w="$fsec" 'BEGIN { if (b > 0 && w > 0) printf "%.2f", b / 1e9 / w; else print "-" }')
      [[ $fsec == - ]] || fsec=$(printf '%.3f' "$fsec")
      rows+=("| ($k) | $step | $fsec | $busy | $frss | $fgbs | - | - | - | - | ${frc:-0} |")
    fi
    if [[ -n $h5row ]]; then
      IFS='|' read -r step hsec busy hrss _ <<<"$h5row"
      hgbs=$(awk -v b="$bytes" -v w="$hsec" 'BEGIN { printf "%.2f", b / 1e9 / w }')
      rows+=("| ($k) | $step | $hsec | $busy | $hrss | $hgbs | - | - | - | - | 0 |")
    fi
    rows+=("| ($k) | logical size | $gb GB in $(stat -c %s "$file" | awk '{ printf "%.2f", $1 / 1e9 }') GB stored | | | | | | | | |")
    rm -f "$file"
  done
  table="### e2e run $run: $version, $(nproc) cores$( ((quick)) && echo ", --quick" || true)

| capture | step | wall s | cores busy | peak RSS MB | logical GB/s | target s | time | target MB | memory | exit |
| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: |"
  for r in "${rows[@]}"; do table+=$'\n'"$r"; done
  table+=$'\n\n'"inflate: ${inflate:-not reported}. Captures: $(for k in ${only//,/ }; do printf '(%s) synth %s; ' "$k" "${synth[$k]}"; done)"
  table+=$'\n\n'"Replay steps (DYNEMB_STEP_TIMES=1, wall seconds summed over batches):"$'\n'
  for st in "${steps[@]}"; do table+=$'\n'"- $st"; done
  lin=$(linear replay-cuda; linear replay-cpu)
  [[ -z $lin ]] || table+=$'\n\n'"Cost as the capture grows:"$'\n'"$lin"
  tables+=("$table")
done

echo
for t in "${tables[@]}"; do printf '%s\n\n' "$t"; done
if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
  for t in "${tables[@]}"; do printf '%s\n\n' "$t"; done >"$OUT/e2e.md"
  echo "e2e: written $OUT/e2e.md, logs in $logs"
fi
