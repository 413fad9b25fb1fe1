#!/usr/bin/env python3
"""Real TorchRec, captured with dynemb_capture only, replayed by dynemb-dist.

Runs tools/torchrec_dmp_job.py (a DistributedModelParallel job on CPU/gloo, W = 3: an EC
and EBCs in one model, MEAN and SUM tables, a shared table, uneven shards, a module mixing
RW with TW, DP and CW tables, two position-weighted EBCs (one with a MEAN table), weighted
and VBE batches, an EC fed VBE batches; the RW shardings of two modules are subclasses of
TorchRec's, as DynamicEmb's are) with the TorchRec venv's python, then checks with numpy/h5py
and dynemb-dist:

- an EC fed VBE KJTs is captured as TorchRec padded it (no stride_per_feature);
- the warnings name the TW, DP and CW tables and their modules, and only those tables are
  left out of the exported plans; the RW sharding is the EBC's second;
- each exported plan lists the features in the sharding's order and `keys` agrees;
- module_output is TorchRec's own mean pooling of `output` as the format contract computes
  it (MEAN: global bag length or weight sum, SUM: 1, + 1e-6; VBE: expanded by
  inverse_indices), exactly;
- the position-weighted capture holds the processed weights (with the positions instead,
  replay reports a lookup mismatch);
- every merged capture replays with exit 0 in both --ctx modes; on TorchRec 1.9 the
  position-weighted MEAN module exits 1 naming the divisor TorchRec used (the sum of the
  positions); a planted context fault exits 1 naming it;
- mean_divisor is "count" for the feature-processed and plain EBCs, "weights" for the
  weighted one; subclassed RW shardings are captured;
- requested steps that never ran are named in a CaptureWarning, a module with 0 captured
  batches gets no file; a rank that raises inside capture() (mp.spawn terminates the others)
  leaves no temporary file;
- the time of a captured step against a plain one (printed, and written to
  capture_overhead.json in the working directory).

Needs the venv of tools/requirements-torchrec.txt: DYNEMB_TORCHREC_PYTHON (default
/opt/torchrec-venv/bin/python). Without it: exit 77 (skipped, with the reason), except under
CI=true, where a missing venv is a failure. DYNEMB_TORCHREC_JOB_ARGS adds job options
(e.g. --no-vbe-mean for TorchRec 1.9.2).
"""

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time

import h5py
import numpy as np
import pytest

