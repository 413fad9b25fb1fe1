#!/usr/bin/env python3
"""Golden captures made by TorchRec itself: real row-wise (RW) sharding on the CPU (gloo).

A thin example on top of the dynemb_capture package: spawns W processes; each builds the same
EmbeddingCollection (sequence) or EmbeddingBagCollection (pooled) with row_wise() sharding for
every table, shards it with TorchRec (FBGEMM CPU TBE), fills its local shards with the hash64
oracle (dynemb_capture.fill_oracle), feeds its own KJT per batch inside
``dynemb_capture.capture(model, dir, batches=range(n))``, which records the KJT keys, the KJT at
the RW input dist, the sharding context, local_embs, the output dist's result and, for MEAN
tables, the module's final output; rank 0 merges. The tool then checks TorchRec's output
against an unsharded numpy reference from the oracle (exact) and copies the merged capture to
--out. Needs the venv of tools/requirements-torchrec.txt (see tools/README.md).

Example:
  /opt/torchrec-venv/bin/python tools/torchrec_capture.py --config ec -W 2 \
      --out fixtures/torchrec/ec-w2.h5 --dynemb build/dynemb-dist
"""

import argparse
import logging
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import dynemb_capture as dc  # noqa: E402

ORACLE_SEED = 20261202

# name -> (module, tables[(name, num_embeddings, dim, features[, pooling])], vbe)
# Row counts are chosen so that W=4 gives uneven ceil shards (10 -> 3,3,3,1; 7 -> 2,2,2,1)
# and one table serves two features. Pooling is SUM unless given.
_MEAN2 = [("t0", 10, 4, ["f0"], "MEAN"), ("t1", 7, 8, ["f1", "f2"], "MEAN")]
CONFIGS = {
    "ec": ("sequence", [("t0", 10, 4, ["f0"]), ("t1", 7, 4, ["f1", "f2"])], False),
    "ebc": ("pooled", [("t0", 10, 4, ["f0"]), ("t1", 7, 8, ["f1", "f2"])], False),
    "ebc-vbe": ("pooled", [("t0", 10, 4, ["f0"]), ("t1", 7, 8, ["f1", "f2"])], True),
    # Weighted KJT (per-id float weights, multiples of 1/4: every product and sum stays exact).
    "ebc-weighted": ("pooled", [("t0", 10, 4, ["f0"]), ("t1", 7, 8, ["f1", "f2"])], False),
    # MEAN: TorchRec's output dist returns the sums; the module divides them afterwards
    # (module_output). ebc-mean-sum mixes MEAN and SUM tables: module order f0 (MEAN), f1, f2
    # (SUM), f3 (MEAN) becomes f0, f3, f1, f2 in the RW sharding (grouped by pooling).
    "ebc-mean": ("pooled", _MEAN2, False),
    "ebc-mean-weighted": ("pooled", _MEAN2, False),
    "ebc-mean-vbe": ("pooled", _MEAN2, True),
    "ebc-mean-sum": ("pooled", [("t0", 10, 4, ["f0"], "MEAN"), ("t1", 7, 8, ["f1", "f2"], "SUM"),
                                ("t2", 5, 4, ["f3"], "MEAN")], False),
}
WEIGHTED = {"ebc-weighted", "ebc-mean-weighted"}


def _tables(config):
    """(name, rows, dim, features, pooling) of a config, in module order."""
    return [(t[0], t[1], t[2], t[3], t[4] if len(t) > 4 else "SUM") for t in CONFIGS[config][1]]


def make_batch(config, rank, k, world_size, seed):
    """This rank's input for batch k: per-feature (batch size, bags of ids).

    Batch 1 gives the last rank a smaller batch (variable batch per rank: expanded recat,
    reduce-scatter-v, docs/semantics.md §4.3); with VBE every feature gets its own batch size
    (§1, §7.2).
    """
    module, _, vbe = CONFIGS[config]
    rng = np.random.default_rng([seed, rank, k])
    feats = [(f, rows) for _, rows, _, fs, _ in _tables(config) for f in fs]
    B = 3
    if k == 1 and rank == world_size - 1:
        B = 2
    out = []
    for fi, (f, rows) in enumerate(feats):
        Bf = B if not vbe else int(rng.integers(1, 4))
        bags = []
        for _ in range(Bf):
            n = int(rng.integers(0, 4))  # 0..3 ids, empty bags included
            bags.append(rng.integers(0, rows, size=n).astype(np.int64))
        out.append((f, Bf, bags))
    return out


def bag_weights(config, rank, k, seed, n):
    """Per-id weights of a weighted config (None otherwise): multiples of 1/4 in [0.25, 2]."""
    if config not in WEIGHTED:
        return None
    rng = np.random.default_rng([seed, rank, k, 99])
    return (rng.integers(1, 9, size=n) / 4.0).astype(np.float32)


