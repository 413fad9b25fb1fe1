#!/usr/bin/env python3
"""The dynemb_capture package's version equals dynemb-dist's: project(VERSION) in the top-level
CMakeLists.txt, `dynemb-dist --version`, python/pyproject.toml and dynemb_capture.__version__
must all say the same (a release bumps them together).
Env (tests/CMakeLists.txt): DYNEMB, DYNEMB_SRC.
"""
import os
import re
import subprocess
import sys

SRC = os.environ.get("DYNEMB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DYNEMB = os.environ.get("DYNEMB", "dynemb-dist")


def main():
    cmake = open(os.path.join(SRC, "CMakeLists.txt"), encoding="utf-8").read()
    m = re.search(r"project\(\s*dynemb-dist\s+VERSION\s+([0-9][0-9.]*)", cmake)
    if not m:
        print("FAIL: no project(dynemb-dist VERSION x.y.z) in CMakeLists.txt")
        return 1
    want = m.group(1)
    found = {}
    py = open(os.path.join(SRC, "python", "pyproject.toml"), encoding="utf-8").read()
    m = re.search(r'^version\s*=\s*"([^"]+)"', py, re.M)
    found["python/pyproject.toml"] = m.group(1) if m else None
    init = open(os.path.join(SRC, "python", "dynemb_capture", "__init__.py"),
                encoding="utf-8").read()
    m = re.search(r'^__version__\s*=\s*"([^"]+)"', init, re.M)
    found["dynemb_capture.__version__"] = m.group(1) if m else None
    out = subprocess.run([DYNEMB, "--version"], capture_output=True, text=True).stdout
    m = re.match(r"dynemb-dist (\S+)", out)
    found["dynemb-dist --version"] = m.group(1) if m else out.strip()
    bad = {k: v for k, v in found.items() if v != want}
    for k, v in found.items():
        print(f"{'ok  ' if v == want else 'FAIL'} {k}: {v} (CMakeLists.txt: {want})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
