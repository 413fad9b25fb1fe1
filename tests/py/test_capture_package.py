"""The dynemb_capture package without torch: never silent, never litter, a narrow public API.

- a process killed (SIGTERM, as mp.spawn ends the other ranks, or SIGKILL) while a
  CaptureWriter is open leaves no `rank<r>.h5.tmp-<pid>` behind;
- capture() names requested steps that never ran in a CaptureWarning, and writes no file for
  a module with 0 captured batches (the TorchRec side is replaced by a stand-in target, so
  only the package's own bookkeeping runs; tests/py/test_torchrec_real.py does it for real);
- write_batch checks mean_divisor;
- a temporary is never a name planted ahead of time (a link to a victim at the name a
  temporary used to have, predictable from the pid);
- __all__ is the public API, and the package is marked typed (py.typed).
Env (tests/CMakeLists.txt): DYNEMB_SRC; run by pytest.
"""

import glob
import os
import signal
import subprocess
import sys
import time
import warnings

import h5py
import numpy as np
import pytest

SRC = os.environ.get("DYNEMB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
PKG = os.path.join(SRC, "python")
sys.path.insert(0, PKG)
import dynemb_capture as dc  # noqa: E402
from dynemb_capture import torchrec_adapter  # noqa: E402

PLAN = """format_version: 1
world_size: 1
module: pooled
tables:
  - name: t0
    num_embeddings: 10
    embedding_dim: 4
    pooling: mean
    features: [f0]
"""

WRITER = f"""
import sys, time
sys.path.insert(0, {PKG!r})
import numpy as np
import dynemb_capture as dc
w = dc.CaptureWriter(sys.argv[1], {PLAN!r}, world_size=1, rank=0)
w.write_batch(0, np.array([2], np.int64), np.array([1, 3], np.int64), keys=["f0"])
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_writer_leaves_no_temporary(tmp_path, sig):
    path = str(tmp_path / "rank0.h5")
    p = subprocess.Popen([sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    assert glob.glob(path + ".tmp-*"), "the writer's temporary exists while it runs"
    p.send_signal(sig)
    p.wait(timeout=30)
    left = glob.glob(path + ".tmp-*")
    for _ in range(50):
        if not left:
            break
        time.sleep(0.1)
        left = glob.glob(path + ".tmp-*")
    assert not left
    assert not os.path.exists(path)


class Target:
    """Stands in for torchrec_adapter.RwTarget: one pooled RW sharding, W = 1."""
    fqn, rank, world_size, kind, has_mean, features = "ebc", 0, 1, "pooled", True, ["f0"]
    plan_yaml = PLAN

    def __repr__(self):
        return "Target()"


class NoHooks:
    def __init__(self, target, rec):
        pass

    def remove(self):
        pass


@pytest.fixture
def stand_in(monkeypatch):
    t = Target()
    monkeypatch.setattr(torchrec_adapter, "find_rw_shardings", lambda model: ([t], []))
    monkeypatch.setattr(torchrec_adapter, "Hooks", NoHooks)
    monkeypatch.setattr(torchrec_adapter, "barrier", lambda: None)
    monkeypatch.setattr(torchrec_adapter, "dist_rank", lambda: 0)
    return t


def run_steps(cap, t, n):
    """n forwards as the hooks report them (module input, input dist, lookup, output dist,
    module output)."""
    for _ in range(n):
        cap.on_module_input(t, None, False)
        if cap.want(t):
            cap.on_input(t, dict(keys=["f0"], lengths=np.array([2], np.int64),
                                 values=np.array([1, 3], np.int64), weights=None,
                                 stride_per_feature=None))
            cap.on_local(t, None, None)
            cap.on_output(t, np.ones((1, 4), np.float32))
            cap.on_module_output(t, {"f0": np.ones((1, 4), np.float32)})


def captured_warnings(fn):
    with warnings.catch_warnings(record=True) as wl:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in wl if issubclass(w.category, dc.CaptureWarning)]


def test_steps_that_never_ran_are_named(tmp_path, stand_in):
    out = tmp_path / "caps"

    def go():
        with dc.capture(None, out, batches=[1, 5, 6], merge=False) as cap:
            run_steps(cap, stand_in, 2)
        assert cap.captured == {"ebc": 1}

    msgs = captured_warnings(go)
    assert msgs == ["dynemb_capture: module 'ebc': requested steps 5..6 did not run (steps 0..1 "
                    "ran); 1 of 3 batches captured"], msgs
    with h5py.File(out / "ebc" / "rank0.h5", "r") as f:
        assert int(f.attrs["num_batches"]) == 1
        assert int(f["batches/0"].attrs["iteration"]) == 1
        assert [x.decode() for x in f["batches/0/rank0/mean_divisor"][()]] == ["count"]


def test_zero_batches_write_no_file(tmp_path, stand_in):
    out = tmp_path / "caps"

    def go():
        with dc.capture(None, out, batches=range(10, 13), merge=False) as cap:
            run_steps(cap, stand_in, 4)
        assert cap.captured == {"ebc": 0} and cap.rank_files == {}

    msgs = captured_warnings(go)
    assert "dynemb_capture: module 'ebc': requested steps 10..12 did not run (steps 0..3 ran); " \
           "0 of 3 batches captured" in msgs
    assert "dynemb_capture: module 'ebc': 0 batches captured on rank 0; no file written" in msgs
    assert not [f for d, _, fs in os.walk(out) for f in fs]


def test_mean_divisor_checked(tmp_path):
    w = dc.CaptureWriter(str(tmp_path / "r.h5"), PLAN, world_size=1, rank=0)
    args = (np.array([2], np.int64), np.array([1, 3], np.int64))
    with pytest.raises(dc.CaptureWriterError, match="'weights' but the KJT has no weights"):
        w.write_batch(0, *args, keys=["f0"], mean_divisor="weights")
    with pytest.raises(dc.CaptureWriterError, match="entry 0 is 'ids'"):
        w.write_batch(0, *args, keys=["f0"], mean_divisor=["ids"])
    with pytest.raises(dc.CaptureWriterError, match="2 features, earlier batches had 1"):
        w.write_batch(0, *args, keys=["f0"], mean_divisor=["count", "count"])
    w.write_batch(0, *args, weights=np.array([0.5, 1], np.float32), keys=["f0"],
                  mean_divisor="weights")
    w.close()


def test_planted_link_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    out, cmp_out = tmp_path / "r.h5", tmp_path / "c.h5"
    for p in (out, cmp_out):  # the names a temporary had: predictable from the pid
        os.symlink(victim, f"{p}.tmp-{os.getpid()}")
    w = dc.CaptureWriter(str(out), PLAN, world_size=1, rank=0)
    w.write_batch(0, np.array([2], np.int64), np.array([1, 3], np.int64), keys=["f0"])
    w.close()
    dc.compress_file(out, cmp_out)
    assert victim.read_bytes() == b"precious"
    with h5py.File(cmp_out, "r") as f:
        assert int(f.attrs["world_size"]) == 1
    assert sorted(n for n in os.listdir(tmp_path) if ".tmp-" in n) == sorted(
        f"{p.name}.tmp-{os.getpid()}" for p in (out, cmp_out))  # the planted links, untouched


def test_public_api():
    assert sorted(dc.__all__) == sorted([
        "FORMAT", "FORMAT_VERSION", "Capture", "CaptureWarning", "CaptureWriter",
        "CaptureWriterError", "capture", "compress_file", "context_from_torchrec", "fill_oracle",
        "merge", "oracle_rows", "__version__"])
    for name in dc.__all__:
        assert hasattr(dc, name), name
    for internal in ("fmix64", "to_numpy", "keys_array"):
        assert not hasattr(dc, internal), internal
    assert os.path.exists(os.path.join(PKG, "dynemb_capture", "py.typed"))
