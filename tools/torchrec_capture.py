#!/usr/bin/env python3
"""Golden captures made by TorchRec itself: real row-wise (RW) sharding on the CPU (gloo).

Spawns W processes; each builds the same EmbeddingCollection (sequence) or
EmbeddingBagCollection (pooled) with row_wise() sharding for every table, shards it with
TorchRec (ShardedEmbeddingCollection / ShardedEmbeddingBagCollection, FBGEMM CPU TBE),
overwrites its local weight shards with the hash64 oracle (capture-format.md), feeds its own
KJT per batch, and records through python/dynemb_capture.py:

  * the per-sharding KJT as it enters RwSparseFeaturesDist (lengths, values, strides),
  * the real sharding context (SequenceShardingContext / EmbeddingShardingContext),
  * local_embs as the lookup handed them to the output dist, and
  * the output dist's real result (RwSequenceEmbeddingDist / RwPooledEmbeddingDist).

Each rank writes rank<r>.h5; rank 0 then runs `dynemb-dist merge` when --dynemb is given.
Needs the venv of tools/requirements-torchrec.txt (see tools/README.md).

Example:
  /opt/torchrec-venv/bin/python tools/torchrec_capture.py --config ec -W 2 \
      --out fixtures/torchrec/ec-w2.h5 --dynemb build/dynemb-dist
"""

import argparse
import logging
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import dynemb_capture as dc  # noqa: E402

ORACLE_SEED = 20261202

# name -> (module, tables[(name, num_embeddings, dim, features)], vbe)
# Row counts are chosen so that W=4 gives uneven ceil shards (10 -> 3,3,3,1; 7 -> 2,2,2,1)
# and one table serves two features.
CONFIGS = {
    "ec": ("sequence", [("t0", 10, 4, ["f0"]), ("t1", 7, 4, ["f1", "f2"])], False),
    "ebc": ("pooled", [("t0", 10, 4, ["f0"]), ("t1", 7, 8, ["f1", "f2"])], False),
    "ebc-vbe": ("pooled", [("t0", 10, 4, ["f0"]), ("t1", 7, 8, ["f1", "f2"])], True),
    # Weighted KJT (per-id float weights, multiples of 1/4: every product and sum stays exact).
    "ebc-weighted": ("pooled", [("t0", 10, 4, ["f0"]), ("t1", 7, 8, ["f1", "f2"])], False),
}
WEIGHTED = {"ebc-weighted"}


def plan_yaml(config, world_size):
    module, tables, _ = CONFIGS[config]
    lines = [
        "format_version: 1",
        f"world_size: {world_size}",
        f"module: {module}",
        "comm_precision: fp32",
        "tables:",
    ]
    for name, rows, dim, feats in tables:
        lines += [
            f"  - name: {name}",
            f"    num_embeddings: {rows}",
            f"    embedding_dim: {dim}",
            "    data_type: fp32",
        ]
        if module == "pooled":
            lines.append("    pooling: sum")
        lines += ["    dist_type: continuous", f"    features: [{', '.join(feats)}]"]
    return "\n".join(lines) + "\n"


def make_batch(config, rank, k, world_size, seed):
    """This rank's input for batch k: per-feature (batch size, bags of ids).

    Batch 1 gives the last rank a smaller batch (variable batch per rank, docs/semantics.md §4.3);
    with VBE every feature gets its own batch size (§1, §7.2).
    """
    module, tables, vbe = CONFIGS[config]
    rng = np.random.default_rng([seed, rank, k])
    feats = [(f, rows) for _, rows, _, fs in tables for f in fs]
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


