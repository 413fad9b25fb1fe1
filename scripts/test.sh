#!/usr/bin/env bash
# Set up, build and run the whole test suite:  ./scripts/test.sh [BUILD_DIR] [CMAKE_ARGS...]
# Default build dir: build. Default configuration: CUDA compiled when nvcc is found
# (GPU tests are skipped, and say so, where no GPU is present), and the tests' DYNEMB_* hooks
# read (-DDYNEMB_TEST_HOOKS=ON, lib/common/test_hooks.hpp; CMAKE_ARGS may turn them off: the
# tests that need one then skip). DYNEMB_CTEST_ARGS adds ctest options (e.g. "-LE torchrec",
# what .ci/run uses).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
bash scripts/setup.sh
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$build" -G Ninja -DDYNEMB_TEST_HOOKS=ON "$@"
cmake --build "$build" -j "$jobs"
# shellcheck disable=SC2086  # word splitting of DYNEMB_CTEST_ARGS is intended
ctest --test-dir "$build" --output-on-failure -j "$jobs" ${DYNEMB_CTEST_ARGS:-}
