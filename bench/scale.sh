#!/usr/bin/env bash
# Replay under mpirun as the processes grow: synthetic captures of the unit-seq-w8 shape at
# W = 8, 64 and 512 (bench/plans/scale-seq-w*.yaml: D = 16, fp32, the same per-rank batch at
# every W), each replayed with P = 1 (one process, no launcher) and `mpirun -np P` for P = 2, 4,
# ... up to the cores (nproc). Per run: the wall time, the throughput (bytes of the capture
# file per second of wall time), the cost per logical byte (wall time over the uncompressed
# bytes of every dataset), the peak RSS of every process (getrusage of each process's
# children, by a wrapper mpirun starts: the replaying process and its supervisor), and whether
# the text report is the same bytes as P = 1's. One table on stdout, then the targets with
# PASS or MISS (cost per logical byte within 1.5x as W grows; P = 8 >= 5x); with OUT set, also
# $OUT/scale.md and each run's per-process RSS in $OUT/rss-W<w>-P<p>.txt.
# Then memory per process: a capture of big batches (MEM_B samples per rank, default 2048)
# replayed under --max-memory MEM_BUDGET (default 1G), which the processes on the host share,
# at P = 1, 2, 4: each process's peak RSS against its share (target: the share + 64 MiB).
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

table="| W | P | batches | capture MB | logical MB | wall s | MB/s | ns per logical byte | speed-up | peak RSS per process, MiB (p0 / max / min) | report |
|---|---|---|---|---|---|---|---|---|---|---|"
costs=""    # "W:ns" per world at P = 1
speedups="" # "W:P:x" per run
for w in $worlds; do
  cap=$dir/w$w.h5
  "$exe" synth "$here/plans/scale-seq-w$w.yaml" --batches "$batches" --batch-size "$b" --seed 1 \
    -o "$cap" --force >/dev/null
  mb=$("$PYTHON" -c "import os,sys; print(f'{os.path.getsize(sys.argv[1]) / 1e6:.1f}')" "$cap")
  # Logical bytes: every dataset's elements times their size, uncompressed (no data read).
  logical=$("$PYTHON" - "$cap" <<'PY'
import sys, h5py
n = 0
def visit(name, obj):
    global n
    if isinstance(obj, h5py.Dataset):
        n += obj.size * obj.dtype.itemsize
with h5py.File(sys.argv[1], "r") as f:
    f.visititems(visit)
print(f"{n / 1e6:.1f}")
PY
)
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
    row=$("$PYTHON" - "$dir" "$p" "$start" "$end" "$mb" "${base:-0}" "$logical" <<'PY'
import glob, sys
d, p, start, end, mb, base, logical = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
wall = end - start
rss = {int(f.rsplit(".", 1)[1]): int(open(f).read()) / 1024 for f in glob.glob(f"{d}/rss.*")}
r = [rss[k] for k in sorted(rss)]
rs = f"{r[0]:.0f} / {max(r):.0f} / {min(r):.0f}" if r else "n/a"
up = f"{base / wall:.2f}" if base > 0 else "1.00"
print(f"{wall:.2f}|{mb / wall:.1f}|{wall / logical * 1e3:.2f}|{up}|{rs}|{' '.join(f'{x:.0f}' for x in r)}")
PY
)
    IFS='|' read -r wall rate ns up rss all <<<"$row"
    ((p == 1)) && base=$wall && costs+=" $w:$ns"
    speedups+=" $w:$p:$up"
    [[ -n ${OUT:-} ]] && { mkdir -p "$OUT"; echo "$all" >"$OUT/rss-W$w-P$p.txt"; }
    line="| $w | $p | $batches | $mb | $logical | $wall | $rate | $ns | $up | $rss | $same |"
    table+=$'\n'"$line"
    echo "$line" >&2
  done
