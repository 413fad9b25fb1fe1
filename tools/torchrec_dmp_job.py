#!/usr/bin/env python3
"""A small real TorchRec training job (DistributedModelParallel, CPU, gloo, W processes)
captured with dynemb_capture only: no hand-written plan, no private TorchRec attribute.

The model (every table's weights are the hash64 oracle, so replay checks the lookup too):

  ec   EmbeddingCollection, RW: e0 (11 rows, s0), e1 (7 rows, shared by s1, s2), D = 4
  ecv  EmbeddingCollection fed variable-batch (VBE) KJTs, RW: x0 (9 rows), x1 (6 rows); TorchRec
       pads the KJT to a fixed batch before the input dist, so the capture holds the padded one
  ebc  EmbeddingBagCollection: tw0 (TABLE-WISE, q0) first, then RW m0 MEAN (10 rows, p0),
       s1 SUM (7 rows, D 8, shared by p1, p2), m3 MEAN (5 rows, p3): the RW sharding is the
       module's second, and its feature order is p0, p3, p1, p2
  wbc  weighted EBC: RW wm0 MEAN (9 rows, w0), ws1 SUM (6 rows, w1), then dp0 (DATA-PARALLEL,
       w2) and cw0 (COLUMN-WISE over ranks 0, 1, w3); weighted KJT
  vbe  EBC fed variable-batch (VBE) KJTs, RW: vm0 MEAN (8 rows, v0), vs1 SUM (7 rows, D 8,
       v1, v2); with --no-vbe-mean only vs1 (TorchRec 1.9.2 on CPU refuses VBE with two
       table groups in one RW sharding)
  fp   FeatureProcessedEmbeddingBagCollection (position weighted), RW: fw0 (9 rows, u0),
       fw1 (5 rows, u1)
  fpm  the same with a MEAN table, RW: fm0 MEAN (9 rows, g0), fm1 SUM (6 rows, g1); its MEAN
       divides by the id count (the module's input KJT has no weights) in TorchRec 1.4, by
       the sum of the ids' 0-based positions in 1.9.2
  a Linear on top (the dense part DMP wraps in DDP)

The RW shardings of ebc and ec are subclasses of TorchRec's (as DynamicEmb's are), made by
wrapping the sharded modules' create_embedding(_bag)_sharding.

Every rank trains --steps steps (forward, backward, fused SGD); steps --capture are
captured into OUT/<module>/rank<r>.h5 and merged by rank 0 into OUT/<module>.h5. Then it
times --bench plain steps and --bench captured steps (rank 0 writes OUT/overhead.json).

  /opt/torchrec-venv/bin/python tools/torchrec_dmp_job.py --out /tmp/caps --dynemb build/dynemb-dist
"""

import argparse
import json
import os
import socket
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
try:  # the installed package (CI installs the wheel), else the source tree's
    import dynemb_capture
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import dynemb_capture  # noqa: E402

ORACLE_SEED = 20261204


def tables(vbe_mean):
    """name -> (module, [(table, rows, dim, features, pooling, sharding)])"""
    return {
        "ec": [("e0", 11, 4, ["s0"], None, "rw"), ("e1", 7, 4, ["s1", "s2"], None, "rw")],
        "ecv": [("x0", 9, 4, ["x0"], None, "rw"), ("x1", 6, 4, ["x1"], None, "rw")],
        "ebc": [("tw0", 5, 4, ["q0"], "SUM", "tw"), ("m0", 10, 4, ["p0"], "MEAN", "rw"),
                ("s1", 7, 8, ["p1", "p2"], "SUM", "rw"), ("m3", 5, 4, ["p3"], "MEAN", "rw")],
        "wbc": [("wm0", 9, 4, ["w0"], "MEAN", "rw"), ("ws1", 6, 4, ["w1"], "SUM", "rw"),
                ("dp0", 4, 4, ["w2"], "SUM", "dp"), ("cw0", 6, 8, ["w3"], "SUM", "cw")],
        "vbe": ([("vm0", 8, 4, ["v0"], "MEAN", "rw")] if vbe_mean else [])
        + [("vs1", 7, 8, ["v1", "v2"], "SUM", "rw")],
        "fp": [("fw0", 9, 4, ["u0"], "SUM", "rw"), ("fw1", 5, 4, ["u1"], "SUM", "rw")],
        "fpm": [("fm0", 9, 4, ["g0"], "MEAN", "rw"), ("fm1", 6, 4, ["g1"], "SUM", "rw")],
    }


