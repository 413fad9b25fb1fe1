"""Reads a capture written by `dynemb-dist synth` with h5py + numpy only (no project code) and
recomputes output rows from the hash64 oracle formula of capture-format.md: sequence output
row i of rank r is the oracle row of id values[i] of its feature's table, bit-exact in fp32;
pooled output rows are exact sums of such rows. Also checks the layout capture-format.md promises."""
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError as e:  # a real absence: this Python has no h5py
    print(f"skipped: {e}")
    sys.exit(77)

M64 = (1 << 64) - 1


def fmix64(k):
    k &= M64
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    k ^= k >> 33
    return k


def oracle_row(seed, t, g, dim):
    h0 = fmix64((seed + 0x9E3779B97F4A7C15 * (t + 1)) & M64)
    h1 = fmix64(h0 ^ (g & M64))
    return np.array([(((fmix64(h1 + c) >> 56) & 0xFF) - 128) / 64.0 for c in range(dim)],
                    dtype=np.float32)


def as_str(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def plan_features(plan_text):
    """(feature -> table index, dim) from the plan YAML, without a YAML library: the preset
    plans list one table per '- name:' block with 'embedding_dim' and 'features: [..]'."""
    tables = []
    for line in plan_text.splitlines():
        s = line.split("#")[0].strip()
        if s.startswith("- name:"):
            tables.append({"dim": None, "features": []})
        elif s.startswith("embedding_dim:") and tables:
            tables[-1]["dim"] = int(s.split(":")[1])
        elif s.startswith("features:") and tables:
            tables[-1]["features"] = [f.strip() for f in s.split("[")[1].split("]")[0].split(",")]
    feats = []
    for t, tb in enumerate(tables):
        for f in tb["features"]:
            feats.append((f, t, tb["dim"]))
    return feats


def main():
    exe = os.environ["DYNEMB"]
    failures = []
    with tempfile.TemporaryDirectory() as d:
        # --- sequence: every output row is the oracle row of its id --------------------
        path = os.path.join(d, "seq.h5")
        subprocess.run([exe, "synth", "--preset", "unit-seq-w2", "-o", path, "--seed", "7",
                        "--batches", "2", "--store", "ctx,local_embs,output"], check=True,
                       stdout=subprocess.DEVNULL)
        with h5py.File(path, "r") as f:
            assert as_str(f.attrs["format"]) == "dynemb-dist-capture", f.attrs["format"]
            assert int(f.attrs["format_version"]) == 1
            W = int(f.attrs["world_size"])
            assert W == 2 and int(f.attrs["num_batches"]) == 2
            assert as_str(f["oracle"].attrs["kind"]) == "hash64"
            seed = int(f["oracle"].attrs["seed"])
            assert seed == 7, seed
            feats = plan_features(as_str(f["plan"][()]))
            assert [x[0] for x in feats] == ["f0", "f1", "f2", "f3"], feats
            F = len(feats)
            checked = 0
            for k in range(2):
                for r in range(W):
                    g = f[f"batches/{k}/rank{r}"]
                    lengths = g["lengths"][()]
                    values = g["values"][()]
                    out = g["output"][()]
                    assert lengths.dtype == np.int64 and values.dtype == np.int64
                    assert lengths.shape == (F * 8,), lengths.shape
                    assert int(lengths.sum()) == values.shape[0]
                    assert out.dtype == np.float32 and out.shape == (values.shape[0], 128)
                    ctx = g["ctx"]
                    assert ctx["input_splits"].shape == (W,)
                    assert ctx["sparse_features_recat"].dtype == np.int32
                    assert ctx["unbucketize_permute"].shape == values.shape
                    assert int(ctx["output_splits"][()].sum()) == g["local_embs"].shape[0]
                    # feature of every id: key-major lengths
                    feat_of = np.repeat(np.repeat(np.arange(F), 8), lengths)
                    # a few rows per rank: first, last and some in between
                    n = values.shape[0]
                    for i in sorted(set([0, n // 3, n // 2, n - 1])):
                        fname, t, dim = feats[feat_of[i]]
                        want = oracle_row(seed, t, int(values[i]), dim)
                        if not np.array_equal(out[i], want):
                            failures.append(f"seq batch {k} rank {r} row {i} ({fname} id "
                                            f"{values[i]}): got {out[i][:4]} want {want[:4]}")
                        checked += 1
            print(f"sequence: {checked} output rows equal the oracle bit for bit")

        # --- pooled: output[b, cols of f] = sum of the oracle rows of bag (f, b) -------
        path = os.path.join(d, "pooled.h5")
        subprocess.run([exe, "synth", "--preset", "unit-pooled-w8", "-o", path, "--seed", "3",
                        "--batch-size", "4", "--store", "output"], check=True,
                       stdout=subprocess.DEVNULL)
        with h5py.File(path, "r") as f:
            seed = int(f["oracle"].attrs["seed"])
            feats = plan_features(as_str(f["plan"][()]))
            F = len(feats)
            W = int(f.attrs["world_size"])
            checked = 0
            for r in (0, W - 1):
                g = f[f"batches/0/rank{r}"]
                assert "ctx" not in g and "local_embs" not in g
                lengths = g["lengths"][()]
                values = g["values"][()]
                out = g["output"][()]
                B = lengths.shape[0] // F
                assert out.shape == (B, sum(x[2] for x in feats)), out.shape
                offs = np.concatenate([[0], np.cumsum(lengths)])
                for b in range(B):
                    col = 0
                    for fi, (fname, t, dim) in enumerate(feats):
                        j = fi * B + b
                        want = np.zeros(dim, dtype=np.float32)
                        for p in range(offs[j], offs[j + 1]):
                            want += oracle_row(seed, t, int(values[p]), dim)
                        if not np.array_equal(out[b, col:col + dim], want):
                            failures.append(f"pooled rank {r} sample {b} {fname}: got "
                                            f"{out[b, col:col + 4]} want {want[:4]}")
                        col += dim
                        checked += 1
            print(f"pooled: {checked} (sample, feature) sums equal the oracle sums exactly")
    for m in failures[:20]:
        print("FAIL:", m)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
