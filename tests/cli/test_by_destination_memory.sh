#!/usr/bin/env bash
# Bounded memory with captured lookups: a pooled capture whose whole batch is about 550 MiB of
# captured floats (W = 16 local_embs of [16 x 1024, 512] and the outputs) replays one destination
# rank at a time in a small part of what the whole batch takes (DYNEMB_BY_DESTINATION=off), both
# passing with the same report; and a --max-memory that admits one destination's share but not
# the whole batch is enough. A budget below even one destination's share is refused up front,
# naming what does not fit. Peaks are printed.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_PYTHON (python3).
set -u
: "${DYNEMB:?}" "${DYNEMB_PYTHON:=python3}"
. "$(dirname "$0")/common.sh"
need_test_hooks
skip_rss_under_asan
cd "$tmp" || exit 1

# unit-pooled-w8's tables at W = 16: the whole batch grows as W^2 B, one destination's share as
# W B, so what the design saves shows well above the ids and contexts both hold.
cat >w16.yaml <<'YAML'
format_version: 1
world_size: 16
module: pooled
comm_precision: fp32
tables:
  - {name: t0, num_embeddings: 1000, embedding_dim: 128, data_type: fp32, features: [f0]}
  - {name: t1, num_embeddings: 1001, embedding_dim: 128, data_type: fp32, features: [f1]}
  - {name: t2, num_embeddings: 2047, embedding_dim: 128, data_type: fp32, features: [f2]}
  - {name: t3, num_embeddings: 17, embedding_dim: 128, data_type: fp32, features: [f3]}
YAML
"$DYNEMB" synth w16.yaml --batch-size 1024 -o big.h5 >/dev/null 2>&1 || fail "synth"

"$DYNEMB_PYTHON" - "$DYNEMB" "$(dirname "$0")" <<'EOF' || fails=$((fails + 1))
import json, sys
sys.path.insert(0, sys.argv[2])
from replay_rss import Replays

r = Replays(sys.argv[1])
_, whole = r.peak("--json", "whole.json", env={"DYNEMB_BY_DESTINATION": "off"})
err, dest = r.peak("--json", "dest.json", env={"DYNEMB_BY_DESTINATION": "report"})
budget = 200
err_b, budgeted = r.peak("--max-memory", f"{budget}M", env={"DYNEMB_BY_DESTINATION": "report"})
print(f"peak RSS: whole batch {whole:.1f} MiB, by destination {dest:.1f} MiB, "
      f"--max-memory {budget}M {budgeted:.1f} MiB")
for e in (err, err_b):
    if "batch 0: one destination at a time" not in e:
        r.fails.append(f"not replayed by destination: {e[-300:]}")
if whole < 300:
    r.fails.append(f"the whole batch took only {whole:.1f} MiB: the case no longer tells")
if dest > whole / 3:
    r.fails.append(f"by destination {dest:.1f} MiB, over a third of the whole batch's {whole:.1f}")
if budgeted > budget:
    r.fails.append(f"--max-memory {budget}M: peak RSS {budgeted:.1f} MiB")
a, b = (json.load(open(p)) for p in ("whole.json", "dest.json"))
if a["checks"] != b["checks"] or a["summary"] != b["summary"]:
    r.fails.append("the reports differ")
err, _ = r.peak("--max-memory", "40M", want=2)
r.has_texts(err, "--max-memory 40M",
            ("replaying batch 0 needs about", "even one destination rank at a time",
             "more than the 40.00 MiB --max-memory allows"))
r.finish()
EOF

[[ $fails -eq 0 ]] && echo "bounded memory by destination: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
