"""`dynemb-dist merge` keeps each batch's training step (attribute `iteration` of
/batches/<k>, written by dynemb_capture), from rank 0's file; rank files without it merge
into batches without it. Env (tests/CMakeLists.txt): DYNEMB, DYNEMB_SRC; run by pytest.
"""

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

SRC = os.environ.get("DYNEMB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DYNEMB = os.environ.get("DYNEMB", "dynemb-dist")
sys.path.insert(0, os.path.join(SRC, "python"))
import dynemb_capture as dc  # noqa: E402

PLAN = """format_version: 1
world_size: 2
module: pooled
tables:
  - name: t0
    num_embeddings: 10
    embedding_dim: 4
    pooling: mean
    features: [f0]
"""


def write_ranks(tmp_path, iterations):
    files = []
    for r in range(2):
        path = str(tmp_path / f"rank{r}.h5")
        with dc.CaptureWriter(path, PLAN, world_size=2, rank=r) as w:
            for k, it in enumerate(iterations):
                w.write_batch(k, np.array([1, 2], np.int64), np.array([r, 3, 9], np.int64),
                              keys=["f0"], iteration=it, mean_divisor="count")
        files.append(path)
    return files


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_merge_keeps_iteration(tmp_path, compression):
    files = write_ranks(tmp_path, [100, 104, 108])
    out = str(tmp_path / "merged.h5")
    dc.merge(files, out, dynemb=DYNEMB, compression=compression)
    with h5py.File(out, "r") as f:
        assert [int(f[f"batches/{k}"].attrs["iteration"]) for k in range(3)] == [100, 104, 108]
        assert [x.decode() for x in f["batches/2/rank1/mean_divisor"][()]] == ["count"]
    p = subprocess.run([DYNEMB, "replay", out], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr


def test_merge_without_iteration(tmp_path):
    files = write_ranks(tmp_path, [None, None])
    out = str(tmp_path / "merged.h5")
    p = subprocess.run([DYNEMB, "merge", *files, "-o", out], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    with h5py.File(out, "r") as f:
        assert "iteration" not in f["batches/0"].attrs and "iteration" not in f["batches/1"].attrs
