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
if nm "$DYNEMB" 2>/dev/null | grep -q __asan_init; then
  echo "ASan build: RSS includes the sanitizer's shadow memory and quarantine; skipped there"
  exit 77
fi
. "$(dirname "$0")/common.sh"
cd "$tmp" || exit 1

"$DYNEMB" synth --preset unit-seq-w8 --store ctx --batch-size 4096 --hotness 8 -o big.h5 \
  >/dev/null 2>&1 || fail "synth"

"$DYNEMB_PYTHON" - "$DYNEMB" <<'EOF' || fails=$((fails + 1))
import os, subprocess, sys

dynemb = sys.argv[1]
fails = []

def peak(*args, want=0):
    """Runs a replay of big.h5; returns (exit code, stderr, peak RSS in MiB from wait4)."""
    p = subprocess.Popen([dynemb, "replay", "big.h5", "--backend", "cpu", "--quiet", *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read().decode(errors="replace")
    _, status, ru = os.wait4(p.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    if rc != want:
        fails.append(f"replay {' '.join(args)}: exit {rc}, want {want}: {err[-400:]}")
    return rc, err, ru.ru_maxrss / 1024.0

budget = 160
_, _, default = peak()
os.environ["DYNEMB_SLICE_COLUMNS"] = "1000"  # the hook only reports the slices taken here
_, err, sliced = peak("--max-memory", f"{budget}M")
del os.environ["DYNEMB_SLICE_COLUMNS"]
print(f"peak RSS: no --max-memory {default:.1f} MiB, --max-memory {budget}M {sliced:.1f} MiB")
if "slices of" not in err:
    fails.append(f"--max-memory {budget}M: the batch was not sliced: {err[-300:]}")
if sliced > budget + 48:
    fails.append(f"--max-memory {budget}M: peak RSS {sliced:.1f} MiB, over {budget} + 48 MiB")
_, err, _ = peak("--max-memory", "40M", want=2)
for text in ("replaying batch 0 needs about", "even one embedding column at a time",
             "more than the 40.00 MiB --max-memory allows", "one column of the W lookups"):
    if text not in err:
        fails.append(f"--max-memory 40M: no '{text}' in: {err[-400:]}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
EOF

[[ $fails -eq 0 ]] && echo "bounded memory: all cases pass" || echo "$fails failure(s)"
[[ $fails -eq 0 ]]