SRC = os.environ.get("DYNEMB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DYNEMB = os.environ.get("DYNEMB", "dynemb-dist")
PY = os.environ.get("DYNEMB_TORCHREC_PYTHON", "/opt/torchrec-venv/bin/python")
failures = []
pytestmark = pytest.mark.torchrec


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def venv_ok():
    if not os.path.exists(PY):
        return f"{PY} does not exist"
    p = subprocess.run([PY, "-c", "import torchrec, h5py"], capture_output=True, text=True)
    if p.returncode != 0:
        return f"{PY} cannot import torchrec: {p.stderr.strip().splitlines()[-1:]}"
    return None


def plan_features(plan):
    feats, tables = [], []
    for line in plan.splitlines():
        if line.startswith("  - name: "):
            tables.append(line.split(": ", 1)[1])
        if line.strip().startswith("features: ["):
            feats += [f.strip() for f in line.split("[", 1)[1].rstrip("]").split(",")]
    return tables, feats


def plan_info(plan):
    """feature -> (dim, pooling) from the exported plan text."""
    info, cur = {}, {}
    for line in plan.splitlines():
        s = line.strip().lstrip("- ")
        if s.startswith("name: "):
            cur = {"pooling": "sum"}
        elif s.startswith("embedding_dim: "):
            cur["dim"] = int(s.split(": ")[1])
        elif s.startswith("pooling: "):
            cur["pooling"] = s.split(": ")[1]
        elif s.startswith("features: ["):
            for f in s.split("[", 1)[1].rstrip("]").split(","):
                info[f.strip()] = (cur["dim"], cur["pooling"])
    return info


def expected_module_output(g, info, feats):
    """The contract's module_output from this rank group's KJT, output and inverse_indices."""
    lengths = g["lengths"][()].astype(np.int64)
    out = g["output"][()]
    weights = g["weights"][()] if "weights" in g else None
    if "mean_divisor" in g and set(x.decode() for x in g["mean_divisor"][()]) == {"count"}:
        weights = None  # the module's own input KJT had no weights (feature-processed EBC)
    vbe = "stride_per_feature" in g
    strides = g["stride_per_feature"][()] if vbe else None
    if not vbe:
        B = lengths.size // len(feats)
        strides = np.full(len(feats), B)
    # per-bag length or weight sum, feature-major
    offs = np.concatenate([[0], np.cumsum(lengths)])
    if weights is not None:
        per_bag = np.array([weights[offs[i]:offs[i + 1]].sum(dtype=np.float32)
                            for i in range(lengths.size)], np.float32)
    else:
        per_bag = lengths.astype(np.float32)
    has_mean = any(info[f][1] == "mean" for f in feats)
    inv = g["inverse_indices"][()] if vbe else None
    B_full = inv.shape[1] if vbe else int(strides[0])
    cols, bag0, col0 = [], 0, 0
    eps = np.float32(1e-6)
    for fi, f in enumerate(feats):
        D, pooling = info[f]
        Bf = int(strides[fi])
        if vbe:
            block = out[col0:col0 + Bf * D].reshape(Bf, D)
            col0 += Bf * D
            idx = inv[fi]
        else:
            block = out[:, col0:col0 + D]
            col0 += D
            idx = np.arange(Bf)
        lens = per_bag[bag0:bag0 + Bf][idx]
        bag0 += Bf
        div = (lens if pooling == "mean" else np.ones(B_full, np.float32)) + eps
        if not has_mean:
            div = np.ones(B_full, np.float32)
        cols.append((block[idx] / div[:, None].astype(np.float32)).astype(np.float32))
    return np.concatenate(cols, axis=1)


def replay(path, *extra):
    return subprocess.run([DYNEMB, "replay", path, *extra], capture_output=True, text=True)


def tmp_files(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if ".tmp-" in f]


def failing_job(tmp, extra):
    """A rank raises inside capture(); mp.spawn terminates the others (SIGTERM): no
    temporary file may stay behind."""
    out = os.path.join(tmp, "caps-fail")
    p = subprocess.run([PY, os.path.join(SRC, "tools", "torchrec_dmp_job.py"), "--out", out,
                        "--dynemb", DYNEMB, "--fail-rank", "1", "--fail-step", "2", *extra],
                       capture_output=True, text=True, timeout=900)
    check(p.returncode != 0 and "planted failure on rank 1 at step 2" in p.stderr,
          f"failing job: exit {p.returncode}, the planted failure reported")
    left = tmp_files(out)
    for _ in range(50):  # the other ranks' files go when their cleanup process sees them die
        if not left:
            break
        time.sleep(0.2)
        left = tmp_files(out)
    check(not left, f"no temporary files after the ranks were terminated: {left}")


@pytest.fixture(scope="module")
def job_run():
    """Runs the job once (a module fixture): its output directory, job.json and options."""
    why = venv_ok()
    if why:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but the TorchRec venv is missing: {why} "
                        "(.ci/run installs it and sets DYNEMB_TORCHREC_PYTHON)")
        pytest.exit(f"skipped: {why}; install it (tools/README.md) or set "
                    "DYNEMB_TORCHREC_PYTHON", returncode=77)
    extra = shlex.split(os.environ.get("DYNEMB_TORCHREC_JOB_ARGS", ""))
    tmp = tempfile.mkdtemp(prefix="torchrec_real_", dir=os.getcwd())
    try:
        out = os.path.join(tmp, "caps")
        t0 = time.time()
        p = subprocess.run([PY, os.path.join(SRC, "tools", "torchrec_dmp_job.py"), "--out", out,
                            "--dynemb", DYNEMB, "--bench", "10", *extra],
                           capture_output=True, text=True, timeout=900)
        print(f"job: exit {p.returncode} in {time.time() - t0:.0f} s")
        assert p.returncode == 0, f"the TorchRec job failed:\n{p.stdout[-3000:]}{p.stderr[-6000:]}"
        yield dict(out=out, tmp=tmp, extra=extra)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def verdict():
    """Fails the test with every failed check (each was printed as it failed)."""
    what = list(failures)
    failures.clear()
    assert not what, "\n".join(what)


