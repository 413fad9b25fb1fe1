#!/usr/bin/env bash
# Large captures: replay streams batch by batch, so the peak RSS of replaying a
# capture of many batches stays near that of one batch (two when the next batch is read
# ahead), however large the file. The memory
# budget here is set to 1/4 of the capture's logical size (the bytes of its datasets); the
# replay of all 24 batches must stay under it and within 1.5x (+ 48 MiB) of the one-batch
# replay's peak. The same for `validate --capture` (shapes only) and synth (writes a batch at
# a time). Peaks are printed; docs/robustness.md records them.
# Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_PYTHON (python3 + h5py).
set -u
: "${DYNEMB:?}" "${DYNEMB_PYTHON:=python3}"
"$DYNEMB_PYTHON" -c 'import h5py, numpy' 2>/dev/null || { echo "no h5py for $DYNEMB_PYTHON"; exit 77; }
if nm "$DYNEMB" 2>/dev/null | grep -q __asan_init; then
  echo "ASan build: RSS includes the sanitizer's shadow memory and quarantine; skipped there"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$DYNEMB_PYTHON" - "$DYNEMB" "$tmp" <<'EOF'
import os, subprocess, sys, h5py

dynemb, tmp = sys.argv[1], sys.argv[2]
fails = []

def peak(*args):
    """Runs the tool; returns (exit code, peak RSS in MiB) from wait4's ru_maxrss (KiB)."""
    p = subprocess.Popen([dynemb, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    err = p.stderr.read().decode(errors="replace")
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        fails.append(f"{args[0]} exit {rc}: {err[-400:]}")
    return rc, ru.ru_maxrss / 1024.0

def logical_bytes(path):
    total = 0
    def visit(_, obj):
        nonlocal total
        if isinstance(obj, h5py.Dataset):
            total += obj.size * obj.dtype.itemsize
    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return total

# unit-seq-w8: W=8, B=128 per rank, D=128 fp32; every optional part stored.
one, big = f"{tmp}/one.h5", f"{tmp}/big.h5"
_, synth1 = peak("synth", "--preset", "unit-seq-w8", "--batches", "1", "--seed", "1", "-o", one)
_, synthN = peak("synth", "--preset", "unit-seq-w8", "--batches", "24", "--seed", "1", "-o", big)
size = logical_bytes(big)
budget = size / 4
# The CPU backend: what is measured is the streaming of batches, not a CUDA context's RSS
# (on a GPU machine `auto` would pick cuda and add ~100 MiB of driver state to both).
# Read in turn (--read-ahead 0), one batch is in memory at a time; read ahead (the default),
# two: the batch replayed and the next one.
_, rep1 = peak("replay", one, "--quiet", "--backend", "cpu", "--read-ahead", "0")
_, repN = peak("replay", big, "--quiet", "--backend", "cpu", "--read-ahead", "0")
_, repA = peak("replay", big, "--quiet", "--backend", "cpu")
_, valN = peak("validate", os.path.join(os.environ.get("DYNEMB_SRC", "."), "plans/unit-seq-w8.yaml"),
                  "--capture", big)
mib = 1 << 20
print(f"capture: 24 batches, {size / mib:.1f} MiB logical, {os.path.getsize(big) / mib:.1f} MiB on disk;"
      f" budget {budget / mib:.1f} MiB")
print(f"peak RSS: replay 1 batch {rep1:.1f} MiB, replay 24 batches {repN:.1f} MiB"
      f" ({repA:.1f} MiB reading ahead);"
      f" synth 1 batch {synth1:.1f} MiB, synth 24 batches {synthN:.1f} MiB; validate --capture {valN:.1f} MiB")
if repN * mib > budget:
    fails.append(f"replay of 24 batches peaked at {repN:.1f} MiB, over the budget {budget / mib:.1f} MiB")
for what, pN, p1 in (("replay", repN, rep1), ("synth", synthN, synth1)):
    if pN > 1.5 * p1 + 48:
        fails.append(f"{what}: 24 batches peaked at {pN:.1f} MiB vs {p1:.1f} MiB for one: not streaming")
if repA > 2.5 * rep1 + 48:
    fails.append(f"replay reading ahead: 24 batches peaked at {repA:.1f} MiB vs {rep1:.1f} MiB "
                 "for one: more than the two batches it holds")
if valN > 1.5 * rep1 + 48:
    fails.append(f"validate --capture peaked at {valN:.1f} MiB")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
EOF
