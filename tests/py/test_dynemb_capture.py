#!/usr/bin/env python3
"""The dynemb_capture package (python/) in a simulated two-rank loop (numpy only, no torch), then
`dynemb-dist merge`, `replay` and `inspect` on the result.

The simulation is the worked example of docs/semantics.md §3.4 / §4.3 / §6.1 (sequence) and
§7.1 (pooled): W=2, F=2, B=2, f0 -> t0 (10 rows), f1 -> t1 (6 rows), D=2. Each rank's KJT,
context, local_embs and output are computed here by a small numpy model of the RW path and
asserted against the numbers printed in docs/semantics.md before they are written.
Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC (source root); cwd = build/tests.
Run by pytest: one test per part, each failing with every check of its own that failed.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

SRC = os.environ.get("DYNEMB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DYNEMB = os.environ.get("DYNEMB", "dynemb-dist")
sys.path.insert(0, os.path.join(SRC, "python"))
import dynemb_capture as dc  # noqa: E402
from dynemb_capture.capture import AsyncWriter  # noqa: E402
from dynemb_capture.writer import fmix64  # noqa: E402

import h5py  # noqa: E402
import pytest  # noqa: E402

W, F, B, D = 2, 2, 2, 2
ROWS = [10, 6]
BLK = [(r + W - 1) // W for r in ROWS]  # ceil rule, docs/semantics.md §2
# Inputs of §3.4: lengths key-major [f*B + b], values.
INPUT = {
    0: ([2, 1, 0, 3], [1, 7, 5, 4, 0, 2]),
    1: ([1, 2, 1, 0], [9, 0, 3, 5]),
}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def table(f):
    """E_f(g) = [100 f + g, 100 f + g + 0.5] (docs/semantics.md §6.1), [rows, D] float32."""
    g = np.arange(ROWS[f], dtype=np.float32)
    return np.stack([100 * f + g, 100 * f + g + 0.5], axis=1).astype(np.float32)


def bucketize(lengths, values):
    """block_bucketize_sparse_features, sequence=True (§3.2, §3.3)."""
    L = F * B
    off = np.concatenate([[0], np.cumsum(lengths)])
    dest = np.zeros(len(values), np.int64)
    local = np.zeros(len(values), np.int64)
    new_lengths = np.zeros(W * L, np.int64)
    for j in range(L):
        blk = BLK[j // B]
        for i in range(off[j], off[j + 1]):
            x = values[i]
            dest[i], local[i] = (x // blk, x % blk) if x < blk * W else (x % W, x // W)
            new_lengths[dest[i] * L + j] += 1
    cursor = np.concatenate([[0], np.cumsum(new_lengths)])[:-1].copy()
    new_values = np.zeros(len(values), np.int64)
    perm = np.zeros(len(values), np.int64)
    for j in range(L):
        for i in range(off[j], off[j + 1]):
            pos = cursor[dest[i] * L + j]
            cursor[dest[i] * L + j] += 1
            new_values[pos], perm[i] = local[i], pos
    return new_lengths, new_values, perm


def simulate():
    """Both ranks' KJT, sequence context, local_embs and outputs (sequence and pooled)."""
    L = F * B
    bk = {r: bucketize(np.array(INPUT[r][0]), np.array(INPUT[r][1])) for r in range(W)}
    ranks = {}
    for r in range(W):
        # What rank r receives from each source s: lengths [F][B] and values (s's order).
        recv_len = {s: bk[s][0][r * L : (r + 1) * L].reshape(F, B) for s in range(W)}
        seg = {}
        for s in range(W):
            ns = bk[s][0]
            start = int(ns[: r * L].sum())
            seg[s] = bk[s][1][start : start + int(ns[r * L : (r + 1) * L].sum())]
        # Recat (s, f) -> (f, s): lookup KJT lengths [F, sum_s B_s], values in (f, s, b) order.
        lad = np.concatenate([recv_len[s] for s in range(W)], axis=1)  # [F, W*B]
        vals, feat = [], []
        for f in range(F):
            for s in range(W):
                before = int(recv_len[s][:f].sum())
                n = int(recv_len[s][f].sum())
                vals += list(seg[s][before : before + n])
                feat += [f] * n
        # Lookup: global row = r * blk_f + local id.
        local_embs = np.stack([table(f)[r * BLK[f] + v] for f, v in zip(feat, vals)])
        ranks[r] = dict(
            input_splits=np.array([int(bk[r][0][d * L : (d + 1) * L].sum()) for d in range(W)]),
            output_splits=np.array([len(seg[s]) for s in range(W)]),
            batch_size_per_rank=np.array([B] * W),
            sparse_features_recat=np.array(
                [s * F + f for f in range(F) for s in range(W)], np.int32
            ),
            unbucketize_permute=bk[r][2],
            lengths_after_input_dist=lad,
            local_embs=local_embs.astype(np.float32),
            lookup_values=np.array(vals),
        )
    # Sequence output: rank s gets back its ids' rows in bucketized order, then out = recv[perm].
    for s in range(W):
        recv = []
        for r in range(W):
            # rows of rank r's local_embs that came from s, in s's (f, b, position) order
            rows, k = [], 0
            for f in range(F):
                for src in range(W):
                    n = int(ranks[r]["lengths_after_input_dist"][f, src * B : (src + 1) * B].sum())
                    if src == s:
                        rows += list(ranks[r]["local_embs"][k : k + n])
                    k += n
            recv += rows
        ranks[s]["output_seq"] = np.stack(recv)[ranks[s]["unbucketize_permute"]]
    # Pooled: local_embs rows (s, b) = partial sums over the ids rank r owns; reduce-scatter.
    for r in range(W):
        pl = np.zeros((W * B, F * D), np.float32)
        for s in range(W):
            lens, vals = np.array(INPUT[s][0]), np.array(INPUT[s][1])
            off = np.concatenate([[0], np.cumsum(lens)])
            for f in range(F):
                for b in range(B):
                    for i in range(off[f * B + b], off[f * B + b + 1]):
                        if vals[i] // BLK[f] == r:
                            pl[s * B + b, f * D : (f + 1) * D] += table(f)[vals[i]]
        ranks[r]["local_embs_pooled"] = pl
    for r in range(W):
        ranks[r]["output_pooled"] = sum(ranks[d]["local_embs_pooled"] for d in range(W))[
            r * B : (r + 1) * B
        ]
    return bk, ranks


