#!/usr/bin/env bash
# Replay under mpirun as the processes grow: synthetic captures of the unit-seq-w8 shape at
# W = 8, 64 and 512 (bench/plans/scale-seq-w*.yaml: D = 16, fp32, the same per-rank batch at
# every W), each replayed with P = 1 (one process, no launcher) and `mpirun -np P` for P = 2, 4,
# ... up to the cores (nproc). Per run: the wall time, the throughput (bytes of the capture
# file per second of wall time), the peak RSS of every process (getrusage of each process's
# children, by a wrapper mpirun starts: the replaying process and its supervisor), and whether
# the text report is the same bytes as P = 1's. One table on stdout; with OUT set, also
# $OUT/scale.md and each run's per-process RSS in $OUT/rss-W<w>-P<p>.txt.
#
#   bench/scale.sh [--quick]
#
# The processes split the batches (docs/multi-node.md), so a run gains from P processes up to
# the number of batches: BATCHES (default 16) batches of B (default 4) samples per rank.
# --quick: W = 8 and 64, 4 batches, P = 1 and 2 (a 2-core machine).
# Env: DYNEMB (default build/dynemb-dist, built with MPI), MPIRUN (default mpirun on PATH),
# WORLDS (default "8 64 512"), PROCS (default 1 2 4 ... nproc), BATCHES, B, SCALE_DIR (scratch
# for the captures; default a temporary directory, removed at the end), PYTHON (python3),
# BACKEND (default cpu: one GPU shared by P processes measures the GPU, not the split),
# MPIRUN_ARGS (default --bind-to none).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exe=${DYNEMB:-$here/../build/dynemb-dist}
PYTHON=${PYTHON:-python3}
quick=0
[[ ${1:-} == --quick ]] && quick=1
[[ $# -eq 0 || $quick -eq 1 ]] || { echo "usage: $0 [--quick]" >&2; exit 2; }
[[ -x $exe ]] || { echo "scale: no dynemb-dist at $exe (set DYNEMB)" >&2; exit 2; }
cores=$(nproc)
worlds=${WORLDS:-8 64 512}
batches=${BATCHES:-16}
b=${B:-4}
if ((quick)); then
  worlds=${WORLDS:-8 64}
  batches=${BATCHES:-4}
fi
if [[ -z ${PROCS:-} ]]; then
  PROCS=1
  for ((p = 2; p < cores; p *= 2)); do PROCS+=" $p"; done
  ((cores > 1)) && PROCS+=" $cores"
  ((quick)) && PROCS="1 2"
fi
mpirun=${MPIRUN:-$(command -v mpirun || true)}
if [[ -z $mpirun ]]; then
  echo "scale: mpirun is absent (apt-get install openmpi-bin): only P = 1 is measured" >&2
  PROCS=1
elif ! ldd "$exe" 2>/dev/null | grep -q libmpi; then
  echo "scale: $exe was built without MPI (-DDYNEMB_MPI=ON): under mpirun every process would" \
    "replay every batch; only P = 1 is measured" >&2
  PROCS=1
fi
# Each process runs a pool of threads over the CPUs it may use: Open MPI's default binding (one
# core per process at -np 2, a socket beyond) would leave P = 2 one core each where P = 1 has
# them all. MPIRUN_ARGS replaces this (e.g. "--map-by slot:PE=4" for four cores each).
read -r -a mpi_args <<<"${MPIRUN_ARGS:---bind-to none}"
backend=${BACKEND:-cpu}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
dir=${SCALE_DIR:-}
if [[ -z $dir ]]; then
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
fi
mkdir -p "$dir"

# The wrapper each process runs under: the replay, then its peak RSS (KiB, the largest of its
# descendants: the replaying child and its supervisor) into $dir/rss.<rank>.
wrap=$dir/rss_wrap.py
cat >"$wrap" <<'PY'
import os, resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", os.environ.get("PMI_RANK", "0")))
with open(f"{sys.argv[1]}.{rank}", "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)
PY

table="| W | P | batches | capture MB | wall s | MB/s | speed-up | peak RSS per process, MiB (p0 / max / min) | report |
|---|---|---|---|---|---|---|---|---|"
for w in $worlds; do
  cap=$dir/w$w.h5
  "$exe" synth "$here/plans/scale-seq-w$w.yaml" --batches "$batches" --batch-size "$b" --seed 1 \
    -o "$cap" --force >/dev/null
  mb=$("$PYTHON" -c "import os,sys; print(f'{os.path.getsize(sys.argv[1]) / 1e6:.1f}')" "$cap")
  base=""
  for p in $PROCS; do
    rm -f "$dir"/rss.*
    start=$(date +%s.%N)
    if ((p == 1)); then
      "$PYTHON" "$wrap" "$dir/rss" "$exe" replay "$cap" -q --backend "$backend" \
        >"$dir/out.txt" 2>"$dir/err.txt" || true
    else
      "$mpirun" "${mpi_args[@]}" -np "$p" "$PYTHON" "$wrap" "$dir/rss" "$exe" replay "$cap" -q \
        --backend "$backend" >"$dir/out.txt" 2>"$dir/err.txt" || true
    fi
    end=$(date +%s.%N)
    same=same
    if ((p == 1)); then
      cp "$dir/out.txt" "$dir/base.txt"
    elif ! cmp -s "$dir/out.txt" "$dir/base.txt"; then
      same="DIFFERS"
    fi
    grep -q "^# result: PASS" "$dir/out.txt" || same="$same, not PASS: $(head -c 200 "$dir/err.txt")"
    row=$("$PYTHON" - "$dir" "$p" "$start" "$end" "$mb" "${base:-0}" <<'PY'
import glob, sys
d, p, start, end, mb, base = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
wall = end - start
rss = {int(f.rsplit(".", 1)[1]): int(open(f).read()) / 1024 for f in glob.glob(f"{d}/rss.*")}
r = [rss[k] for k in sorted(rss)]
rs = f"{r[0]:.0f} / {max(r):.0f} / {min(r):.0f}" if r else "n/a"
up = f"{base / wall:.2f}" if base > 0 else "1.00"
print(f"{wall:.2f}|{mb / wall:.1f}|{up}|{rs}|{' '.join(f'{x:.0f}' for x in r)}")
PY
)
    IFS='|' read -r wall rate up rss all <<<"$row"
    ((p == 1)) && base=$wall
    [[ -n ${OUT:-} ]] && { mkdir -p "$OUT"; echo "$all" >"$OUT/rss-W$w-P$p.txt"; }
    line="| $w | $p | $batches | $mb | $wall | $rate | $up | $rss | $same |"
    table+=$'\n'"$line"
    echo "$line" >&2
  done
done
echo "# bench/scale.sh: $(nproc) cores, $(basename "$mpirun" 2>/dev/null || echo "no mpirun"), B = $b samples per rank"
echo "$table"
if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
  echo "$table" >"$OUT/scale.md"
fi
