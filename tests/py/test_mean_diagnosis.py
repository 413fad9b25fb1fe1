"""The per-rank-means diagnosis fires only on evidence (docs/mean-pooling.md): a MEAN column
that differs, in bags whose id count is not 0 or 1 (there a mean equals a sum).

Property: random captures (pooled-mean-mixed-dims: f_item MEAN, f_user / f_user_hist / f_ctx
SUM) with bags of 0 or 1 ids, or with longer MEAN bags, and one planted 1-ulp difference in a
SUM column of local_embs: the replay fails on the lookup (exact tolerance) and never names
MEAN. The planted MEAN fault (`synth --plant local-embs-means`) is still named.
Env (tests/CMakeLists.txt): DYNEMB; run by pytest.
"""

import os
import subprocess

import h5py
import numpy as np
import pytest

DYNEMB = os.environ.get("DYNEMB", "dynemb-dist")
SUM_COLUMNS = list(range(0, 32)) + list(range(64, 72))  # f_user, f_user_hist | f_ctx


def run(*args):
    return subprocess.run([DYNEMB, *args], capture_output=True, text=True)


@pytest.mark.parametrize("seed", range(24))
def test_one_ulp_in_a_sum_column_never_names_mean(tmp_path, seed):
    rng = np.random.default_rng(seed)
    # Even seeds: every bag 0 or 1 ids. Odd seeds: MEAN bags up to 4 ids (means != sums).
    item = "0..1" if seed % 2 == 0 else "0..4"
    hot = ",".join(["0..1", "0..1", item, "0..1"])
    path = str(tmp_path / "c.h5")
    p = run("synth", "--preset", "pooled-mean-mixed-dims", "--hotness", hot, "--seed",
            str(seed), "--batch-size", str(int(rng.integers(1, 9))), "-o", path)
    assert p.returncode == 0, p.stderr
    with h5py.File(path, "r+") as f:
        r = int(rng.integers(0, 4))
        d = f[f"batches/0/rank{r}/local_embs"]
        a = d[()]
        row = int(rng.integers(0, a.shape[0]))
        col = int(rng.choice(SUM_COLUMNS))
        a[row, col] = np.nextafter(a[row, col], np.float32(np.inf), dtype=np.float32)
        d[...] = a
    p = run("replay", path, "--max-mismatches", "1")
    assert p.returncode == 1, p.stdout[-2000:]
    assert "lookup" in p.stdout
    assert "per-rank means" not in p.stdout and "kept MEAN" not in p.stdout, p.stdout[-3000:]


def test_planted_per_rank_means_still_named(tmp_path):
    path = str(tmp_path / "m.h5")
    p = run("synth", "--preset", "pooled-mean-mixed-dims", "--plant", "local-embs-means",
            "-o", path)
    assert p.returncode == 0, p.stderr
    p = run("replay", path, "--max-mismatches", "1")
    assert p.returncode == 1
    assert "hold per-rank means, not per-rank sums" in p.stdout
    assert "[cause: lookup kept MEAN pooling under RW]" in p.stdout