done
# The targets: the cost per logical byte at P = 1 within 1.5x from the smallest W to the
# largest (and, stricter, from any W to any larger one); the largest W at P = 8 at least 5x
# faster than at P = 1 (on 16 cores).
verdicts=$("$PYTHON" - "$costs" "$speedups" <<'PY'
import sys
cost = [(int(w), float(x)) for w, x in (t.split(":") for t in sys.argv[1].split())]
runs = [(int(w), int(p), float(x)) for w, p, x in (t.split(":") for t in sys.argv[2].split())]
verdict = lambda ok: "PASS" if ok else "MISS"
if len(cost) > 1:
    (w0, c0), (w1, c1) = cost[0], cost[-1]
    # Growth: the most the cost rises from any W to a larger one (a small W's fixed start-up
    # costs make it dearer per byte, which is not growth).
    g, gw = max(((cj / ci, (wi, wj)) for i, (wi, ci) in enumerate(cost) for wj, cj in cost[i + 1:]))
    print(f"- cost per logical byte, P = 1: W = {w1} / W = {w0}: {c1 / c0:.2f}x (target <= 1.5x: "
          f"{verdict(c1 / c0 <= 1.5)}); the most it grows from one W to a larger one: {g:.2f}x, "
          f"W = {gw[0]} to {gw[1]} ({verdict(g <= 1.5)})")
if runs:
    wmax = max(w for w, _, _ in runs)
    at8 = [x for w, p, x in runs if w == wmax and p == 8]
    if at8:
        print(f"- W = {wmax}, P = 8: {at8[0]:.2f}x faster than P = 1 (target >= 5x: {verdict(at8[0] >= 5)})")
PY
)
# ---- memory per process: a capture of big batches (lookups derived from the oracle, so a batch
# can be cut into column slices) replayed under --max-memory MEM_BUDGET, which the processes on
# this host share: each plans for MEM_BUDGET / P, and its peak RSS should follow that share
# (target: at most the share plus 64 MiB for the binary, its libraries and MPI's own).
mem_budget=${MEM_BUDGET:-1G}
mem_b=${MEM_B:-2048}
mem_batches=4
((quick)) && mem_b=${MEM_B:-1024}
mem_cap=$dir/mem.h5
"$exe" synth --preset unit-seq-w8 --store ctx,output --batches "$mem_batches" --batch-size "$mem_b" \
  --seed 5 -o "$mem_cap" --force >/dev/null
budget_mib=$("$PYTHON" -c "import sys; s = sys.argv[1]; u = {'K': 2**-10, 'M': 1, 'G': 2**10}; print(float(s[:-1]) * u[s[-1].upper()] if s[-1].isalpha() else float(s) / 2**20)" "$mem_budget")
mem_table="| P | --max-memory | share per process, MiB | peak RSS per process, MiB (max / min) | target (share + 64 MiB) | report |
| ---: | ---: | ---: | ---: | --- | --- |"
for p in $PROCS; do
  ((p <= mem_batches)) || continue
  rm -f "$dir"/rss.*
  if ((p == 1)); then
    "$PYTHON" "$wrap" "$dir/rss" "$exe" replay "$mem_cap" -q --backend "$backend" \
      --max-memory "$mem_budget" >"$dir/out.txt" 2>"$dir/err.txt" || true
    cp "$dir/out.txt" "$dir/mem-base.txt"
  else
    "$mpirun" "${mpi_args[@]}" -np "$p" "$PYTHON" "$wrap" "$dir/rss" "$exe" replay "$mem_cap" -q \
      --backend "$backend" --max-memory "$mem_budget" >"$dir/out.txt" 2>"$dir/err.txt" || true
  fi
  same=same
  ((p == 1)) || cmp -s "$dir/out.txt" "$dir/mem-base.txt" || same=DIFFERS
  grep -q "^# result: PASS" "$dir/out.txt" ||
    same="$same, not PASS: $(grep -m1 -o 'error: .*' "$dir/err.txt" | head -c 240)"
  row=$("$PYTHON" - "$dir" "$p" "$budget_mib" <<'PY'
import glob, sys
d, p, budget = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
r = [int(open(f).read()) / 1024 for f in glob.glob(f"{d}/rss.*")]
share = budget / p
if r:
    ok = "PASS" if max(r) <= share + 64 else "MISS"
    print(f"{share:.0f}|{max(r):.0f} / {min(r):.0f}|{ok}")
else:
    print(f"{share:.0f}|n/a|n/a")
PY
)
  IFS='|' read -r share rss verdict <<<"$row"
  line="| $p | $mem_budget | $share | $rss | $verdict | $same |"
  mem_table+=$'\n'"$line"
  echo "$line" >&2
done

echo "# bench/scale.sh: $(nproc) cores, $(basename "$mpirun" 2>/dev/null || echo "no mpirun"), B = $b samples per rank, --backend $backend"
echo "$table"
echo
echo "$verdicts"
echo
echo "# memory per process: unit-seq-w8, --store ctx,output, $mem_batches batches of B = $mem_b per rank, --max-memory $mem_budget shared by the processes"
echo "$mem_table"
if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
  printf '%s\n\n%s\n\n%s\n' "$table" "$verdicts" "$mem_table" >"$OUT/scale.md"
fi
