#!/usr/bin/env bash
# DYNEMB_TRACE=FILE: a replay writes the timeline of its spans as a Chrome trace (JSON), renamed
# into place once complete; the report is the same with and without it. DYNEMB_STEP_TIMES=1
# prints the steps' wall times and the time outside them.
set -uo pipefail
exe=${DYNEMB:?}
py=${DYNEMB_PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"  # tmp, fails, ok, fail
cd "$tmp" || exit 1

"$exe" synth --preset unit-seq-w2 --batches 2 -o c.h5 >/dev/null 2>&1 || fail "synth"
DYNEMB_TRACE=$tmp/t.json DYNEMB_STEP_TIMES=1 "$exe" replay c.h5 --backend cpu --quiet \
  --json traced.json >out.txt 2>err.txt
expect_rc "traced replay" 0 $?
"$exe" replay c.h5 --backend cpu --quiet --json plain.json >/dev/null 2>&1
expect_rc "plain replay" 0 $?
reports_equal traced.json plain.json && ok "the report is the same with the trace" ||
  fail "the trace changed the report"
[[ -f t.json && ! -e t.json.tmp ]] && ok "trace written, no temporary left" ||
  fail "trace: $(ls -a)"
has_text err.txt "step times (DYNEMB_STEP_TIMES)" "step times"
has_text err.txt "before the replay" "time outside the steps"

# The spans: well formed, every batch read, every rank of each batch bucketized once, the
# replay's steps on the main thread, the next batch's shapes read ahead.
"$py" - t.json <<'PY' && ok "trace spans" || fail "trace spans"
import collections, json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
assert ev, "no spans"
for e in ev:
    assert e["ph"] == "X" and e["ts"] >= 0 and e["dur"] >= 0, e
names = collections.Counter(e["name"] for e in ev)
args = collections.defaultdict(list)
for e in ev:
    args[e["name"]].append(e["args"]["arg"])
assert sorted(args["read batch"]) == [0, 1], args["read batch"]
assert sorted(args["bucketize"]) == [0, 0, 1, 1], args["bucketize"]  # W = 2, two batches
for n in ("input dist", "kjt all-to-all", "sha256", "lookup", "output dist", "read rows"):
    assert names[n] > 0, (n, names)
main = {e["tid"] for e in ev if e["name"] == "input dist"}
assert len(main) == 1 and {e["tid"] for e in ev if e["name"] == "kjt all-to-all"} == main
# One destination at a time: batch 1's KJTs and contexts are read on another thread while
# batch 0 checks its last unit, after every read of batch 0.
rb = {e["args"]["arg"]: e for e in ev if e["name"] == "read batch"}
assert rb[0]["tid"] in main and rb[1]["tid"] not in main, rb
rows0 = [e for e in ev if e["name"] == "read rows" and e["args"]["arg"] == 0]
assert rows0 and rb[1]["ts"] >= max(e["ts"] + e["dur"] for e in rows0), rb[1]
PY
sum=$("$py" "$here/../../bench/trace_summary.py" t.json --min-ms 0)
grep -q "^thread 0: " <<<"$sum" && grep -q "read batch \[1\]" <<<"$sum" &&
  ok "trace_summary prints threads and the timeline" || fail "trace_summary: $sum"

# The trace is an output like any other: never the capture, whatever the spelling; a trace
# that cannot be made is refused before any work; no temporary is left.
before=$(sha c.h5)
ln -s c.h5 link.h5
for spelling in c.h5 ./c.h5 "$tmp/c.h5" link.h5; do
  DYNEMB_TRACE=$spelling "$exe" replay c.h5 --backend cpu --quiet >clash.txt 2>&1
  expect_rc "DYNEMB_TRACE=$spelling" 2 $?
  has_text clash.txt "DYNEMB_TRACE" "DYNEMB_TRACE=$spelling names the clash"
done
[[ $(sha c.h5) == "$before" ]] && ok "the capture is untouched" || fail "the capture changed"
DYNEMB_TRACE=$tmp/no/such/dir/t.json "$exe" replay c.h5 --backend cpu --quiet >nodir.txt 2>&1
expect_rc "trace in a missing directory" 2 $?
has_text nodir.txt "no/such/dir" "the missing directory named"
no_temps "$tmp" "refused traces"

# A batch's long int64 datasets (values, unbucketize_permute, lengths_after_input_dist of every
# rank) are decoded at once before they are read one by one: every one of them here, the
# contexts derived from the KJTs match the captured ones (a value misplaced would not), and a
# damaged chunk of one of them is still named by its own read.
"$exe" synth --preset unit-seq-w8 --batch-size 2048 --store ctx --batches 2 -o long.h5 \
  >/dev/null 2>&1 || fail "synth long.h5"
DYNEMB_TRACE=$tmp/long.json "$exe" replay long.h5 --backend cpu --quiet >/dev/null 2>&1
expect_rc "replay of long.h5" 0 $?
"$py" - long.json <<'PY' && ok "prefetch: 24 datasets a batch" || fail "prefetch spans"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
got = [e["args"]["arg"] for e in ev if e["name"] == "prefetched"]
assert got == [24, 24], got
PY
if "$py" -c 'import h5py' 2>/dev/null; then
  "$py" - <<'PY' || fail "damage long.h5"
import shutil, h5py
shutil.copy("long.h5", "long-bad.h5")
with h5py.File("long-bad.h5", "r") as f:
    info = f["batches/1/rank3/values"].id.get_chunk_info(0)
with open("long-bad.h5", "r+b") as f:
    f.seek(info.byte_offset + info.size // 2)
    f.write(b"\xff" * 64)
PY
  "$exe" replay long-bad.h5 --backend cpu --quiet >bad.txt 2>&1
  expect_rc "replay of a damaged values chunk" 2 $?
  has_text bad.txt "/batches/1/rank3/values: chunk 0 " "the damaged chunk named by its dataset"
else
  echo "skipped: the damaged chunk (no h5py for $py)"
fi

# Without the variable, nothing is written.
rm -f t.json
"$exe" replay c.h5 --backend cpu --quiet >/dev/null 2>&1
[[ ! -e t.json ]] && ok "no trace without DYNEMB_TRACE" || fail "a trace without DYNEMB_TRACE"
[[ $fails -eq 0 ]]