def reference_output(config, spec, plan_tables, weights=None):
    """The unsharded answer from the oracle alone (numpy), to check TorchRec's golden.

    spec is in module feature order; plan_tables [(table, features)] is the exported plan's
    order (the oracle's table index and the output's column order). sequence: [N, D], row i =
    E_t(values[i]) in the KJT's id order; pooled: [B, sum_D] per-bag sums (undivided, also for
    MEAN: what the output dist returns); pooled VBE: 1-D [f][b < B_f][d < D_f]. Returns
    (output, per-feature bag sums {f: [B_f, D]}).
    """
    module, _, vbe = CONFIGS[config]
    dims = {f: d for _, _, d, fs, _ in _tables(config) for f in fs}
    tindex = {f: ti for ti, (_, fs) in enumerate(plan_tables) for f in fs}
    order = [f for _, fs in plan_tables for f in fs]
    wpos, pos = {}, 0  # weights are in module feature order, like the spec's bags
    for f, _, bags in spec:
        n = sum(len(ids) for ids in bags)
        wpos[f] = pos
        pos += n
    by_f = {f: (bf, bags) for f, bf, bags in spec}
    if module == "sequence":
        rows = [dc.oracle_rows(ORACLE_SEED, tindex[f], ids, dims[f])
                for f in order for ids in by_f[f][1]]
        return np.concatenate(rows + [np.zeros((0, dims[order[0]]), np.float32)]), None
    pooled = {}
    for f in order:
        bf, bags = by_f[f]
        p, sums = wpos[f], []
        for ids in bags:
            e = dc.oracle_rows(ORACLE_SEED, tindex[f], ids, dims[f])
            if weights is not None:
                e = e * weights[p : p + len(ids), None]
            p += len(ids)
            sums.append(e.sum(0))
        pooled[f] = np.stack(sums).astype(np.float32) if bf else np.zeros((0, dims[f]), np.float32)
    if vbe:
        return np.concatenate([pooled[f].reshape(-1) for f in order]).astype(np.float32), pooled
    return np.concatenate([pooled[f] for f in order], axis=1).astype(np.float32), pooled


def rank_inputs(config, rank, W, batches, seed):
    """Per batch: (spec, lengths, values, weights, vbe (strides, inverse indices) or None)."""
    module, _, vbe = CONFIGS[config]
    out = []
    for k in range(batches):
        spec = make_batch(config, rank, k, W, seed)
        # Sequence KJTs carry int64 lengths, pooled ones int32 (both dtypes are in the format).
        ldtype = np.int64 if module == "sequence" else np.int32
        lengths = np.array([len(b) for _, _, bags in spec for b in bags], dtype=ldtype)
        values = np.concatenate([np.concatenate(bags) if bags else np.zeros(0, np.int64)
                                 for _, _, bags in spec] + [np.zeros(0, np.int64)])
        v = None
        if vbe:
            # inverse_indices: the full batch B_full=3 maps onto each feature's B_f samples.
            v = ([[bf] for _, bf, _ in spec],
                 np.array([[b % bf for b in range(3)] for _, bf, _ in spec], np.int64))
        out.append((spec, lengths, values, bag_weights(config, rank, k, seed, values.size), v))
    return out


def run_rank(rank, args, tmpdir):
    import torch
    import torch.distributed as dist

    logging.getLogger().setLevel(logging.ERROR)
    import torchrec
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.shard import shard_modules
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    W = args.world_size
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=W)
    torch.manual_seed(0)
    module, _, vbe = CONFIGS[args.config]
    tables = _tables(args.config)
    feature_names = [f for _, _, _, fs, _ in tables for f in fs]
    if module == "sequence":
        cfgs = [
            torchrec.EmbeddingConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=fs)
            for n, r, d, fs, _ in tables
        ]
        m = torchrec.EmbeddingCollection(tables=cfgs, device=torch.device("cpu"))
        sharder = EmbeddingCollectionSharder()
    else:
        cfgs = [
            torchrec.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d,
                                        feature_names=fs, pooling=getattr(torchrec.PoolingType, p))
            for n, r, d, fs, p in tables
        ]
        m = torchrec.EmbeddingBagCollection(
            tables=cfgs, is_weighted=args.config in WEIGHTED, device=torch.device("cpu")
        )
        sharder = EmbeddingBagCollectionSharder()

    class Top(torch.nn.Module):
        def __init__(self, emb):
            super().__init__()
            self.emb = emb

    model = Top(m)
    mplan = construct_module_sharding_plan(
        m,
        per_param_sharding={n: row_wise(compute_kernel=args.kernel) for n, *_ in tables},
        sharder=sharder,
        local_size=W,
        world_size=W,
        device_type="cpu",
    )
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    model = shard_modules(model, env=env, plan=ShardingPlan({"emb": mplan}),
                          device=torch.device("cpu"), sharders=[sharder])
    dc.fill_oracle(model, ORACLE_SEED)

    with dc.capture(model, tmpdir, batches=range(args.batches), dynemb=args.dynemb,
                    oracle_seed=ORACLE_SEED, merge_compression=None):
        for spec, lengths, values, wts, v in rank_inputs(args.config, rank, W, args.batches,
                                                         args.seed):
            kw = {}
            if v is not None:
                kw = dict(stride_per_key_per_rank=v[0],
                          inverse_indices=(feature_names, torch.from_numpy(v[1])))
            if wts is not None:
                kw["weights"] = torch.from_numpy(wts)
            kjt = KeyedJaggedTensor(keys=feature_names, values=torch.from_numpy(values),
                                    lengths=torch.from_numpy(lengths), **kw)
            res = model.emb(kjt)
            if module == "sequence":
                _ = {f: jt.values() for f, jt in res.items()}  # waits on the lazy awaitable
            else:
                _ = res.values()
    dist.barrier()
    dist.destroy_process_group()