def plan_text(module):
    t = [
        "format_version: 1",
        f"world_size: {W}",
        f"module: {module}",
        "tables:",
    ]
    for i, rows in enumerate(ROWS):
        t += [f"  - name: t{i}", f"    num_embeddings: {rows}", f"    embedding_dim: {D}",
              f"    features: [f{i}]"]
    return "\n".join(t) + "\n"


def run(*args, want=None):
    p = subprocess.run([DYNEMB, *args], capture_output=True, text=True)
    if want is not None and p.returncode != want:
        failures.append(f"{' '.join(args)}: exit {p.returncode}, want {want}")
        print(f"FAIL: dynemb-dist {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def write_ranks(tmp, module, ranks):
    plan = plan_text(module)
    paths = []
    for r in range(W):
        path = os.path.join(tmp, f"{module}-rank{r}.h5")
        w = dc.CaptureWriter(path, plan, W, r)
        if r == 0:
            for f in range(F):
                w.write_table(f"t{f}", table(f))
        ctx = {k: ranks[r][k] for k in ("batch_size_per_rank",)}
        if module == "sequence":
            for k in ("input_splits", "output_splits", "sparse_features_recat",
                      "unbucketize_permute", "lengths_after_input_dist"):
                ctx[k] = ranks[r][k]
            local, out = ranks[r]["local_embs"], ranks[r]["output_seq"]
        else:
            local, out = ranks[r]["local_embs_pooled"], ranks[r]["output_pooled"]
        ctx["variable_batch_per_feature"] = False
        lengths = np.array(INPUT[r][0], np.int32)
        values = np.array(INPUT[r][1], np.int64)
        # Two batches: the same KJT twice (the second exercises batch indexing in merge).
        for k in range(2):
            w.write_batch(k, lengths, values, ctx=ctx, local_embs=local, output=out, iteration=100 * k)
        w.close()
        check(os.path.exists(path) and not any(".tmp-" in n for n in os.listdir(tmp)),
              f"{module} rank {r}: renamed into place, no temp left")
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def sim():
    return simulate()


@pytest.fixture(scope="module")
def tmp():
    d = tempfile.mkdtemp(prefix="dynemb_capture_", dir=os.getcwd())
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def ranks(sim):
    return sim[1]


def verdict():
    """Fails the test with every failed check (each was printed as it failed)."""
    what = list(failures)
    failures.clear()
    assert not what, "\n".join(what)


def test_spec_numbers(sim):
    """The simulation reproduces the numbers of docs/semantics.md."""
    bk, ranks = sim
    # ---- the spec's numbers (docs/semantics.md §3.4, §4.3, §6.1, §7.1)
    check(bk[0][0].tolist() == [1, 0, 0, 2, 1, 1, 0, 1], "§3.4 rank0 new_lengths")
    check(bk[0][1].tolist() == [1, 0, 2, 2, 0, 1], "§3.4 rank0 new_values")
    check(bk[0][2].tolist() == [0, 3, 4, 5, 1, 2], "§3.4 rank0 unbucketize_permute")
    check(bk[1][0].tolist() == [0, 2, 0, 0, 1, 0, 1, 0], "§3.4 rank1 new_lengths")
    check(bk[1][1].tolist() == [0, 3, 4, 2], "§3.4 rank1 new_values")
    check(bk[1][2].tolist() == [2, 0, 1, 3], "§3.4 rank1 unbucketize_permute")
    check(ranks[0]["input_splits"].tolist() == [3, 3], "§4.3 rank0 input_splits")
    check(ranks[0]["output_splits"].tolist() == [3, 2], "§4.3 rank0 output_splits")
    check(ranks[1]["input_splits"].tolist() == [2, 2], "§4.3 rank1 input_splits")
    check(ranks[1]["output_splits"].tolist() == [3, 2], "§4.3 rank1 output_splits")
    check(ranks[0]["lengths_after_input_dist"].tolist() == [[1, 0, 0, 2], [0, 2, 0, 0]],
          "§4.3 rank0 lengths after recat")
    check(ranks[0]["lookup_values"].tolist() == [1, 0, 3, 0, 2], "§4.3 rank0 values")
    check(ranks[1]["lookup_values"].tolist() == [2, 0, 4, 1, 2], "§4.3 rank1 values")
    check(ranks[0]["sparse_features_recat"].tolist() == [0, 2, 1, 3], "§4.3 recat")
    check(ranks[0]["local_embs"][:, 0].tolist() == [1, 0, 3, 100, 102], "§6.1 rank0 local_embs")
    check(ranks[1]["local_embs"][:, 0].tolist() == [7, 5, 9, 104, 105], "§6.1 rank1 local_embs")
    check(ranks[0]["output_seq"][:, 0].tolist() == [1, 7, 5, 104, 100, 102], "§6.1 rank0 out")
    check(ranks[0]["output_seq"][:, 1].tolist() == [1.5, 7.5, 5.5, 104.5, 100.5, 102.5],
          "§6.1 rank0 out column 1")
    check(ranks[1]["output_seq"][:, 0].tolist() == [9, 0, 3, 105], "§6.1 rank1 out")
    check(ranks[0]["local_embs_pooled"].tolist()
          == [[1, 1.5, 0, 0], [0, 0, 202, 203], [0, 0, 0, 0], [3, 4, 0, 0]],
          "§7.1 rank0 pooled local_embs")
    check(ranks[0]["output_pooled"].tolist() == [[8, 9, 0, 0], [5, 5.5, 306, 307.5]],
          "§7.1 rank0 pooled out")
    check(ranks[1]["output_pooled"].tolist() == [[9, 9.5, 105, 105.5], [3, 4, 0, 0]],
          "§7.1 rank1 pooled out")
    verdict()


def test_rank_files_merge_inspect_replay(ranks, tmp):
    """Rank files written, merged (in any order), inspected and replayed; a wrong golden is exit 1."""
    for module in ("sequence", "pooled"):
        paths = write_ranks(tmp, module, ranks)
        with h5py.File(paths[1], "r") as f:
            check(int(f.attrs["rank"]) == 1 and f.attrs["format"] == "dynemb-dist-capture"
                  and int(f.attrs["format_version"]) == 1 and int(f.attrs["num_batches"]) == 2,
                  f"{module}: rank file root attributes")
            g = f["batches/0/rank1"]
            check(g["lengths"].dtype == np.int32 and g["values"].dtype == np.int64
                  and g["local_embs"].dtype == np.float32, f"{module}: dtypes")
            check(int(f["batches/1"].attrs["iteration"]) == 100, f"{module}: iteration attr")
            if module == "sequence":
                check(g["ctx/unbucketize_permute"][()].tolist() == [2, 0, 1, 3],
                      "rank1 ctx/unbucketize_permute stored")
                check(g["ctx/sparse_features_recat"].dtype == np.int32, "recat is int32")
        merged = os.path.join(tmp, f"{module}.h5")
        # Reversed order on purpose: merge places groups by the files' rank attribute.
        run("merge", paths[1], paths[0], "-o", merged, want=0)
        with h5py.File(merged, "r") as f:
            check(int(f.attrs["world_size"]) == 2 and int(f.attrs["num_batches"]) == 2
                  and "rank" not in f.attrs, f"{module}: merged root attributes")
            check(f["batches/1/rank0/output"][()].tolist()
                  == ranks[0]["output_seq" if module == "sequence" else "output_pooled"].tolist(),
                  f"{module}: merged output of rank 0")
            check(f["tables/t1/weight"].shape == (6, 2), f"{module}: merged /tables")
        p = run("inspect", merged, want=0)
        check("t0" in p.stdout or "f0" in p.stdout, f"{module}: inspect names the plan")
        run("replay", merged, want=0)
        run("replay", merged, "--ctx", "derived", want=0)
        # A wrong golden value must be a mismatch (exit 1), not a pass.
        bad = os.path.join(tmp, f"{module}-bad.h5")
        shutil.copy(merged, bad)
        with h5py.File(bad, "r+") as f:
            d = f["batches/0/rank1/output"]
            a = d[()]
            a[0, 0] += 1.0
            d[...] = a
        p = run("replay", bad, want=1)
        check("output" in p.stdout + p.stderr, f"{module}: replay names the output")
    verdict()


def test_merge_refuses(ranks, tmp):
    """merge refuses what does not fit together (exit 2, naming the file), leaving nothing."""
    for module in ("sequence", "pooled"):
        write_ranks(tmp, module, ranks)
    merged_seq = os.path.join(tmp, "sequence.h5")
    if not os.path.exists(merged_seq):
        run("merge", *[os.path.join(tmp, f"sequence-rank{r}.h5") for r in range(W)], "-o", merged_seq, want=0)
        # ---- merge refuses what does not fit together (exit 2, naming the file)
        seq = [os.path.join(tmp, f"sequence-rank{r}.h5") for r in range(W)]
        pool = [os.path.join(tmp, f"pooled-rank{r}.h5") for r in range(W)]
        out = os.path.join(tmp, "bad-merge.h5")
        p = run("merge", seq[0], seq[0], "-o", out, want=2)
        check("appears twice" in p.stderr and "sequence-rank0.h5" in p.stderr, "duplicate rank")
        p = run("merge", seq[0], "-o", out, want=2)
        check("no file for rank 1" in p.stderr, "missing rank")
        p = run("merge", seq[0], pool[1], "-o", out, want=2)
        check("plan" in p.stderr and "pooled-rank1.h5" in p.stderr, "plan mismatch")
        p = run("merge", merged_seq, seq[1], "-o", out, want=2)
        check("attribute rank" in p.stderr and "sequence.h5" in p.stderr, "not a rank file")
        check(not os.path.exists(out) and not any(".tmp-" in n for n in os.listdir(tmp)),
              "failed merges leave no output and no temp file")
        p = run("merge", seq[0], seq[1], "-o", merged_seq, want=2)
        check("exists" in p.stderr, "merge does not overwrite without --force")
    verdict()


def test_writer_refuses(tmp):
    """The writer refuses inconsistent input, naming the field."""
    # ---- the writer refuses inconsistent input, naming the field
    for kwargs, needle in (
        (dict(lengths=[1, 2], values=[1, 2]), "lengths: sum 3 != len(values) 2"),
        (dict(lengths=[1], values=[1], ctx={"input_splits": [1, 0, 0]}), "input_splits"),
        (dict(lengths=[1], values=[1], local_embs=np.zeros((1, 2))), "float64"),
    ):
        w = dc.CaptureWriter(os.path.join(tmp, "w.h5"), plan_text("sequence"), W, 0)
        try:
            w.write_batch(0, **kwargs)
            check(False, f"writer accepted {kwargs}")
        except dc.CaptureWriterError as e:
            check(needle in str(e), f"writer message '{e}' names '{needle}'")
        w.abort()
    check(not os.path.exists(os.path.join(tmp, "w.h5")), "aborted writer leaves nothing")
    verdict()


def test_large_datasets_and_bf16(tmp):
    """Large datasets chunked + deflate; duck-typed bfloat16 tensors."""
    # ---- large datasets: chunked (<= 1 MiB) + shuffle + deflate; duck-typed tensors,
    # bfloat16 stored as uint16 bits with attribute dtype = "bfloat16"
    class FakeBF16:  # what dynemb_capture sees of a torch.bfloat16 tensor
        dtype = "torch.bfloat16"

        def __init__(self, a):
            self.a = a

        def detach(self):
            return self

        def cpu(self):
            return self

        def float(self):
            return FakeF32(self.a)

    class FakeF32:
        def __init__(self, a):
            self.a = a

        def numpy(self):
            return self.a

    n = 300_000
    big = os.path.join(tmp, "big.h5")
    w = dc.CaptureWriter(big, plan_text("sequence"), W, 0, compression="gzip")
    vals = np.arange(n, dtype=np.int64) % 10
    emb = np.array([[1.5, -2.0]] * 3, np.float32)  # exact in bf16
    w.write_batch(0, np.array([n, 0, 0, 0], np.int64), vals, local_embs=FakeBF16(emb))
    w.close()
    with h5py.File(big, "r") as f:
        d = f["batches/0/rank0/values"]
        check(d.chunks is not None and np.prod(d.chunks) * 8 <= (1 << 20)
              and d.compression == "gzip" and d.shuffle, "large values chunked+deflate")
        check(np.array_equal(d[()], vals), "large values round-trip")
        e = f["batches/0/rank0/local_embs"]
        check(e.dtype == np.uint16 and e.attrs["dtype"] == "bfloat16", "bf16 as uint16 bits")
        back = (e[()].astype(np.uint32) << 16).view(np.float32)
        check(np.array_equal(back, emb), "bf16 bits decode to the values")
    verdict()


def test_keys_module_output_compress_file(tmp):
    """keys, module_output, inverse_indices; compress_file."""
    # ---- keys, module_output, inverse_indices; no compression by default; compress_file
    kp = os.path.join(tmp, "keys.h5")
    w = dc.CaptureWriter(kp, plan_text("pooled"), W, 0)
    vals = np.arange(20_000, dtype=np.int64) % 5          # 160 KB: large enough to compress
    lens = np.array([20_000, 0, 0, 0], np.int32)
    mo = np.ones((B, F * D), np.float32)
    w.write_batch(0, lens, vals, keys=["f0", "f1"], module_output=mo)
    w.write_batch(1, np.array([1, 1, 1, 1], np.int32), np.arange(4),
                  stride_per_feature=[2, 2], keys=["f0", "f1"],
                  module_output=np.zeros((3, F * D), np.float32),
                  inverse_indices=np.array([[0, 1, 1]] * 2, np.int64))
    for kwargs, needle in (
        (dict(keys=["f0", "f1", "f2"]), "keys: 3 features"),
        (dict(module_output=np.zeros((B, F * D))), "module_output: float64"),
        (dict(module_output=mo, stride_per_feature=[2, 2]), "inverse_indices: required"),
    ):
        try:
            w.write_batch(2, np.array([1, 1, 1, 1], np.int32), np.arange(4), **kwargs)
            check(False, f"writer accepted {kwargs}")
        except dc.CaptureWriterError as e:
            check(needle in str(e), f"writer message '{e}' names '{needle}'")
    w.close()
    with h5py.File(kp, "r") as f:
        k = f["batches/0/rank0/keys"]
        check(k.dtype == np.dtype("S2") and [x.decode() for x in k[()]] == ["f0", "f1"],
              "keys: fixed-length S2 byte strings in order")
        check(f["batches/0/rank0/values"].compression is None, "no compression by default")
        check(f["batches/1/rank0/inverse_indices"].dtype == np.int64
              and f["batches/1/rank0/inverse_indices"].shape == (2, 3), "inverse_indices")
    cz = os.path.join(tmp, "keys-gz.h5")
    dc.compress_file(kp, cz)
    with h5py.File(kp, "r") as a, h5py.File(cz, "r") as b:
        d = b["batches/0/rank0/values"]
        check(d.compression == "gzip" and d.shuffle and np.array_equal(d[()], vals),
              "compress_file: large dataset gzip + shuffle, same values")
        check(b["plan"][()] == a["plan"][()] and int(b.attrs["rank"]) == 0
              and np.array_equal(b["batches/0/rank0/keys"][()], a["batches/0/rank0/keys"][()]),
              "compress_file: plan, attributes and keys kept")
    verdict()


def test_async_writer_errors(tmp):
    """capture()'s writer thread: errors come back on close, no file left."""
    # The writer thread of capture(): errors come back on close, the file is not left.
    aw = AsyncWriter(
        dc.CaptureWriter(os.path.join(tmp, "async.h5"), plan_text("pooled"), W, 1))
    aw.write_batch(0, lengths=np.array([1, 0, 0, 0]), values=np.array([3]))
    aw.write_batch(1, lengths=np.array([2, 0, 0, 0]), values=np.array([3]))  # fails on the thread
    try:
        aw.close()
        check(False, "AsyncWriter.close() reports the thread's error")
    except dc.CaptureWriterError as e:
        check("lengths: sum 2" in str(e), f"AsyncWriter error: {e}")
    check(not os.path.exists(os.path.join(tmp, "async.h5")), "failed async writer leaves nothing")
    verdict()


def test_numpy_oracle():
    """The numpy oracle equals the C++ one on known values."""
    # ---- the numpy oracle equals the C++ one (lib/common/hash.hpp) on known values:
    # fmix64(0) = 0 (docs/semantics.md §10.2); values are multiples of 1/64 in [-2, 1.984375].
    check(int(fmix64(np.uint64(0))) == 0, "fmix64(0) == 0")
    check([int(x) % 4 for x in fmix64(np.array([1, 2, 3, 7, 12345], np.uint64))]
          == [0, 3, 2, 1, 1], "fmix64 % 4 reference values (§10.2)")
    o = dc.oracle_rows(1, 0, np.arange(1000), 8)
    check(o.dtype == np.float32 and o.min() >= -2 and o.max() <= 1.984375
          and np.all(o * 64 == np.round(o * 64)), "oracle range and 1/64 grid")
    verdict()
