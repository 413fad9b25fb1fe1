#!/usr/bin/env bash
# Set up, build and run the main job on a bundled fixture: validate its plan, then replay
# the capture (CPU backend when there is no GPU).   ./scripts/quickstart.sh [FIXTURE.h5]
set -euo pipefail
cd "$(dirname "$0")/.."
fixture=${1:-fixtures/seq-w2.h5}
bash scripts/setup.sh
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# A build for use: it reads none of the tests' DYNEMB_* hooks (even where build/ was configured
# for the tests before).
cmake -S . -B build -G Ninja -DDYNEMB_TEST_HOOKS=OFF >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target dynemb-dist
./build/dynemb-dist inspect "$fixture"
./build/dynemb-dist replay "$fixture"
