#!/usr/bin/env bash
# Replays every fixture (or the captures given) on the CPU reference and on the CUDA backend,
# each writing its outputs (--write-output), and checks that every replayed `output` dataset
# is bit-identical between the two, and that both replays exit 0. GPU machine only.
#   bench/cpu_vs_cuda.sh DYNEMB_BINARY [CAPTURE.h5 ...]
set -uo pipefail
cd "$(dirname "$0")/.."
D=${1:?usage: bench/cpu_vs_cuda.sh DYNEMB_BINARY [CAPTURE.h5 ...]}
shift
PY=${PYTHON:-python3}
files=("$@")
[ ${#files[@]} -eq 0 ] && files=(fixtures/*.h5 fixtures/torchrec/*.h5)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 n=0
for f in "${files[@]}"; do
  name=$(basename "$f" .h5)
  for be in cpu cuda; do
    "$D" replay "$f" --backend $be --quiet --write-output "$tmp/$name.$be.h5" >"$tmp/$name.$be.txt" 2>&1
    rc=$?
    # A fixture built to fail (bounds_check=error) exits 2 on both; anything else must pass.
    if [ $rc -ne 0 ]; then echo "$name: replay --backend $be exit $rc: $(tail -1 "$tmp/$name.$be.txt")"; fi
  done
  [ -f "$tmp/$name.cpu.h5" ] && [ -f "$tmp/$name.cuda.h5" ] || { fails=$((fails + 1)); continue; }
  n=$((n + 1))
  $PY - "$tmp/$name.cpu.h5" "$tmp/$name.cuda.h5" "$name" <<'PYEOF' || fails=$((fails + 1))
import sys, h5py, numpy as np
a, b, name = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), sys.argv[3]
outs = []
a.visititems(lambda k, o: outs.append(k) if isinstance(o, h5py.Dataset) and k.endswith("/output") else None)
bad = [k for k in outs if a[k][()].tobytes() != b[k][()].tobytes()]
print(f"{name}: {len(outs)} output datasets, {'bit-identical' if not bad else 'DIFFER: ' + ', '.join(bad[:4])}")
sys.exit(1 if bad or not outs else 0)
PYEOF
done
echo "cpu == cuda: $n captures compared, $fails failing"
[ $fails -eq 0 ]
