#!/usr/bin/env python3
"""Opt-in (DYNEMB_TORCHREC=1): reruns tools/torchrec_capture.py with real TorchRec and replays
what it produced, and checks the new capture's datasets equal the committed golden.

Not run by CI (it needs the ~3 GB venv of tools/requirements-torchrec.txt); without
DYNEMB_TORCHREC=1 it exits 77 (skipped). DYNEMB_TORCHREC_PYTHON names the venv's python
(default /opt/torchrec-venv/bin/python). See tools/README.md.
"""

import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

SRC = os.environ.get("DYNEMB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DYNEMB = os.environ.get("DYNEMB", "dynemb-dist")
PY = os.environ.get("DYNEMB_TORCHREC_PYTHON", "/opt/torchrec-venv/bin/python")


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def main():
    if os.environ.get("DYNEMB_TORCHREC") != "1":
        print("skipped: set DYNEMB_TORCHREC=1 (needs the TorchRec venv, tools/README.md)")
        return 77
    if not os.path.exists(PY):
        print(f"DYNEMB_TORCHREC=1 but {PY} does not exist (set DYNEMB_TORCHREC_PYTHON)")
        return 1
    fails = 0
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        runs = (("ec", 2), ("ebc", 2), ("ebc-vbe", 2), ("ebc-mean-sum", 2))
        for config, w in runs:
            out = os.path.join(tmp, f"{config}-w{w}.h5")
            p = subprocess.run([PY, os.path.join(SRC, "tools", "torchrec_capture.py"),
                                "--config", config, "-W", str(w), "--out", out,
                                "--dynemb", DYNEMB], capture_output=True, text=True)
            if p.returncode != 0:
                print(f"FAIL: torchrec_capture {config} W={w}: exit {p.returncode}\n"
                      f"{p.stderr[-4000:]}")
                fails += 1
                continue
            r = subprocess.run([DYNEMB, "replay", out], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL: replay {config} W={w}: exit {r.returncode}\n{r.stdout[-3000:]}")
                fails += 1
            new = datasets(out)
            old = datasets(os.path.join(SRC, "fixtures", "torchrec", f"{config}-w{w}.h5"))
            diff = [k for k in sorted(set(new) | set(old))
                    if k not in new or k not in old or not np.array_equal(new[k], old[k])]
            if diff:
                print(f"FAIL: {config} W={w}: rerun differs from the golden in {diff[:5]}")
                fails += 1
    print(f"{len(runs) - fails} passed, {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
