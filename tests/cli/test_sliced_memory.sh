#!/usr/bin/env bash
# Bounded memory with derived lookups: a ctx-only capture whose whole batch needs about 1 GiB
# (W = 8 lookups of [N_local, 128] floats, the outputs and the references) replays under
# --max-memory 160M, over column slices, passing, with a peak RSS within the budget (plus the
# process's own 48 MiB of code and libraries), a sixth of what the whole batch needs. The same
# without --max-memory passes too (slices of at most 512 MiB of floats). A budget that not
# even one column fits in is refused up front, naming what does not fit. Peaks are printed.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_PYTHON (python3).
set -u
: "${DYNEMB:?}" "${DYNEMB_PYTHON:=python3}"
. "$(dirname "$0")/common.sh"
need_test_hooks
skip_rss_under_asan
cd "$tmp" || exit 1

"$DYNEMB" synth --preset unit-seq-w8 --store ctx --batch-size 4096 --hotness 8 -o big.h5 \
  >/dev/null 2>&1 || fail "synth"

"$DYNEMB_PYTHON" - "$DYNEMB" "$(dirname "$0")" <<'EOF' || fails=$((fails + 1))
import os, sys
sys.path.insert(0, sys.argv[2])
from replay_rss import Replays

r = Replays(sys.argv[1])
budget = 160
_, default = r.peak()
# The hook only reports the slices taken here.
err, sliced = r.peak("--max-memory", f"{budget}M", env={"DYNEMB_SLICE_COLUMNS": "1000"})
print(f"peak RSS: no --max-memory {default:.1f} MiB, --max-memory {budget}M {sliced:.1f} MiB")
if "slices of" not in err:
    r.fails.append(f"--max-memory {budget}M: the batch was not sliced: {err[-300:]}")
if sliced > budget + 48:
    r.fails.append(f"--max-memory {budget}M: peak RSS {sliced:.1f} MiB, over {budget} + 48 MiB")
err, _ = r.peak("--max-memory", "40M", want=2)
r.has_texts(err, "--max-memory 40M",
            ("replaying batch 0 needs about", "even one embedding column at a time",
             "more than the 40.00 MiB --max-memory allows", "one column of the W lookups"))
r.finish()
EOF

[[ $fails -eq 0 ]] && echo "bounded memory: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
