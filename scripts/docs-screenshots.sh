#!/usr/bin/env bash
# The screenshots of the HTML reports in docs/img (replay-grid.png, load-overview.png, ...):
# runs the browser test (tests/cli/test_html_report.sh) on an existing build, which leaves its
# screenshots in DYNEMB_SCREENSHOT_DIR. Builds nothing: build first (README.md), then
#   scripts/docs-screenshots.sh [BUILD_DIR]      (default: build)
# Needs chromium and python3-pil (scripts/setup.sh installs them).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build}
[[ -f "$build/CTestTestfile.cmake" ]] || { echo "docs-screenshots: no build in $build (build first)" >&2; exit 2; }
mkdir -p "$root/docs/img"
DYNEMB_SCREENSHOT_DIR=$root/docs/img ctest --test-dir "$build" -R '^cli_test_html_report$' --output-on-failure
# The test skips (and leaves nothing) without chromium: say so instead of passing quietly.
n=0
for f in replay-pass replay-grid replay-features load-overview load-imbalance load-traffic; do
  png=$root/docs/img/$f.png
  if [[ ! -s "$png" ]]; then
    echo "docs-screenshots: $png was not made (is chromium installed?)" >&2
    exit 1
  fi
  size=$(stat -c %s "$png")
  ((size <= 300 * 1024)) || { echo "docs-screenshots: $png is $size bytes (over 300 KiB)" >&2; exit 1; }
  echo "$png: $size bytes"
  n=$((n + 1))
done
echo "docs-screenshots: $n screenshots in docs/img"