def subclass_rw_shardings(tables_by_name):
    """Wraps TorchRec's sharding factories so that the RW shardings of the named tables are
    subclasses of TorchRec's RW shardings, as DynamicEmb's RwPooledDynamicEmbeddingSharding /
    RwSequenceDynamicEmbeddingSharding are (same behaviour, other classes)."""
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from torchrec.distributed.sharding.rw_sequence_sharding import RwSequenceEmbeddingSharding
    from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingSharding

    class RwPooledSubclassSharding(RwPooledEmbeddingSharding):
        pass

    class RwSequenceSubclassSharding(RwSequenceEmbeddingSharding):
        pass

    def wrap(cls, name, base, sub):
        orig = getattr(cls, name)

        def make(*a, **kw):
            sh = orig(*a, **kw)
            infos = kw.get("sharding_infos", a[0] if a else [])
            if type(sh) is base and any(i.embedding_config.name in tables_by_name
                                        for i in infos):
                sh.__class__ = sub
            return sh

        setattr(cls, name, staticmethod(make))

    wrap(ShardedEmbeddingBagCollection, "create_embedding_bag_sharding",
         RwPooledEmbeddingSharding, RwPooledSubclassSharding)
    wrap(ShardedEmbeddingCollection, "create_embedding_sharding",
         RwSequenceEmbeddingSharding, RwSequenceSubclassSharding)


def make_kjt(KJT, torch, spec, rng, B, weighted=False, vbe=False):
    """One module's input: per feature bags of 0..3 ids (empty bags included)."""
    keys, lengths, values, strides = [], [], [], []
    for f, rows in spec:
        Bf = int(rng.integers(1, B + 1)) if vbe else B
        ln = rng.integers(0, 4, size=Bf)
        keys.append(f)
        strides.append(Bf)
        lengths.append(ln)
        values.append(rng.integers(0, rows, size=int(ln.sum())))
    lengths = torch.from_numpy(np.concatenate(lengths).astype(np.int64))
    values = torch.from_numpy(np.concatenate(values).astype(np.int64))
    kw = {}
    if weighted:
        kw["weights"] = torch.from_numpy((rng.integers(1, 9, size=values.numel()) / 4.0)
                                         .astype(np.float32))
    if vbe:
        inv = torch.tensor(np.stack([rng.integers(0, s, size=B) for s in strides]),
                           dtype=torch.int64)
        kw["stride_per_key_per_rank"] = [[s] for s in strides]
        kw["inverse_indices"] = (keys, inv)
    return KJT(keys=keys, values=values, lengths=lengths, **kw)


