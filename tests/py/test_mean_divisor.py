"""The MEAN divisor a capture records (`mean_divisor`, docs/capture-format.md) and what replay
makes of it: a weighted pooled capture whose module divides by the id count (TorchRec's
feature-processed EBC: the lookup gets weights, the module's own input KJT has none) passes in
both --ctx modes; a module output divided by another divisor fails naming the feature and the
divisor it matches; the summary line counts the module stage; a damaged entry is exit 2.

The captures are `dynemb-dist synth --weighted` ones (pooled-mean-mixed-dims: t_item MEAN,
the rest SUM) whose module_output is rewritten with numpy from the captured output.
Env (tests/CMakeLists.txt): DYNEMB, DYNEMB_SRC; run by pytest.
"""

import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import yaml

SRC = os.environ.get("DYNEMB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DYNEMB = os.environ.get("DYNEMB", "dynemb-dist")
sys.path.insert(0, os.path.join(SRC, "python"))
from dynemb_capture.writer import keys_array  # noqa: E402

EPS = np.float32(1e-6)


def run(*args):
    return subprocess.run([DYNEMB, *args], capture_output=True, text=True)


def features(f):
    """[(name, dim, is_mean)] in plan order."""
    plan = yaml.safe_load(f["plan"][()].decode())
    return [(name, t["embedding_dim"], t.get("pooling", "sum") == "mean")
            for t in plan["tables"] for name in t["features"]]


def rewrite(path, divisor, mean_divisor):
    """module_output := output / divisor(bag) for MEAN columns (SUM columns / (1 + 1e-6)), and
    mean_divisor (None: removed) in every rank-batch. divisor: 'count', 'weights', 'positions'."""
    with h5py.File(path, "r+") as f:
        feats = features(f)
        for k in range(int(f.attrs["num_batches"])):
            for r in range(int(f.attrs["world_size"])):
                g = f[f"batches/{k}/rank{r}"]
                lengths = g["lengths"][()].astype(np.int64)
                weights = g["weights"][()]
                out = g["output"][()]
                B = lengths.size // len(feats)
                offs = np.concatenate([[0], np.cumsum(lengths)])
                mo = np.empty_like(out)
                c = 0
                for fi, (_, dim, mean) in enumerate(feats):
                    for b in range(B):
                        j = fi * B + b
                        n = int(lengths[j])
                        if not mean:
                            d = np.float32(1)
                        elif divisor == "count":
                            d = np.float32(n)
                        elif divisor == "weights":
                            d = np.float32(0)
                            for x in weights[offs[j]:offs[j + 1]]:
                                d = np.float32(d + x)
                        else:  # 0-based positions in the bag, summed
                            d = np.float32(n * (n - 1) // 2)
                        mo[b, c:c + dim] = out[b, c:c + dim] / np.float32(d + EPS)
                    c += dim
                g["module_output"][...] = mo
                if "mean_divisor" in g:
                    del g["mean_divisor"]
                if mean_divisor is not None:
                    g.create_dataset("mean_divisor", data=keys_array([mean_divisor] * len(feats)))


@pytest.fixture(scope="module")
def weighted(tmp_path_factory):
    d = tmp_path_factory.mktemp("mean_divisor")
    path = str(d / "w.h5")
    p = run("synth", "--preset", "pooled-mean-mixed-dims", "--weighted", "--batches", "2",
            "--hotness", "0..4", "--seed", "5", "--store", "ctx,local_embs,output,module_output",
            "-o", path)
    assert p.returncode == 0, p.stderr
    return path


def copy(src, tmp_path, name):
    dst = str(tmp_path / name)
    shutil.copy(src, dst)
    return dst


@pytest.mark.parametrize("ctx", ["captured", "derived"])
def test_count_divisor_of_a_weighted_capture_passes(weighted, tmp_path, ctx):
    path = copy(weighted, tmp_path, "count.h5")
    rewrite(path, "count", "count")
    p = run("replay", path, "--ctx", ctx)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    assert "0 module mismatches" in p.stdout


@pytest.mark.parametrize("ctx", ["captured", "derived"])
def test_weights_divisor_as_before(weighted, tmp_path, ctx):
    for md in (None, "weights"):  # an old file (no mean_divisor) and an explicit one
        path = copy(weighted, tmp_path, f"weights-{md}.h5")
        rewrite(path, "weights", md)
        p = run("replay", path, "--ctx", ctx)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr


def test_module_output_divided_by_weights_where_count_is_recorded(weighted, tmp_path):
    path = copy(weighted, tmp_path, "w-vs-count.h5")
    rewrite(path, "weights", "count")
    p = run("replay", path, "--max-mismatches", "1")
    assert p.returncode == 1, p.stdout[-2000:]
    assert ("feature f_item: module output = sums / (Σ of the captured weights); MEAN expects "
            "the id count") in p.stdout
    assert "[cause: module divides MEAN by another divisor" in p.stdout
    assert "cause: data" not in p.stdout


def test_positions_as_divisor_is_named(weighted, tmp_path):
    """TorchRec 1.9's position-weighted module: the MEAN divides by the sum of the ids'
    0-based positions (the weights the KJT carries through the input dist)."""
    path = copy(weighted, tmp_path, "positions.h5")
    rewrite(path, "positions", "count")
    p = run("replay", path, "--max-mismatches", "1")
    assert p.returncode == 1, p.stdout[-2000:]
    assert ("feature f_item: module output = sums / (Σ weights at the input dist: each id's "
            "0-based position in its bag") in p.stdout
    assert "MEAN expects the id count" in p.stdout
    result = [ln for ln in p.stdout.splitlines() if ln.startswith("# result:")]
    assert result and "FAIL (exit 1)" in result[0], result
    n = int(result[0].split(" module mismatches")[0].rsplit(" ", 1)[1])
    assert n > 0, result[0]


def test_bad_entries_are_refused(weighted, tmp_path):
    path = copy(weighted, tmp_path, "bad.h5")
    with h5py.File(path, "r+") as f:
        f["batches/1/rank2"].create_dataset("mean_divisor", data=keys_array(["count", "ids",
                                                                            "count", "count"]))
    p = run("replay", path)
    assert p.returncode == 2
    assert "/batches/1/rank2/mean_divisor" in p.stdout + p.stderr
    assert "feature f_user_hist" in p.stdout + p.stderr

    unweighted = str(tmp_path / "u.h5")
    assert run("synth", "--preset", "pooled-mean-mixed-dims", "-o", unweighted).returncode == 0
    with h5py.File(unweighted, "r+") as f:
        f["batches/0/rank0"].create_dataset("mean_divisor", data=keys_array(["weights"] * 4))
    p = run("replay", unweighted)
    assert p.returncode == 2
    assert "the KJT has no weights" in p.stdout + p.stderr


def test_write_output_keeps_mean_divisor(weighted, tmp_path):
    path = copy(weighted, tmp_path, "keep.h5")
    rewrite(path, "count", "count")
    out = str(tmp_path / "keep-out.h5")
    p = run("replay", path, "--write-output", out)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    with h5py.File(out, "r") as f:
        assert [x.decode() for x in f["batches/1/rank3/mean_divisor"][()]] == ["count"] * 4
    assert run("replay", out).returncode == 0