def reference_output(config, spec, weights=None):
    """The unsharded answer from the oracle alone (numpy), to check TorchRec's golden.

    sequence: [N, D], row i = E_t(values[i]); pooled: [B, sum_D] per-bag sums;
    pooled VBE: 1-D [f][b < B_f][d < D_f] (docs/semantics.md §6, §7.1, §7.2).
    """
    module, tables, vbe = CONFIGS[config]
    tab = [(ti, dim) for ti, (_, _, dim, fs) in enumerate(tables) for _ in fs]
    if module == "sequence":
        rows = [dc.oracle_rows(ORACLE_SEED, tab[fi][0], ids, tab[fi][1])
                for fi, (_, _, bags) in enumerate(spec) for ids in bags]
        return np.concatenate(rows + [np.zeros((0, tables[0][2]), np.float32)])
    pooled = []  # per feature: [B_f, D_f]
    pos = 0
    for fi, (_, bf, bags) in enumerate(spec):
        t, dim = tab[fi]
        sums = []
        for ids in bags:
            e = dc.oracle_rows(ORACLE_SEED, t, ids, dim)
            if weights is not None:
                e = e * weights[pos : pos + len(ids), None]
            pos += len(ids)
            sums.append(e.sum(0))
        pooled.append(np.stack(sums) if bf else np.zeros((0, dim), np.float32))
    if vbe:
        return np.concatenate([p.reshape(-1) for p in pooled]).astype(np.float32)
    return np.concatenate(pooled, axis=1).astype(np.float32)