def test_job_captures_and_replays(job_run):
    out, tmp, extra = job_run["out"], job_run["tmp"], job_run["extra"]
    job = json.load(open(os.path.join(out, "job.json")))
    print("versions:", job["versions"])
    warn = "\n".join(job["warnings"])
    for mod, table, st in (("ebc", "tw0", "table_wise"), ("wbc", "dp0", "data_parallel"),
                           ("wbc", "cw0", "column_wise")):
        check(any(f"module '{mod}'" in w and table in w and st in w
                  for w in job["warnings"]),
              f"a warning names module {mod}, table {table}, {st}: {warn!r}")
    check(len(job["warnings"]) == 3, f"three warnings, no other: {warn!r}")
    check("RwTarget('ebc', pooled, rw index 1, W=3)" in job["targets"]
          and "RwTarget('ec', sequence, rw index 0, W=3)" in job["targets"],
          f"RW found at index 1 of ebc and 0 of ec: {job['targets']}")
    check(sorted(job["merged"]) == ["ebc", "ec", "ecv", "fp", "fpm", "vbe", "wbc"],
          f"rank 0 merged every module: {sorted(job['merged'])}")
    # TorchRec 1.9's position-weighted module divides MEAN by the sum of the ids' 0-based
    # positions, not by the id count (docs/mean-pooling.md): replay names it, exit 1.
    positions_divisor = not job["versions"]["torchrec"].startswith("1.4")
    cls = job["sharding_classes"]
    check(cls.get("ebc") == "RwPooledSubclassSharding"
          and cls.get("ec") == "RwSequenceSubclassSharding"
          and cls.get("wbc") == "RwPooledEmbeddingSharding",
          f"subclasses of TorchRec's RW shardings captured (as DynamicEmb's): {cls}")
    if os.environ.get("CI", "").lower() == "true":
        check("site-packages" in job["package"],
              f"the job used the installed package: {job['package']}")
    late = job["late"]
    check(set(late["partial"]["captured"].values()) == {1}
          and all(any(f"module '{m}': requested steps 5..6 did not run" in w
                      for w in late["partial"]["warnings"]) for m in job["merged"]),
          f"steps 5..6 of a 2-step loop: 1 batch each and a warning naming the steps: "
          f"{late['partial']}")
    check(late["none"]["merged"] == {} and set(late["none"]["captured"].values()) == {0}
          and any("requested steps 10..12 did not run" in w
                  for w in late["none"]["warnings"])
          and any("module 'ebc': 0 batches captured on rank 0; no file written" in w
                  for w in late["none"]["warnings"])
          and not [f for d, _, fs in os.walk(os.path.join(out, "late-none")) for f in fs],
          f"steps 10..12 of a 2-step loop: no file, said: {late['none']}")

    want_order = {"ebc": ["p0", "p3", "p1", "p2"], "ec": ["s0", "s1", "s2"],
                  "wbc": ["w0", "w1"], "fp": ["u0", "u1"], "fpm": ["g0", "g1"]}
    want_divisor = {"ebc": "count", "wbc": "weights", "vbe": "count", "fp": "count",
                    "fpm": "count"}
    mean_checked = 0
    fpm_same = []
    for mod in sorted(job["merged"]):
        path = os.path.join(out, mod + ".h5")
        with h5py.File(path, "r") as f:
            plan = f["plan"][()].decode()
            tables, feats = plan_features(plan)
            info = plan_info(plan)
            if mod in want_order:
                check(feats == want_order[mod], f"{mod}: plan features {feats}")
            check(not any(t in plan for t in ("tw0", "dp0", "cw0")),
                  f"{mod}: only RW tables in the exported plan")
            if mod == "ebc":
                check(tables == ["m0", "m3", "s1"] and "tw0" not in plan,
                      f"ebc: plan tables {tables} (TW table left out)")
                check("rows: 2}" in plan and "pooling: mean" in plan,
                      "ebc: uneven shards and MEAN pooling exported")
            nb = int(f.attrs["num_batches"])
            check(nb == 3, f"{mod}: 3 batches ({nb})")
            for k in range(nb):
                for r in range(3):
                    g = f[f"batches/{k}/rank{r}"]
                    keys = [x.decode() for x in g["keys"][()]]
                    check(keys == feats and g["keys"].dtype.kind == "S",
                          f"{mod} b{k} r{r}: keys {keys} in plan order, fixed-length")
                    if mod in want_divisor:
                        md = [x.decode() for x in g["mean_divisor"][()]]
                        check(md == [want_divisor[mod]] * len(feats),
                              f"{mod} b{k} r{r}: mean_divisor {md}")
                    if "module_output" in g:
                        mo = g["module_output"][()]
                        want = expected_module_output(g, info, feats)
                        ok = mo.shape == want.shape and np.array_equal(mo, want)
                        if mod == "fpm" and positions_divisor:
                            # A rank-batch whose MEAN bags are all empty divides alike.
                            fpm_same.append(ok)
                            ok = mo.shape == want.shape
                        check(ok, f"{mod} b{k} r{r}: module_output is TorchRec's mean "
                              f"pooling per the contract (max diff "
                              f"{np.abs(mo - want).max() if mo.shape == want.shape else mo.shape})")
                        mean_checked += 1
                        if "stride_per_feature" in g:
                            check("inverse_indices" in g, f"{mod}: VBE inverse_indices")
            if mod == "ecv":  # an EC's VBE input is padded before the RW input dist
                g = f["batches/0/rank0"]
                check("stride_per_feature" not in g and g["lengths"].size == 2 * 3,
                      "ecv: the captured KJT is the padded one (F x B_full bags)")
            if mod == "fp":
                w = np.concatenate([f[f"batches/{k}/rank{r}/weights"][()]
                                    for k in range(nb) for r in range(3)])
                check(set(np.unique(w)) <= {0.25, 0.5, 1.0, 2.0} and 0.5 in w,
                      f"fp: processed position weights recorded {np.unique(w)}")
        for ctx in ("captured", "derived"):
            r = replay(path, "--ctx", ctx, "--max-mismatches", "2")
            if mod == "fpm" and positions_divisor:
                check(r.returncode == 1 and "feature g0: module output = sums / (Σ weights "
                      "at the input dist" in r.stdout and "MEAN expects the id count"
                      in r.stdout and "feature g1" not in r.stdout,
                      f"replay {mod}.h5 --ctx {ctx}: exit {r.returncode}, want 1 naming "
                      f"the positions divisor of g0\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
                continue
            check(r.returncode == 0, f"replay {mod}.h5 --ctx {ctx}: exit {r.returncode}, "
                  f"want 0\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
    if positions_divisor:
        check(fpm_same and not all(fpm_same),
              f"fpm: some module_output differs from the id-count division ({fpm_same})")
    expect_mean = 36 if "--no-vbe-mean" not in extra else 27
    check(mean_checked == expect_mean,
          f"module_output checked in {mean_checked} rank-batches, want {expect_mean}")

    # The position-weighted capture with the positions as weights (what the KJT at the
    # input dist carries) is a lookup mismatch.
    bad = os.path.join(tmp, "fp-positions.h5")
    shutil.copy(os.path.join(out, "fp.h5"), bad)
    with h5py.File(bad, "r+") as f:
        for k in range(3):
            for r in range(3):
                g = f[f"batches/{k}/rank{r}"]
                ln = g["lengths"][()]
                pos = np.concatenate([np.arange(n) for n in ln] + [np.zeros(0)])
                g["weights"][...] = pos.astype(np.float32)
    r = replay(bad)
    check(r.returncode == 1 and "lookup" in r.stdout,
          f"fp with position weights: exit {r.returncode}, want 1 with a lookup mismatch")

    # One context fault, named.
    bad = os.path.join(tmp, "ec-fault.h5")
    shutil.copy(os.path.join(out, "ec.h5"), bad)
    with h5py.File(bad, "r+") as f:
        d = f["batches/1/rank2/ctx/input_splits"]
        a = d[()]
        i = int(np.flatnonzero(a > 0)[0])
        a[i] -= 1
        a[(i + 1) % a.size] += 1
        d[...] = a
    r = replay(bad)
    check(r.returncode == 1 and "input_splits" in r.stdout + r.stderr,
          f"planted input_splits fault: exit {r.returncode}, want 1 naming input_splits")

    verdict()


def test_failing_rank_leaves_no_temporaries(job_run):
    failing_job(job_run["tmp"], job_run["extra"])
    verdict()


def test_capture_overhead(job_run):
    job = json.load(open(os.path.join(job_run["out"], "job.json")))
    b = job["bench"]
    if b:
        over = b["captured_ms"] / b["plain_ms"] - 1
        print(f"capture overhead: plain {b['plain_ms']:.1f} ms/step, captured "
              f"{b['captured_ms']:.1f} ms/step ({over * 100:+.0f} %), {b['steps']} steps, W=3; "
              f"capture hooks on rank 0's training thread "
              f"{b['hook_ms_per_captured_step']:.2f} ms per captured step")
        with open("capture_overhead.json", "w") as fo:
            json.dump(dict(b, versions=job["versions"]), fo)
