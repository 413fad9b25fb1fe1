#!/usr/bin/env bash
# dynemb-dist bench where no GPU is in use (docs/cli.md): --backend cpu times the CPU reference's
# stages and prints no %copy column (no copy bandwidth was measured); the JSON report has the
# schema_version/tool header of the other reports; --backend cuda without a usable CUDA backend
# is exit 2 naming the reason. Skipped (77) on a machine with a GPU (auto would pick cuda).
set -uo pipefail
exe=${DYNEMB:?}
py=${DYNEMB_PYTHON:-python3}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # tmp, fails, ok, fail

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: a GPU is present (bench --backend auto takes cuda)"
  exit 77
fi

out=$("$exe" bench --preset unit-seq-w2 --iters 2 --json "$tmp/b.json" 2>&1)
rc=$?
[[ $rc -eq 0 ]] && ok "bench --backend auto on a machine without GPU: exit 0" || fail "exit $rc: $out"
grep -q '^# dynemb-dist bench: unit-seq-w2 .*backend cpu' <<<"$out" && ok "auto took cpu" \
  || fail "header: $(head -1 <<<"$out")"
grep -q '%copy' <<<"$out" && fail "a %copy column without a copy measurement: $out" || ok "no %copy column"
grep -qE '^ +bucketize +[0-9]+ +0 +[0-9]+ +[0-9.]+ +[0-9.]+$' <<<"$out" && ok "bucketize row" \
  || fail "bucketize row: $out"
"$py" - "$tmp/b.json" <<'PY' && ok "JSON header and stages" || fail "JSON report"
import json, sys
j = json.load(open(sys.argv[1]))
assert isinstance(j["schema_version"], str), j
assert j["tool"]["name"] == "dynemb-dist", j["tool"]
assert j["backend"] == "cpu" and j["copy_gbps"] is None, j
names = [s["name"] for s in j["stages"]]
assert names == ["bucketize", "sequence dist (cpu reference)"], names
assert all(s["pct_copy"] is None and s["time_us"] > 0 for s in j["stages"]), j["stages"]
PY

out=$("$exe" bench --preset unit-seq-w2 --iters 1 --backend cuda 2>&1)
rc=$?
[[ $rc -eq 2 ]] && grep -qE "no CUDA backend|no CUDA device" <<<"$out" \
  && ok "--backend cuda without a usable GPU: exit 2" || fail "--backend cuda: exit $rc: $out"

[[ $fails -eq 0 ]]