def run_rank(rank, args, tmpdir):
    import torch
    import torch.distributed as dist

    logging.getLogger().setLevel(logging.ERROR)
    import torchrec
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.shard import shard_modules
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
    from torchrec.distributed.types import NoWait, ShardingEnv, ShardingPlan
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    W = args.world_size
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=W)
    torch.manual_seed(0)
    module, tables, vbe = CONFIGS[args.config]
    feature_names = [f for _, _, _, fs in tables for f in fs]
    if module == "sequence":
        cfgs = [
            torchrec.EmbeddingConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=fs)
            for n, r, d, fs in tables
        ]
        m = torchrec.EmbeddingCollection(tables=cfgs, device=torch.device("cpu"))
        sharder = EmbeddingCollectionSharder()
    else:
        cfgs = [
            torchrec.EmbeddingBagConfig(
                name=n,
                num_embeddings=r,
                embedding_dim=d,
                feature_names=fs,
                pooling=torchrec.PoolingType.SUM,
            )
            for n, r, d, fs in tables
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
        per_param_sharding={n: row_wise(compute_kernel=args.kernel) for n, _, _, _ in tables},
        sharder=sharder,
        local_size=W,
        world_size=W,
        device_type="cpu",
    )
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    model = shard_modules(
        model,
        env=env,
        plan=ShardingPlan({"emb": mplan}),
        device=torch.device("cpu"),
        sharders=[sharder],
    )
    sm = model.emb

    # Oracle weights into this rank's RW shard: rows [row_offset, row_offset + rows).
    tidx = {n: i for i, (n, _, _, _) in enumerate(tables)}
    with torch.no_grad():
        for key, val in sm.state_dict().items():
            name = key.split(".")[-2]  # embeddings.<t>.weight / embedding_bags.<t>.weight
            for shard in val.local_shards():
                off, rows = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
                if rows == 0:
                    continue
                dim = shard.metadata.shard_sizes[1]
                w = dc.oracle_rows(ORACLE_SEED, tidx[name], np.arange(off, off + rows), dim)
                shard.tensor.copy_(torch.from_numpy(w))
        # The fused TBE keeps its own storage: read it back to prove the copy landed there.
        for key, val in sm.state_dict().items():
            name = key.split(".")[-2]
            for shard in val.local_shards():
                off, rows = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
                if rows:
                    want = dc.oracle_rows(ORACLE_SEED, tidx[name], np.arange(off, off + rows),
                                          shard.metadata.shard_sizes[1])
                    assert np.array_equal(shard.tensor.numpy(), want), f"weights of {name}"

    # RW is the only sharding type here: one input dist and one output dist. The input dists
    # are created lazily on the first forward, so wrap them right after their creation.
    assert len(sm._output_dists) == 1
    rec = {}
    out_dist = sm._output_dists[0]
    out_fwd = out_dist.forward
    create_input_dist = sm._create_input_dist

    def create_and_wrap(*a, **kw):
        create_input_dist(*a, **kw)
        assert len(sm._input_dists) == 1
        in_dist = sm._input_dists[0]
        in_fwd = in_dist.forward

        def input_dist_forward(kjt):
            rec["kjt"] = kjt
            return in_fwd(kjt)

        in_dist.forward = input_dist_forward

    sm._create_input_dist = create_and_wrap

    def output_dist_forward(local_embs, sharding_ctx=None):
        rec["local_embs"] = local_embs.detach().clone()
        rec["ctx"] = dc.context_from_torchrec(sharding_ctx)
        out = out_fwd(local_embs, sharding_ctx).wait()
        rec["output"] = out.detach().clone()
        return NoWait(out)

    out_dist.forward = output_dist_forward

    path = os.path.join(tmpdir, f"rank{rank}.h5")
    w = dc.CaptureWriter(path, plan_yaml(args.config, W), W, rank, oracle_seed=ORACLE_SEED)
    for k in range(args.batches):
        spec = make_batch(args.config, rank, k, W, args.seed)
        # Sequence KJTs carry int64 lengths, pooled ones int32 (both dtypes are in the format).
        ldtype = np.int64 if module == "sequence" else np.int32
        lengths = np.array([len(b) for _, _, bags in spec for b in bags], dtype=ldtype)
        values = np.concatenate([np.concatenate(bags) if bags else np.zeros(0, np.int64)
                                 for _, _, bags in spec] + [np.zeros(0, np.int64)])
        kw = {}
        if vbe:
            spkpr = [[bf] for _, bf, _ in spec]
            # inverse_indices: the full batch B_full=3 maps onto each feature's B_f samples.
            B_full = 3
            inv = torch.tensor([[b % bf for b in range(B_full)] for _, bf, _ in spec],
                               dtype=torch.int64)
            kw = dict(stride_per_key_per_rank=spkpr, inverse_indices=(feature_names, inv))
        wts = bag_weights(args.config, rank, k, args.seed, values.size)
        if wts is not None:
            kw["weights"] = torch.from_numpy(wts)
        kjt = KeyedJaggedTensor(
            keys=feature_names,
            values=torch.from_numpy(values),
            lengths=torch.from_numpy(lengths),
            **kw,
        )
        rec.clear()
        res = sm(kjt)
        res = res.wait() if hasattr(res, "wait") else res
        if module == "sequence":
            _ = {f: jt.values() for f, jt in res.items()}  # forces the lazy awaitable
        kin = rec["kjt"]
        spf = None
        if kin.variable_stride_per_key():
            spf = np.asarray(kin.stride_per_key(), dtype=np.int64)
        # TorchRec's golden must equal the unsharded oracle answer (exact: multiples of 1/64).
        want = reference_output(args.config, spec, wts)
        got = rec["output"].numpy()
        if got.shape != want.shape or not np.array_equal(got, want):
            raise SystemExit(f"rank {rank} batch {k}: TorchRec output != oracle reference "
                             f"(shape {got.shape} vs {want.shape})")
        w.write_batch(
            k,
            kin.lengths(),
            kin.values(),
            weights=kin.weights_or_none(),
            stride_per_feature=spf,
            ctx=rec["ctx"],
            local_embs=rec["local_embs"],
            output=rec["output"],
        )
    w.close()
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), required=True)
    ap.add_argument("-W", "--world-size", type=int, default=2)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--kernel", default="fused", help="TorchRec compute kernel (fused|dense)")
    ap.add_argument("--out", required=True, help="merged capture to write")
    ap.add_argument("--dynemb", default="dynemb-dist", help="dynemb-dist binary (for merge)")
    ap.add_argument("--keep-rank-files", help="directory to keep rank<r>.h5 in")
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
        files = [os.path.join(d, f"rank{r}.h5") for r in range(args.world_size)]
        subprocess.run([args.dynemb, "merge", *files, "-o", args.out, "--force"], check=True)


if __name__ == "__main__":
    main()
