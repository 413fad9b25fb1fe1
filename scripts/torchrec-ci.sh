#!/usr/bin/env bash
# The real-TorchRec step of CI:  scripts/torchrec-ci.sh BUILD_DIR [VENV_DIR [NEWEST_VENV_DIR]]
#
# 1. Builds the dynemb_capture wheel (python -m build, in a small tools venv that also holds
#    mypy) and checks that building wrote nothing into the source tree; mypy --strict on the
#    package.
# 2. Installs the pinned TorchRec closure (tools/requirements-torchrec.txt) into VENV_DIR
#    (default build-ci-torchrec-venv) and the newest release's (tools/requirements-torchrec-
#    newest.txt) into NEWEST_VENV_DIR (default build-ci-torchrec-newest-venv), each about 3 GB
#    from PyPI, each kept if it already imports torchrec; installs the wheel into both, as a
#    user does (no source tree on the path).
# 3. Runs the tests labelled "torchrec" with the pinned venv, then the real-TorchRec job test
#    with the newest (DYNEMB_TORCHREC_JOB_ARGS=--no-vbe-mean: 1.9.2 refuses VBE with two table
#    groups on the CPU). Any failure stops the script with a non-zero exit; the last line says
#    "torchrec tests passed" only when everything did.
# Nothing is cached outside the clone but pip's own cache.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/torchrec-ci.sh BUILD_DIR [VENV_DIR [NEWEST_VENV_DIR]]}
venv=$(realpath -m "${2:-build-ci-torchrec-venv}")
newest=$(realpath -m "${3:-build-ci-torchrec-newest-venv}")
tools=$(realpath -m build-ci-py-tools-venv)
build=$(realpath -m "$build")
export CI="${CI:-true}"
t0=$(date +%s)

if ! "$tools/bin/python" -c "import build, mypy, numpy" >/dev/null 2>&1; then
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q build mypy numpy
fi
wheel_dir=$build/wheel
rm -rf "$wheel_dir"
before=$(git status --porcelain --ignored -- python)
"$tools/bin/python" -m build -q --outdir "$wheel_dir" python >/dev/null
after=$(git status --porcelain --ignored -- python)
if [ "$before" != "$after" ]; then
  echo "FAIL: building the package wrote into the source tree:"
  diff <(echo "$before") <(echo "$after") || true
  exit 1
fi
wheel=$(ls "$wheel_dir"/dynemb_capture-*.whl)
echo "wheel: $wheel"
(cd python && "$tools/bin/mypy" --cache-dir "$build/mypy-cache")

install_venv() {  # DIR REQUIREMENTS
  if ! "$1/bin/python" -c "import torchrec" >/dev/null 2>&1; then
    rm -rf "$1"
    python3 -m venv "$1"
    "$1/bin/pip" install -q --no-deps -r "$2"
  fi
  "$1/bin/pip" install -q --no-deps --force-reinstall "$wheel"
}
install_venv "$venv" tools/requirements-torchrec.txt
install_venv "$newest" tools/requirements-torchrec-newest.txt
echo "torchrec venvs ready in $(( $(date +%s) - t0 )) s ($venv, $newest)"

t1=$(date +%s)
DYNEMB_TORCHREC_PYTHON="$venv/bin/python" \
  ctest --test-dir "$build" -L torchrec --output-on-failure
echo "pinned release: torchrec tests passed in $(( $(date +%s) - t1 )) s"
t2=$(date +%s)
DYNEMB_TORCHREC_PYTHON="$newest/bin/python" DYNEMB_TORCHREC_JOB_ARGS=--no-vbe-mean \
  ctest --test-dir "$build" -R '^py_test_torchrec_real$' --output-on-failure
echo "newest release: torchrec tests passed in $(( $(date +%s) - t2 )) s"
echo "torchrec tests passed (both releases) in $(( $(date +%s) - t0 )) s"