def run_rank(rank, args):
    import logging

    import torch
    import torch.distributed as dist

    logging.getLogger().setLevel(logging.ERROR)
    import torchrec
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.fp_embeddingbag import (
        FeatureProcessedEmbeddingBagCollectionSharder,
    )
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
    from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    class RwFpSharder(FeatureProcessedEmbeddingBagCollectionSharder):
        """TorchRec's FP sharder leaves row_wise out of its list; this job allows it."""

        def sharding_types(self, compute_device_type):
            return super().sharding_types(compute_device_type) + ["row_wise"]

    W = args.world_size
    torch.set_num_threads(1)  # W processes share a small machine (CI: 2 cores)
    dist.init_process_group("gloo", rank=rank, world_size=W)
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    T = tables(not args.no_vbe_mean)

    def bag_cfgs(name):
        return [torchrec.EmbeddingBagConfig(name=t, num_embeddings=r, embedding_dim=d,
                                            feature_names=fs,
                                            pooling=getattr(torchrec.PoolingType, p))
                for t, r, d, fs, p, _ in T[name]]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ec = torchrec.EmbeddingCollection(
                tables=[torchrec.EmbeddingConfig(name=t, num_embeddings=r, embedding_dim=d,
                                                 feature_names=fs)
                        for t, r, d, fs, _, _ in T["ec"]], device=cpu)
            self.ecv = torchrec.EmbeddingCollection(
                tables=[torchrec.EmbeddingConfig(name=t, num_embeddings=r, embedding_dim=d,
                                                 feature_names=fs)
                        for t, r, d, fs, _, _ in T["ecv"]], device=cpu)
            self.ebc = torchrec.EmbeddingBagCollection(tables=bag_cfgs("ebc"), device=cpu)
            self.wbc = torchrec.EmbeddingBagCollection(tables=bag_cfgs("wbc"), is_weighted=True,
                                                       device=cpu)
            self.vbe = torchrec.EmbeddingBagCollection(tables=bag_cfgs("vbe"), device=cpu)
            pw = PositionWeightedModuleCollection({"u0": 4, "u1": 4}, device=cpu)
            with torch.no_grad():  # position weights other than 1, so a wrong weight shows
                for p in pw.position_weights.values():
                    p.copy_(torch.tensor([1.0, 0.5, 0.25, 2.0]))
            self.fp = FeatureProcessedEmbeddingBagCollection(
                torchrec.EmbeddingBagCollection(tables=bag_cfgs("fp"), is_weighted=True,
                                                device=cpu), pw)
            pwm = PositionWeightedModuleCollection({"g0": 4, "g1": 4}, device=cpu)
            with torch.no_grad():
                for p in pwm.position_weights.values():
                    p.copy_(torch.tensor([1.0, 0.5, 0.25, 2.0]))
            self.fpm = FeatureProcessedEmbeddingBagCollection(
                torchrec.EmbeddingBagCollection(tables=bag_cfgs("fpm"), is_weighted=True,
                                                device=cpu), pwm)
            self.top = torch.nn.Linear(1, 1)

        def forward(self, batch):
            loss = self.top(torch.ones(1, 1)).sum()
            for jt in self.ec(batch["ec"]).values():
                loss = loss + jt.values().sum()
            for jt in self.ecv(batch["ecv"]).values():  # VBE: used, not back-propagated
                loss = loss + jt.values().detach().sum()
            for name in ("ebc", "wbc", "fp", "fpm"):
                loss = loss + getattr(self, name)(batch[name]).values().sum()
            # gloo cannot all_gather the uneven pieces of a VBE reduce-scatter's backward:
            # the VBE module's output is used, not back-propagated.
            return loss + self.vbe(batch["vbe"]).values().detach().sum()

    subclass_rw_shardings({t for name in ("ebc", "ec") for t, *_ in T[name]})
    model = Model()
    kernel = "fused"
    # The fused kernels update the tables in the backward: learning rate 0 keeps the oracle.
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.0}
    sharders = [EmbeddingCollectionSharder(fused_params=fused),
                EmbeddingBagCollectionSharder(fused_params=fused),
                RwFpSharder(ebc_sharder=EmbeddingBagCollectionSharder(fused_params=fused))]

    def plan_for(name, module, sharder):
        gen = {"rw": lambda: row_wise(compute_kernel=kernel),
               "tw": lambda: table_wise(rank=W - 1, compute_kernel=kernel),
               "dp": data_parallel,
               "cw": lambda: column_wise(ranks=[0, 1])}
        pps = {t: gen[s]() for t, _, _, _, _, s in T[name]}
        return construct_module_sharding_plan(module, per_param_sharding=pps, sharder=sharder,
                                              local_size=W, world_size=W, device_type="cpu")

    plan = ShardingPlan({
        "ec": plan_for("ec", model.ec, sharders[0]),
        "ecv": plan_for("ecv", model.ecv, sharders[0]),
        "ebc": plan_for("ebc", model.ebc, sharders[1]),
        "wbc": plan_for("wbc", model.wbc, sharders[1]),
        "vbe": plan_for("vbe", model.vbe, sharders[1]),
        "fp": plan_for("fp", model.fp, sharders[2]),
        "fpm": plan_for("fpm", model.fpm, sharders[2]),
    })
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    dmp = DistributedModelParallel(model, env=env, device=cpu, plan=plan, sharders=sharders)
    dynemb_capture.fill_oracle(dmp, ORACLE_SEED)
    # The dense part only: position weights stay multiples of 1/4, so every sum is exact.
    opt = torch.optim.SGD(dmp.module.top.parameters(), lr=0.1)

    feats = {name: [(f, r) for _, r, _, fs, _, _ in T[name] for f in fs] for name in T}

    def batch(step):
        rng = np.random.default_rng([args.seed, rank, step])
        B = 3  # equal on every rank: gloo cannot all_gather uneven pieces in the backward
        return {
            "ec": make_kjt(KeyedJaggedTensor, torch, feats["ec"], rng, B),
            "ecv": make_kjt(KeyedJaggedTensor, torch, feats["ecv"], rng, B, vbe=True),
            "ebc": make_kjt(KeyedJaggedTensor, torch, feats["ebc"], rng, B),
            "wbc": make_kjt(KeyedJaggedTensor, torch, feats["wbc"], rng, B, weighted=True),
            "vbe": make_kjt(KeyedJaggedTensor, torch, feats["vbe"], rng, B, vbe=True),
            "fp": make_kjt(KeyedJaggedTensor, torch, feats["fp"], rng, B),
            "fpm": make_kjt(KeyedJaggedTensor, torch, feats["fpm"], rng, B),
        }

    def train_step(b):
        opt.zero_grad()
        loss = dmp(b)
        loss.backward()
        opt.step()

    caught = []
    with warnings.catch_warnings(record=True) as wlist:
        warnings.simplefilter("always")
        with dynemb_capture.capture(dmp, args.out, batches=range(args.skip, args.skip + args.batches),
                                    dynemb=args.dynemb, oracle_seed=ORACLE_SEED) as cap:
            for step in range(args.skip + args.batches):
                if step == args.fail_step and rank == args.fail_rank:
                    raise RuntimeError(f"planted failure on rank {rank} at step {step}")
                if step == args.fail_step:  # busy elsewhere (not in a collective that would
                    time.sleep(300)         # fail too) until mp.spawn terminates this rank
                train_step(batch(step))
        caught = [str(w.message) for w in wlist
                  if issubclass(w.category, dynemb_capture.CaptureWarning)]

    # Requested steps that never run: a capture of steps 1, 5, 6 over 2 steps writes step 1
    # and warns of 5..6; one of steps 10..12 writes no file at all and says so.
    late = {}
    for name, steps in (("partial", [1, 5, 6]), ("none", range(10, 13))):
        with warnings.catch_warnings(record=True) as wl:
            warnings.simplefilter("always")
            with dynemb_capture.capture(dmp, os.path.join(args.out, "late-" + name),
                                        batches=steps, dynemb=args.dynemb,
                                        oracle_seed=ORACLE_SEED) as lc:
                for step in range(2):
                    train_step(batch(50 + step))
        late[name] = dict(captured=lc.captured, merged=lc.merged,
                          warnings=[str(w.message) for w in wl
                                    if issubclass(w.category, dynemb_capture.CaptureWarning)])

    # Overhead of a captured step over a plain one: one capture of every other step, each
    # step timed on its own (interleaved, so drift hits both alike); medians over the steps.
    bench = {}
    if args.bench:
        bs = [batch(100 + i) for i in range(2 * args.bench)]
        for b in bs[:2]:
            train_step(b)
        times = []
        with dynemb_capture.capture(dmp, os.path.join(args.out, "bench"),
                                    batches=range(0, len(bs), 2), merge=False) as bcap:
            for b in bs:
                dist.barrier()
                t0 = time.perf_counter()
                train_step(b)
                times.append(time.perf_counter() - t0)
        cap_t, plain_t = np.median(times[0::2]), np.median(times[1::2])
        bench = dict(plain_ms=plain_t * 1e3, captured_ms=cap_t * 1e3, steps=args.bench,
                     hook_ms_per_captured_step=bcap.hook_seconds * 1e3 / args.bench)
    if rank == 0:
        info = dict(warnings=caught, merged=cap.merged, captured=cap.captured,
                    targets=[repr(t) for t in cap.targets], bench=bench,
                    sharding_classes={t.fqn: type(t.sharding).__name__ for t in cap.targets},
                    late=late,
                    package=os.path.dirname(dynemb_capture.__file__),
                    versions=dict(torch=torch.__version__, torchrec=torchrec.__version__))
        with open(os.path.join(args.out, "job.json"), "w") as f:
            json.dump(info, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("-W", "--world-size", type=int, default=3)
    ap.add_argument("--skip", type=int, default=1, help="steps trained before the capture")
    ap.add_argument("--batches", type=int, default=3, help="captured steps")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--bench", type=int, default=0, help="steps timed plain and captured")
    ap.add_argument("--no-vbe-mean", action="store_true")
    ap.add_argument("--dynemb", default=None)
    ap.add_argument("--fail-rank", type=int, default=-1,
                    help="this rank raises at --fail-step inside the capture (mp.spawn then "
                         "terminates the others)")
    ap.add_argument("--fail-step", type=int, default=-1)
    args = ap.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.makedirs(args.out, exist_ok=True)
    mp.spawn(run_rank, args=(args,), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