def check_merged(path, args):
    """TorchRec's goldens against the oracle's unsharded answer (exact: multiples of 1/64,
    weights multiples of 1/4), and module_output against output / the contract's divisor."""
    import h5py

    W = args.world_size
    with h5py.File(path, "r") as f:
        plan = f["plan"][()].decode()
        plan_tables, cur = [], None
        for line in plan.splitlines():
            if line.startswith("  - name: "):
                cur = line.split(": ", 1)[1]
            if line.strip().startswith("features: ["):
                fs = [x.strip() for x in line.split("[", 1)[1].rstrip("]").split(",")]
                plan_tables.append((cur, fs))
        pooling = {f: p for _, _, _, fs, p in _tables(args.config) for f in fs}
        order = [f for _, fs in plan_tables for f in fs]
        has_mean = "MEAN" in pooling.values()
        for rank in range(W):
            for k, (spec, lengths, values, wts, v) in enumerate(
                    rank_inputs(args.config, rank, W, args.batches, args.seed)):
                g = f[f"batches/{k}/rank{rank}"]
                keys = [x.decode() for x in g["keys"][()]]
                if keys != order:
                    raise SystemExit(f"rank {rank} batch {k}: keys {keys} != plan order {order}")
                want, pooled = reference_output(args.config, spec, plan_tables, wts)
                got = g["output"][()]
                if got.shape != want.shape or not np.array_equal(got, want):
                    raise SystemExit(f"rank {rank} batch {k}: TorchRec output != oracle "
                                     f"reference (shape {got.shape} vs {want.shape})")
                if not has_mean:
                    continue
                # module_output = sums / (bag length or weight sum for MEAN, 1 for SUM) + 1e-6
                B_full = v[1].shape[1] if v is not None else spec[0][1]
                cols, wp = [], {}
                p = 0
                for fname, _, bags in spec:
                    wp[fname] = p
                    p += sum(len(b) for b in bags)
                bags_of = {fname: bags for fname, _, bags in spec}
                for fi, fname in enumerate(order):
                    bags = bags_of[fname]
                    idx = (v[1][feature_index(spec, fname)] if v is not None
                           else np.arange(B_full))
                    if wts is not None:
                        q, lens = wp[fname], []
                        for b in bags:
                            lens.append(wts[q:q + len(b)].sum(dtype=np.float32))
                            q += len(b)
                        lens = np.array(lens, np.float32)
                    else:
                        lens = np.array([len(b) for b in bags], np.float32)
                    div = (lens[idx] if pooling[fname] == "MEAN"
                           else np.ones(B_full, np.float32)) + np.float32(1e-6)
                    cols.append(pooled[fname][idx] / div[:, None])
                want_mo = np.concatenate(cols, axis=1).astype(np.float32)
                mo = g["module_output"][()]
                if mo.shape != want_mo.shape or not np.array_equal(mo, want_mo):
                    raise SystemExit(f"rank {rank} batch {k}: module_output != output / divisor")
                if v is not None and not np.array_equal(
                        g["inverse_indices"][()],
                        v[1][[feature_index(spec, x) for x in order]]):
                    raise SystemExit(f"rank {rank} batch {k}: inverse_indices")


def feature_index(spec, name):
    return [x[0] for x in spec].index(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), required=True)
    ap.add_argument("-W", "--world-size", type=int, default=2)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--kernel", default="fused", help="TorchRec compute kernel (fused|dense)")
    ap.add_argument("--out", required=True, help="merged capture to write")
    ap.add_argument("--dynemb", default="dynemb-dist", help="dynemb-dist binary (for merge)")
    ap.add_argument("--keep-rank-files", help="directory to keep emb/rank<r>.h5 in")
    args = ap.parse_args()

    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:  # a free loopback port for the gloo rendezvous
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    with tempfile.TemporaryDirectory() as tmpdir:
        d = args.keep_rank_files or tmpdir
        os.makedirs(d, exist_ok=True)
        mp.spawn(run_rank, args=(args, d), nprocs=args.world_size, join=True)
        merged = os.path.join(d, "emb.h5")  # written by rank 0 at the end of capture()
        check_merged(merged, args)
        shutil.copy(merged, args.out)


if __name__ == "__main__":
    main()
