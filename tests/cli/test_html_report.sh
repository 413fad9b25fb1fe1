#!/usr/bin/env bash
# The HTML reports (`replay --html`, `load --html`) in a real browser: each page is opened in
# headless Chromium (tests/cli/html_browser.py) and must log nothing to the console (no script,
# no request refused by its Content-Security-Policy), and every chart's box in a screenshot
# must be drawn (many non-background pixels of several colors); the verdict colors are where
# the planted faults say. Pages broken on purpose (a script, a remote image, a script error, a
# page whose charts draw nothing) must fail those checks. A page for 64 ranks x 100 batches is
# under 2 MB and no chart draws more than 64 x 64 cells, for W = 1024 too.
# With DYNEMB_SCREENSHOT_DIR set, the screenshots are left there (scripts/docs-screenshots.sh).
# Skipped (77) without chromium or python3-pil.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC, DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_SRC:?}" "${DYNEMB_PYTHON:=python3}"
command -v chromium >/dev/null || command -v chromium-browser >/dev/null ||
  { echo "skipped: no chromium on PATH (scripts/setup.sh installs it)"; exit 77; }
"$DYNEMB_PYTHON" -c 'import PIL, h5py, numpy' 2>/dev/null ||
  { echo "skipped: $DYNEMB_PYTHON has no PIL, h5py or numpy (python3-pil, python3-h5py)"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail, expect_rc, has_text
cd "$tmp" || exit 1
browser="$DYNEMB_SRC/tests/cli/html_browser.py"
check() {
  if "$DYNEMB_PYTHON" "$browser" "$@" >check.out 2>&1; then
    ok "browser: $(cat check.out)"
  else
    cat check.out
    fail "browser: $1"
  fi
}
# check_fails PAGE REGEX: the browser check rejects PAGE, saying REGEX.
check_fails() {
  local page=$1 want=$2
  shift 2
  if "$DYNEMB_PYTHON" "$browser" "$page" "$@" >check.out 2>&1; then
    fail "browser: $page passed, but it is broken"
  elif ! grep -qE -- "$want" check.out; then
    fail "browser: $page failed without saying '$want':"
    cat check.out
  else
    ok "browser rejects $page: $want"
  fi
}
mutate() {
  "$DYNEMB_PYTHON" - "$1" "$2" <<'EOF' || fail "mutate $1"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    exec(sys.argv[2])
EOF
}

# ---- replay: a capture that passes
"$DYNEMB" synth --preset unit-seq-w8 --batches 6 --batch-size 16 --seed 4 -o seq.h5 >/dev/null || fail "synth seq"
"$DYNEMB" replay seq.h5 --html pass.html -q >pass.out 2>&1
expect_rc pass 0 $?
has_text pass.html '<b>PASS</b>' pass
has_text pass.html '<tr><td>rank 7</td><td>pass</td><td>pass</td><td>pass</td><td>pass</td><td>pass</td><td>pass</td></tr>' pass
check pass.html --charts 1 --expect-colors '#43a047' --shot replay-pass

# ---- replay: planted faults: golden outputs off (batch 1 rank 0, batch 3 rank 5), a wrong
# captured lookup (batch 4 rank 2), a missing dataset (batch 5 rank 7: trouble, exit 2)
cp seq.h5 bad.h5
mutate bad.h5 '
d = f["batches/1/rank0/output"]; v = d[...]; v[3, 5] = np.nextafter(v[3, 5], np.float32(np.inf), dtype=np.float32); d[...] = v
d = f["batches/3/rank5/output"]; v = d[...]; v[0, 0] += 1; v[1, 1] += 1; d[...] = v
d = f["batches/4/rank2/local_embs"]; v = d[...]; v[2, 7] += 1; d[...] = v
del f["batches/5/rank7/values"]'
"$DYNEMB" replay bad.h5 --html bad.html --json bad.json -q >bad.out 2>&1
expect_rc bad 2 $?
has_text bad.html '<b>ERROR</b>' bad
grep -qE '<tr><td class="n">1</td><td class="n">0</td><td>mismatch</td><td>output golden</td><td>f[0-3]</td><td>feature f[0-3], sample [0-9]+, position [0-9]+, column 5</td><td class="n">replayed ' bad.html ||
  fail "bad: no first mismatch of batch 1 rank 0 in the table"
has_text bad.html '<td class="n">5</td><td class="n">7</td><td>error</td>' bad
has_text bad.html '<title>batch 3, rank 5: mismatch; ' bad
# The grid agrees with the JSON report cell by cell.
"$DYNEMB_PYTHON" - bad.json bad.html <<'EOF' || fail "bad: the grid and the JSON report disagree"
import json, re, sys
r = json.load(open(sys.argv[1]))
page = open(sys.argv[2]).read()
worst = {}
rank = {"pass": 0, "skipped": 1, "fail": 2, "error": 3}
for c in r["checks"]:
    if c["batch"] is None:
        continue
    ranks = [c["rank"]] if c["rank"] is not None else range(r["run"]["world_size"])
    for k in ranks:
        key = (c["batch"], k)
        worst[key] = max(worst.get(key, 0), rank[c["status"]])
names = ["pass", "skipped", "mismatch", "error"]
seen = 0
for (b, k), s in worst.items():
    if not re.search(rf"<title>batch {b}, rank {k}: {names[s]}[;<]", page):
        sys.exit(f"batch {b} rank {k}: want {names[s]}")
    seen += 1
assert seen >= 40, seen
EOF
check bad.html --charts 2 --expect-colors '#43a047,#e53935,#6a1b9a' --shot replay-grid:0:520 --shot replay-features:1:420

# ---- replay --plan: the plan's differences in a table
sed 's/num_embeddings: 1000$/num_embeddings: 4000/; s/num_embeddings: 17$/num_embeddings: 40/' \
  "$DYNEMB_SRC/plans/unit-seq-w8.yaml" >other.yaml
"$DYNEMB" replay seq.h5 --plan other.yaml --html plan.html -q >plan.out 2>&1
expect_rc plan 0 $?
has_text plan.html '<tr><td>tables[t0].num_embeddings</td><td>1000</td><td>4000</td></tr>' plan
has_text plan.html '<tr><td>tables[t3].num_embeddings</td><td>17</td><td>40</td></tr>' plan
check plan.html --charts 1

# ---- replay at W = 64 x 100 batches: under 2 MB, every cell drawn
sed 's/^world_size: 2$/world_size: 64/; s/embedding_dim: 128/embedding_dim: 8/' \
  "$DYNEMB_SRC/plans/unit-seq-w2.yaml" >w64.yaml
"$DYNEMB" synth w64.yaml --batches 100 --batch-size 2 -o w64.h5 >/dev/null || fail "synth w64"
"$DYNEMB" replay w64.h5 --html w64.html -q >w64.out 2>&1
expect_rc w64 0 $?
has_text w64.html '<title>rank 63, batches 98-99: 2 pass</title>' w64  # 50 blocks of 2 batches
check w64.html --charts 1 --max-bytes 2000000 --max-cells 4096 --expect-colors '#43a047'

# ---- load --html: docs/load.md's hot spot (W = 8 with every dist_type, the balanced rows and
# W = 16: 4 bar charts, imbalance, estimates, 2 heat maps a plan; its screenshots are the
# page's pictures), W = 64 x 100 batches with every dist_type under 2 MB, and W = 1024 (the
# W = 64 capture's global batch re-split) drawn in blocks
"$DYNEMB" synth --preset unit-seq-w8 --ids zipf:1.2 --batch-size 64 --batches 3 -o hot.h5 \
  >/dev/null || fail "synth hot"
"$DYNEMB" load hot.h5 --alternatives dist-types --balance-rows --world-size 16 \
  --html load8.html -q >load8.out 2>&1
expect_rc load8 0 $?
has_text load8.html '<td>roundrobin</td><td>every table under roundrobin (was continuous)</td>' load8
check load8.html --charts 16 --shot load-overview --shot load-imbalance:4:420 --shot load-traffic:6:450
"$DYNEMB" load w64.h5 --alternatives dist-types --html load64.html -q >load64.out 2>&1
expect_rc load64 0 $?
check load64.html --charts 12 --max-bytes 2000000 --max-cells 4096
"$DYNEMB" synth w64.yaml --batches 4 --batch-size 16 -o w64b16.h5 >/dev/null || fail "synth w64b16"
"$DYNEMB" load w64b16.h5 --world-size 1024 --html load1024.html -q >load1024.out 2>&1
expect_rc load1024 0 $?
has_text load1024.html '<title>ranks 1008-1023, w1024: ' load1024
check load1024.html --charts 10 --max-cells 4096

# ---- pages built by hand: load at W = 8 and W = 1024 (tests/test_load_html.cpp), replay's
# grid at W = 1024 x 100 batches (tests/test_replay_html.cpp)
bin=$(dirname "$DYNEMB")/tests
DYNEMB_LOAD_HTML_DIR=$tmp "$bin/test_load_html" >load.out 2>&1 || { cat load.out; fail "test_load_html"; }
DYNEMB_REPLAY_HTML_DIR=$tmp "$bin/test_replay_html" >rh.out 2>&1 || { cat rh.out; fail "test_replay_html"; }
check load-w8.html --charts 12
check load-w1024.html --max-cells 4096
check replay-w1024.html --max-cells 4096 --expect-colors '#43a047,#e53935'
ls -l ./*.html | awk '{print "size:", $5, $NF}'

# ---- the checks catch a broken page
csp=$(grep -o '<meta http-equiv="Content-Security-Policy"[^>]*>' pass.html)
sed 's|</body>|<script>document.title = "x";</script></body>|' pass.html >script.html
check_fails script.html 'console: .*Content Security Policy'
sed 's|</body>|<img src="http://127.0.0.1:9/x.png" alt=""></body>|' pass.html >remote.html
check_fails remote.html "console: .*Loading the image 'http://127.0.0.1:9/x.png' violates"
sed "s|$csp||; s|</body>|<script>no_such_function();</script></body>|" pass.html >error.html
check_fails error.html 'console: .*Uncaught ReferenceError'
sed -E 's|<rect [^>]*>(<title>[^<]*</title></rect>)?||g' pass.html >blank.html
check_fails blank.html 'chart 0 .* looks blank'
check_fails bad.html 'no chart shows the color #123456' --expect-colors '#123456'

[[ $fails -eq 0 ]]
