#!/usr/bin/env bash
# Regenerates fixtures/torchrec/*.h5 with real TorchRec (tools/README.md has the venv setup).
#   tools/make_torchrec_fixtures.sh [PYTHON] [DYNEMB] [OUTDIR]
# Deterministic: same versions + same seeds give the same datasets (HDF5 bytes may differ).
# Each capture is made by tools/torchrec_capture.py through the dynemb_capture package.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${1:-/opt/torchrec-venv/bin/python}"
dynemb="${2:-$here/../build/dynemb-dist}"
out="${3:-$here/../fixtures/torchrec}"
mkdir -p "$out"
run() {  # config world_size
  "$py" "$here/torchrec_capture.py" --config "$1" -W "$2" --out "$out/$1-w$2.h5" \
    --dynemb "$dynemb" 2> >(grep -E "Error|error|Traceback|raise" >&2 || true)
}
run ec 2
run ec 4
run ebc 2
run ebc 4
run ebc-vbe 2
run ebc-vbe 4
run ebc-weighted 2
run ebc-mean 2
run ebc-mean 4
run ebc-mean-weighted 2
run ebc-mean-vbe 2
run ebc-mean-sum 2
