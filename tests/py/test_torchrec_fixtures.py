#!/usr/bin/env python3
"""Replays every TorchRec golden in fixtures/torchrec/ (made by tools/torchrec_capture.py with
real TorchRec/FBGEMM on CPU; no torch needed here), and checks that copies with one context
field altered are mismatches (exit 1) that name the field.

Acceptance: replay of every fixture exits 0 comparing both the captured context and
the golden output; each altered copy exits 1 naming the field.
Env (tests/CMakeLists.txt): DYNEMB, DYNEMB_SRC; cwd = build/tests.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

SRC = os.environ.get("DYNEMB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DYNEMB = os.environ.get("DYNEMB", "dynemb-dist")
FIXTURES = sorted(glob.glob(os.path.join(SRC, "fixtures", "torchrec", "*.h5")))
failures = []
passed = 0


def check(cond, what):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(what)
        print("FAIL:", what)


def replay(path, *extra):
    return subprocess.run([DYNEMB, "replay", path, *extra], capture_output=True, text=True)


# (fixture name, HDF5 dataset, edit: array -> altered array of the same shape and sum)
def swap01(a):
    b = a.copy()
    b.flat[0], b.flat[1] = a.flat[1], a.flat[0]
    return b


def move_one(a):
    """Moves 1 from the first positive entry to the next entry: same shape, same sum."""
    b = a.copy().reshape(-1)
    i = int(np.flatnonzero(b > 0)[0])
    j = (i + 1) % b.size
    b[i] -= 1
    b[j] += 1
    return b.reshape(a.shape)


ALTERATIONS = [
    ("ec-w2", "batches/0/rank0/ctx/unbucketize_permute", swap01, "unbucketize_permute"),
    ("ec-w2", "batches/0/rank1/ctx/input_splits", move_one, "input_splits"),
    ("ec-w4", "batches/1/rank2/ctx/output_splits", move_one, "output_splits"),
    ("ec-w4", "batches/1/rank0/ctx/sparse_features_recat", swap01, "sparse_features_recat"),
    ("ec-w2", "batches/2/rank1/ctx/lengths_after_input_dist", move_one,
     "lengths_after_input_dist"),
    ("ec-w2", "batches/0/rank0/ctx/batch_size_per_rank", move_one, "batch_size_per_rank"),
    ("ebc-w4", "batches/1/rank3/ctx/batch_size_per_rank", move_one, "batch_size_per_rank"),
    ("ebc-vbe-w2", "batches/0/rank1/ctx/batch_size_per_rank_per_feature", move_one,
     "batch_size_per_rank_per_feature"),
]


def main():
    check(len(FIXTURES) >= 6, f"fixtures/torchrec holds the TorchRec captures ({len(FIXTURES)})")
    for path in FIXTURES:
        name = os.path.basename(path)
        for extra in ((), ("--ctx", "derived")):
            p = replay(path, *extra)
            check(p.returncode == 0, f"replay {name} {' '.join(extra)}: exit {p.returncode}\n"
                  f"{p.stdout[-3000:]}\n{p.stderr[-2000:]}")
            # Both the context and the golden output were compared, not skipped.
            out = p.stdout
            check("# ctx" in out and "# output" in out and "PASS" in out,
                  f"replay {name}: report covers ctx and output")

    tmp = tempfile.mkdtemp(prefix="torchrec_alt_", dir=os.getcwd())
    try:
        for fixture, dset, edit, field in ALTERATIONS:
            src = os.path.join(SRC, "fixtures", "torchrec", fixture + ".h5")
            bad = os.path.join(tmp, f"{fixture}-{field}.h5")
            shutil.copy(src, bad)
            with h5py.File(bad, "r+") as f:
                d = f[dset]
                a = d[()]
                b = edit(a)
                assert b.shape == a.shape and not np.array_equal(a, b)
                d[...] = b
            p = replay(bad)
            text = p.stdout + p.stderr
            check(p.returncode == 1, f"{fixture} with {dset} altered: exit {p.returncode}, want 1\n"
                  f"{text[-3000:]}")
            check(field in text, f"{fixture} with {dset} altered: report names {field}")
            with open(src, "rb") as f1, open(bad, "rb") as f2:
                check(f1.read() != f2.read(), "the altered copy differs from the fixture")
        # A wrong golden value (one element) is a data mismatch.
        bad = os.path.join(tmp, "ec-w4-output.h5")
        shutil.copy(os.path.join(SRC, "fixtures", "torchrec", "ec-w4.h5"), bad)
        with h5py.File(bad, "r+") as f:
            d = f["batches/2/rank3/output"]
            a = d[()]
            a[1, 2] += 0.015625
            d[...] = a
        p = replay(bad)
        check(p.returncode == 1 and "output" in p.stdout + p.stderr,
              f"altered golden output: exit {p.returncode}, want 1")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
