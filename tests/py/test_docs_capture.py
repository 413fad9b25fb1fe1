#!/usr/bin/env python3
"""Runs docs/capture-your-job.md like the other pages (test_docs_tutorial.py), with the
TorchRec venv's python as `python3`: a real W = 3 DMP job captured with dynemb_capture,
merged by rank 0 and replayed.

The venv is DYNEMB_TORCHREC_PYTHON (default /opt/torchrec-venv/bin/python). It uses the
dynemb_capture installed there (`pip install ./python`, what .ci/run does), else the source
tree's python/. Without the venv: exit 77 (skipped, with the reason), except under CI=true.
"""
import importlib.util
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("DYNEMB_SRC", os.path.join(HERE, "..", ".."))
PY = os.environ.get("DYNEMB_TORCHREC_PYTHON", "/opt/torchrec-venv/bin/python")


def main():
    spec = importlib.util.spec_from_file_location("docs_runner",
                                                  os.path.join(HERE, "test_docs_tutorial.py"))
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    runner.self_test()
    dynemb = os.environ.get("DYNEMB")
    if not dynemb or not os.path.exists(dynemb):
        print("DYNEMB (the dynemb-dist binary) is not set")
        return 2
    ok = os.path.exists(PY) and subprocess.run(
        [PY, "-c", "import torchrec, h5py"], capture_output=True).returncode == 0
    if not ok:
        why = f"{PY} is missing or cannot import torchrec"
        if os.environ.get("CI", "").lower() == "true":
            print(f"FAIL: CI=true but {why} (.ci/run sets DYNEMB_TORCHREC_PYTHON)")
            return 1
        print(f"skipped: {why}; install the venv (tools/README.md) or set "
              "DYNEMB_TORCHREC_PYTHON")
        return 77
    if subprocess.run([PY, "-c", "import dynemb_capture"], capture_output=True).returncode:
        os.environ["PYTHONPATH"] = os.path.abspath(os.path.join(SRC, "python"))
        print("dynemb_capture from the source tree (not installed in the venv)")
    page = os.path.join(SRC, "docs", "capture-your-job.md")
    return 0 if runner.run_doc(page, dynemb, PY) else 1


if __name__ == "__main__":
    sys.exit(main())
