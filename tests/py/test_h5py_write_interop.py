"""Writes captures with h5py + numpy straight from capture-format.md (no project code):
h5py's defaults (variable-length UTF-8 strings, int64 attributes), int32 lengths, a dense
weight table, weighted pooled KJTs, and output goldens computed here from the hash64 oracle
formula. Then `inspect` and `replay` (and `validate --capture` once that is wired) must accept
them with exit 0; a capture whose lengths do not sum to the ids must give exit 2 naming the
HDF5 path."""
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError as e:
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


SEQ_PLAN = """format_version: 1
world_size: 2
module: sequence
comm_precision: fp32
tables:
  - name: t0
    num_embeddings: 10
    embedding_dim: 4
    data_type: fp32
    features: [f0]
  - name: t1
    num_embeddings: 6
    embedding_dim: 4
    data_type: fp32
    features: [f1]
"""

POOLED_PLAN = """format_version: 1
world_size: 2
module: pooled
comm_precision: fp32
tables:
  - name: a
    num_embeddings: 9
    embedding_dim: 3
    data_type: fp32
    features: [fa]
  - name: b
    num_embeddings: 5
    embedding_dim: 2
    data_type: fp32
    features: [fb]
"""


def write_root(f, plan, W, nb, seed):
    f.attrs["format"] = "dynemb-dist-capture"  # h5py: variable-length UTF-8
    f.attrs["format_version"] = 1
    f.attrs["world_size"] = W
    f.attrs["num_batches"] = nb
    f["plan"] = plan
    if seed is not None:
        o = f.create_group("oracle")
        o.attrs["kind"] = "hash64"
        o.attrs["seed"] = np.uint64(seed)


def write_sequence(path, seed, break_sum=False):
    # docs/semantics.md §3.4 inputs: rank0 lengths [2,1,0,3] values [1,7,5,4,0,2];
    # rank1 lengths [1,2,1,0] values [9,0,3,5]. Sequence output row i = E_f(values[i]).
    kjts = [([2, 1, 0, 3], [1, 7, 5, 4, 0, 2]), ([1, 2, 1, 0], [9, 0, 3, 5])]
    with h5py.File(path, "w") as f:
        write_root(f, SEQ_PLAN, 2, 1, seed)
        for r, (lengths, values) in enumerate(kjts):
            g = f.create_group(f"batches/0/rank{r}")
            g["lengths"] = np.array(lengths, dtype=np.int32)  # int32 lengths are allowed
            v = values[:-1] if (break_sum and r == 1) else values
            g["values"] = np.array(v, dtype=np.int64)
            feat = np.repeat(np.repeat([0, 1], 2), lengths)
            g["output"] = np.stack([oracle_row(seed, int(feat[i]), v, 4)
                                    for i, v in enumerate(values)])


def write_pooled(path, seed):
    # B = 2 on each rank; weights k/4 keep the weighted sums exact in float32.
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as f:
        write_root(f, POOLED_PLAN, 2, 1, seed)
        # a dense weight table for b (dtype = its data_type): weights win over the oracle
        wb = (rng.integers(-128, 128, size=(5, 2)) / 64.0).astype(np.float32)
        f.create_dataset("tables/b/weight", data=wb)
        for r in range(2):
            lengths = rng.integers(0, 4, size=4)
            n = int(lengths.sum())
            values = np.concatenate([rng.integers(0, 9, size=int(lengths[:2].sum())),
                                     rng.integers(0, 5, size=int(lengths[2:].sum()))])
            weights = (rng.integers(0, 9, size=n) / 4.0).astype(np.float32)
            g = f.create_group(f"batches/0/rank{r}")
            g.create_dataset("lengths", data=lengths.astype(np.int64))
            g.create_dataset("values", data=values.astype(np.int64))
            g.create_dataset("weights", data=weights)
            out = np.zeros((2, 5), dtype=np.float32)
            offs = np.concatenate([[0], np.cumsum(lengths)])
            for fi, (col, dim) in enumerate([(0, 3), (3, 2)]):
                for b in range(2):
                    j = fi * 2 + b
                    for p in range(offs[j], offs[j + 1]):
                        row = (oracle_row(seed, 0, int(values[p]), 3) if fi == 0
                               else wb[int(values[p])].astype(np.float32))
                        out[b, col:col + dim] += weights[p] * row
            g.create_dataset("output", data=out)


def run(args):
    p = subprocess.run([os.environ["DYNEMB"]] + args, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def main():
    fails = []
    with tempfile.TemporaryDirectory() as d:
        seq = os.path.join(d, "seq.h5")
        pooled = os.path.join(d, "pooled.h5")
        write_sequence(seq, 12345)
        write_pooled(pooled, 2 ** 63 + 5)  # a seed above int64's range
        for path, plan_text in ((seq, SEQ_PLAN), (pooled, POOLED_PLAN)):
            name = os.path.basename(path)
            plan = os.path.join(d, name + ".yaml")
            with open(plan, "w") as f:
                f.write(plan_text)
            rc, out, err = run(["inspect", path])
            if rc != 0:
                fails.append(f"inspect {name}: exit {rc}: {err.strip()}")
            elif "oracle       hash64" not in out:
                fails.append(f"inspect {name}: no oracle line in:\n{out}")
            else:
                print(f"inspect {name}: exit 0")
            rc, out, err = run(["validate", plan, "--capture", path])
            if rc != 0:
                fails.append(f"validate {name} --capture: exit {rc}: {out}{err}")
            else:
                print(f"validate --capture {name}: exit 0")
            rc, out, err = run(["replay", path, "--backend", "cpu"])
            if rc != 0:
                fails.append(f"replay {name}: exit {rc} (golden written by h5py from the "
                             f"oracle formula must match):\n{out[-3000:]}{err}")
            else:
                print(f"replay {name}: exit 0 (our output dist matches the h5py golden)")
        # The golden is really compared: one element off by 1/64 must be a mismatch (exit 1).
        off = os.path.join(d, "off.h5")
        write_sequence(off, 12345)
        with h5py.File(off, "r+") as f:
            o = f["batches/0/rank1/output"]
            row = o[2]
            row[1] += 1.0 / 64
            o[2] = row
        rc, out, err = run(["replay", off, "--backend", "cpu"])
        if rc != 1:
            fails.append(f"replay off.h5: want exit 1 for a golden off by 1/64, got {rc}")
        else:
            print("replay off.h5: exit 1 (a golden off by 1/64 is found)")
        bad = os.path.join(d, "bad.h5")
        write_sequence(bad, 1, break_sum=True)
        rc, out, err = run(["inspect", bad])
        want = "/batches/0/rank1/lengths: sum 4 != len(values) 3"
        if rc != 2 or want not in err:
            fails.append(f"inspect bad.h5: want exit 2 and '{want}', got {rc}: {err.strip()}")
        else:
            print(f"inspect bad.h5: exit 2, {err.strip()}")
    for m in fails:
        print("FAIL:", m)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
