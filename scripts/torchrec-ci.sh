#!/usr/bin/env bash
# The real-TorchRec step of CI:  scripts/torchrec-ci.sh BUILD_DIR [VENV_DIR]
# Installs the pinned TorchRec closure (tools/requirements-torchrec.txt, about 3 GB from PyPI)
# into a venv inside the clone (default build-ci-torchrec-venv; kept if it already imports
# torchrec), installs the dynemb_capture package into it as a user does (pip install ./python),
# and runs the tests labelled "torchrec" once with DYNEMB_TORCHREC_PYTHON pointing at it.
# Nothing is cached outside the clone but pip's own cache.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/torchrec-ci.sh BUILD_DIR [VENV_DIR]}
venv=${2:-build-ci-torchrec-venv}
export CI="${CI:-true}"
t0=$(date +%s)
if ! "$venv/bin/python" -c "import torchrec" >/dev/null 2>&1; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --no-deps -r tools/requirements-torchrec.txt
fi
"$venv/bin/pip" install -q --no-deps ./python
echo "torchrec venv ready in $(( $(date +%s) - t0 )) s ($venv)"
t1=$(date +%s)
DYNEMB_TORCHREC_PYTHON="$PWD/$venv/bin/python" \
  ctest --test-dir "$build" -L torchrec --output-on-failure
echo "torchrec tests passed in $(( $(date +%s) - t1 )) s"
