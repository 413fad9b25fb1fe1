"""One version source: __version__ in python/dynemb_capture/__init__.py. The top-level
CMakeLists.txt reads it (so `dynemb-dist --version` says it), python/pyproject.toml declares
the version dynamic (flit reads the same line), and the man page carries the same number.
Env (tests/CMakeLists.txt): DYNEMB, DYNEMB_SRC; run by pytest.
"""
import os
import re
import subprocess

import pytest

SRC = os.environ.get("DYNEMB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DYNEMB = os.environ.get("DYNEMB", "dynemb-dist")


def read(*parts):
    return open(os.path.join(SRC, *parts), encoding="utf-8").read()


@pytest.fixture(scope="module")
def version():
    m = re.search(r'^__version__ = "([0-9]+\.[0-9]+\.[0-9]+)"$',
                  read("python", "dynemb_capture", "__init__.py"), re.M)
    assert m, "no __version__ line in python/dynemb_capture/__init__.py"
    return m.group(1)


def test_cmake_reads_it(version):
    cmake = read("CMakeLists.txt")
    assert re.search(r"project\(dynemb-dist VERSION \$\{DYNEMB_VERSION\}", cmake)
    assert "python/dynemb_capture/__init__.py" in cmake
    out = subprocess.run([DYNEMB, "--version"], capture_output=True, text=True).stdout
    assert out.split()[:2] == ["dynemb-dist", version], out


def test_pyproject_has_no_second_copy():
    py = read("python", "pyproject.toml")
    assert re.search(r'^dynamic = \["version"\]', py, re.M)
    assert not re.search(r"^version\s*=", py, re.M)


def test_man_page(version):
    th = read("man", "dynemb-dist.1").splitlines()[0]
    assert f'"dynemb\\-dist {version}"' in th, th
