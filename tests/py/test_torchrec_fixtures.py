#!/usr/bin/env python3
"""Replays every TorchRec golden in fixtures/torchrec/ (made by tools/torchrec_capture.py with
real TorchRec/FBGEMM on CPU; no torch needed here), and checks that copies with one context
field altered are mismatches (exit 1) that name the field.

Replay of every fixture exits 0 comparing both the captured context and the golden output;
each altered copy exits 1 naming the field. Every fixture carries `keys` (the KJT keys at the
RW input dist, equal to the plan's feature order); the MEAN fixtures (ebc-mean*) carry
`module_output` (TorchRec's mean-pooled output; `output` holds the sums) and, in VBE batches,
`inverse_indices`: a replay checks them, and an altered module_output is a mismatch.
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


def plan_order(plan):
    feats = []
    for line in plan.splitlines():
        if line.strip().startswith("features: ["):
            feats += [x.strip() for x in line.split("[", 1)[1].rstrip("]").split(",")]
    return feats


def check_datasets(path):
    """keys in every rank group; MEAN fixtures: module_output (+ inverse_indices in VBE)."""
    name = os.path.basename(path)
    with h5py.File(path, "r") as f:
        order = plan_order(f["plan"][()].decode())
        mean = "pooling: mean" in f["plan"][()].decode()
        groups = [f[f"batches/{k}"][r] for k in f["batches"] for r in f[f"batches/{k}"]]
        keys_ok = all("keys" in g and g["keys"].dtype.kind == "S"
                      and [x.decode() for x in g["keys"][()]] == order for g in groups)
        check(keys_ok, f"{name}: keys (fixed-length) in plan order {order} in every rank group")
        if mean:
            check(all("module_output" in g and g["module_output"].dtype == np.float32
                      for g in groups), f"{name}: module_output in every rank group")
            vbe = [g for g in groups if "stride_per_feature" in g]
            check(all("inverse_indices" in g and g["inverse_indices"].shape[0] == len(order)
                      for g in vbe), f"{name}: inverse_indices in every VBE rank group")
            # output holds the sums, module_output the means: they differ somewhere.
            check(any(not np.array_equal(g["output"][()], g["module_output"][()])
                      for g in groups if "stride_per_feature" not in g) or vbe,
                  f"{name}: output (sums) differs from module_output (means)")
    return mean


MEAN_FIXTURES = ["ebc-mean-w2", "ebc-mean-w4", "ebc-mean-weighted-w2", "ebc-mean-vbe-w2",
                 "ebc-mean-sum-w2"]


def main():
    check(len(FIXTURES) >= 12, f"fixtures/torchrec holds the TorchRec captures ({len(FIXTURES)})")
    names = {os.path.basename(p)[:-3] for p in FIXTURES}
    check(set(MEAN_FIXTURES) <= names, f"the MEAN fixtures are there: {sorted(names)}")
    for path in FIXTURES:
        check_datasets(path)
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
            # A neutral file name: the report prints the path, which must not name the field.
            bad = os.path.join(tmp, f"alt{len(os.listdir(tmp))}.h5")
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
        # A wrong module_output value (the module's mean-pooled output) is a mismatch naming it.
        for fixture, dset in (("ebc-mean-sum-w2", "batches/1/rank0/module_output"),
                              ("ebc-mean-vbe-w2", "batches/0/rank1/module_output")):
            bad = os.path.join(tmp, f"alt{len(os.listdir(tmp))}.h5")
            shutil.copy(os.path.join(SRC, "fixtures", "torchrec", fixture + ".h5"), bad)
            with h5py.File(bad, "r+") as f:
                d = f[dset]
                a = d[()]
                a[0, 0] += 0.5
                d[...] = a
            p = replay(bad)
            check(p.returncode == 1 and "module_output" in p.stdout + p.stderr,
                  f"{fixture} with {dset} altered: exit {p.returncode}, want 1 naming "
                  "module_output")
        # Keys out of the plan's order are refused, naming keys.
        bad = os.path.join(tmp, f"alt{len(os.listdir(tmp))}.h5")
        shutil.copy(os.path.join(SRC, "fixtures", "torchrec", "ebc-mean-sum-w2.h5"), bad)
        with h5py.File(bad, "r+") as f:
            d = f["batches/0/rank1/keys"]
            d[...] = swap01(d[()])
        p = replay(bad)
        check(p.returncode != 0 and "keys" in p.stdout + p.stderr,
              f"keys out of plan order: exit {p.returncode}, want non-zero naming keys")
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
