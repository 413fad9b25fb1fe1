"""The TorchRec adapter: the only code of dynemb_capture that touches TorchRec internals.

Everything TorchRec-specific is here: which sharded module classes exist, where a module keeps
its row-wise (RW) input dist, output dist and sharding, the names of the sharding-context
fields, the mean-pooling callback order, the feature processors of a feature-processed EBC.
When a TorchRec release moves one of these, this file is what changes (docs/capture-your-job.md
lists the versions it is checked with). torch and torchrec are imported lazily, so
``import dynemb_capture`` needs only numpy and h5py.

Private attributes read (TorchRec 1.4.0 and 1.9.2 alike):
  ShardedEmbeddingBagCollection: _sharding_types, _embedding_shardings, _input_dists,
      _output_dists, _create_input_dist, _lookups
  ShardedEmbeddingCollection: _sharding_type_to_sharding, _input_dists, _output_dists,
      _create_input_dist
  ShardedFeatureProcessedEmbeddingBagCollection: _embedding_bag_collection
  RwPooledEmbeddingSharding / RwSequenceEmbeddingSharding: _grouped_embedding_configs,
      _world_size, _rank
  RwSparseFeaturesDist: _feature_block_sizes_tensor
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

import numpy as np

if TYPE_CHECKING:
    from .capture import Capture

ROW_WISE = "row_wise"
_F = TypeVar("_F", bound=Callable[..., Any])

_DATA_TYPES = {"FP32": "fp32", "FP16": "fp16", "BF16": "bf16"}
# fbgemm_gpu BoundsCheckMode: FATAL=0, WARNING=1 (zero row, logged), IGNORE=2, NONE=3.
_BOUNDS = {0: "error", 1: "warn_zero_row", 2: "ignore", 3: "ignore"}


def _host(t: Any) -> Any:
    """A host (numpy) copy of a tensor: the one copy a captured step costs."""
    if t is None:
        return None
    t = t.detach()
    if str(t.dtype) == "torch.bfloat16":
        from .writer import to_numpy

        return to_numpy(t.to("cpu", copy=True))
    return t.to("cpu", copy=True).numpy()


def context_from_torchrec(sharding_ctx: Any) -> Optional[Dict[str, Any]]:
    """The capture's ctx/ fields from a TorchRec sharding context, by attribute name.

    Works on SequenceShardingContext (EC) and EmbeddingShardingContext (EBC): reads
    input_splits, output_splits, batch_size_per_rank, batch_size_per_rank_per_feature,
    sparse_features_recat, unbucketize_permute_tensor, lengths_after_input_dist and
    variable_batch_per_feature where they exist and are set. Empty lists (TorchRec's
    "not set") are left out. Returns a dict ready for CaptureWriter.write_batch(ctx=...);
    every array is a copy.
    """
    from .writer import to_numpy

    if sharding_ctx is None:
        return None
    ctx: Dict[str, Any] = {}

    def get(name: str) -> Any:
        v = getattr(sharding_ctx, name, None)
        if v is None:
            return None
        if isinstance(v, (list, tuple)) and len(v) == 0:
            return None
        return v

    for name in ("input_splits", "output_splits", "batch_size_per_rank"):
        v = get(name)
        if v is not None:
            ctx[name] = np.array(to_numpy(v), dtype=np.int64)
    v = get("batch_size_per_rank_per_feature")
    if v is not None:
        ctx["batch_size_per_rank_per_feature"] = np.asarray(
            [[int(b) for b in row] for row in v], dtype=np.int64
        )
    v = get("sparse_features_recat")
    if v is not None:
        ctx["sparse_features_recat"] = np.array(to_numpy(v), dtype=np.int32)
    v = get("unbucketize_permute_tensor")
    if v is not None:
        ctx["unbucketize_permute"] = np.array(to_numpy(v), dtype=np.int64)
    v = get("lengths_after_input_dist")
    if v is not None:
        ctx["lengths_after_input_dist"] = np.array(to_numpy(v), dtype=np.int64)
    vb = getattr(sharding_ctx, "variable_batch_per_feature", None)
    if vb is not None:
        ctx["variable_batch_per_feature"] = bool(vb)
    return ctx


class RwTarget:
    """One RW sharding of one sharded module: what to hook, and its exported plan."""

    def __init__(self, fqn: str, outer: Any, coll: Any, index: int, sharding: Any, kind: str,
                 fp_module: Any) -> None:
        self.fqn = fqn              # module path in the model (plan key)
        self.outer = outer          # the module whose forward the model calls
        self.coll = coll            # ShardedEmbeddingBagCollection / ShardedEmbeddingCollection
        self.index = index          # position of the RW sharding among the module's shardings
        self.sharding = sharding
        self.kind = kind            # "pooled" | "sequence"
        self.fp_module = fp_module  # ShardedFeatureProcessedEmbeddingBagCollection or None
        self.world_size = int(sharding._world_size)
        self.rank = int(sharding._rank)
        self.features = list(sharding.feature_names())
        self.tables: List[Tuple[str, List[str]]] = []  # (table, [features]) in sharding order
        self.dims: Dict[str, int] = {}                 # feature -> D
        self.has_mean = False
        self.plan_yaml: Optional[str] = None
        self.problems: List[str] = []

    def __repr__(self) -> str:
        return f"RwTarget({self.fqn!r}, {self.kind}, rw index {self.index}, W={self.world_size})"


def _tables_in_sharding(sharding: Any) -> Iterator[Any]:
    for group in sharding._grouped_embedding_configs:
        for t in group.embedding_tables:
            yield t


def _bounds_check(target: RwTarget) -> str:
    modes = set()
    try:
        lookup = target.coll._lookups[target.index]
        for m in lookup.modules():
            v = getattr(m, "bounds_check_mode_int", None)
            if v is not None:
                modes.add(int(v))
    except (AttributeError, IndexError):
        pass
    if not modes:
        for t in _tables_in_sharding(target.sharding):
            bc = (t.fused_params or {}).get("bounds_check_mode")
            if bc is not None:
                modes.add(int(bc))
    if len(modes) > 1:
        target.problems.append(f"bounds-check modes differ between table groups {sorted(modes)}")
    return _BOUNDS.get(min(modes), "warn_zero_row") if modes else "warn_zero_row"


def _comm_precision(target: RwTarget) -> str:
    reg = getattr(target.coll, "qcomm_codecs_registry", None)
    if not reg:
        return "fp32"
    op = ("POOLED_EMBEDDINGS_REDUCE_SCATTER" if target.kind == "pooled"
          else "SEQUENCE_EMBEDDINGS_ALL_TO_ALL")
    codecs = reg.get(op)
    if codecs is None:
        return "fp32"
    dt = str(getattr(codecs.forward, "quantized_dtype", "torch.float32"))
    prec = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}.get(dt)
    if prec is None:
        target.problems.append(f"forward comm codec {dt} has no plan equivalent")
        return "fp32"
    return prec


def _export_plan(target: RwTarget) -> None:
    """The plan YAML of this RW sharding, tables and features in the sharding's order."""
    feats = target.features
    pos = {f: i for i, f in enumerate(feats)}
    seen, dtypes = [], set()
    for t in _tables_in_sharding(target.sharding):
        tf = list(t.feature_names)
        idx = [pos.get(f, -1) for f in tf]
        if idx != list(range(idx[0], idx[0] + len(idx))):
            target.problems.append(f"table {t.name}: features {tf} not contiguous in the "
                                   f"sharding's order {feats}")
        seen.append((idx[0], t))
        for f in tf:
            target.dims[f] = int(t.embedding_dim)
        dtypes.add(t.data_type.value if hasattr(t.data_type, "value") else str(t.data_type))
    seen.sort(key=lambda x: x[0])
    if [f for _, t in seen for f in t.feature_names] != feats:
        target.problems.append(f"tables' features do not give the sharding's order {feats}")
    if len(dtypes) > 1:
        target.problems.append(f"tables of several data types {sorted(dtypes)}")
    lines = [
        "format_version: 1",
        f"world_size: {target.world_size}",
        f"module: {target.kind}",
        f"comm_precision: {_comm_precision(target)}",
        f"bounds_check: {_bounds_check(target)}",
        "tables:",
    ]
    for _, t in seen:
        dt = t.data_type.value if hasattr(t.data_type, "value") else str(t.data_type)
        if dt not in _DATA_TYPES:
            target.problems.append(f"table {t.name}: data type {dt} has no plan equivalent")
        lines += [
            f"  - name: {t.name}",
            f"    num_embeddings: {int(t.num_embeddings)}",
            f"    embedding_dim: {int(t.embedding_dim)}",
            f"    data_type: {_DATA_TYPES.get(dt, dt.lower())}",
        ]
        if target.kind == "pooled":
            pooling = t.pooling.value if hasattr(t.pooling, "value") else str(t.pooling)
            lines.append(f"    pooling: {pooling.lower()}")
            target.has_mean |= pooling.upper() == "MEAN"
        lines += ["    dist_type: continuous", f"    features: [{', '.join(t.feature_names)}]"]
        md = getattr(t, "global_metadata", None)
        if md is not None and md.shards_metadata:
            shards = sorted(md.shards_metadata, key=lambda s: s.placement.rank())
            lines.append("    shards:")
            for s in shards:
                lines.append(f"      - {{rank: {s.placement.rank()}, row_offset: "
                             f"{int(s.shard_offsets[0])}, rows: {int(s.shard_sizes[0])}}}")
    target.plan_yaml = "\n".join(lines) + "\n"


def find_rw_shardings(model: Any) -> Tuple[List[RwTarget], List[str]]:
    """Every RW sharding of every sharded EC / EBC / feature-processed EBC in ``model``
    (a DistributedModelParallel or any module containing sharded modules).

    Returns (targets, not_captured): not_captured lists, per module, what is not captured
    and why (other sharding types with their tables, unknown sharded module types, RW
    shardings whose plan cannot be expressed).
    """
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from torchrec.distributed.sharding.rw_sharding import BaseRwEmbeddingSharding
    from torchrec.distributed.types import ShardedModule

    try:
        from torchrec.distributed.fp_embeddingbag import (
            ShardedFeatureProcessedEmbeddingBagCollection as FpEbc,
        )
    except ImportError:  # pragma: no cover
        FpEbc = ()

    root = getattr(model, "module", model)  # DMP: the wrapped model (plan keys are relative)
    targets, not_captured, inner = [], [], set()
    for fqn, m in root.named_modules():
        if id(m) in inner:
            continue
        fp = None
        if FpEbc and isinstance(m, FpEbc):
            fp, coll = m, m._embedding_bag_collection
            inner.add(id(coll))
        elif isinstance(m, (ShardedEmbeddingBagCollection, ShardedEmbeddingCollection)):
            coll = m
        elif isinstance(m, ShardedModule):
            not_captured.append(f"module '{fqn}' ({type(m).__name__}): a sharded module type "
                                "dynemb_capture does not know; not captured")
            continue
        else:
            continue
        try:
            if isinstance(coll, ShardedEmbeddingBagCollection):
                types, kind = list(coll._sharding_types), "pooled"
                shardings = list(coll._embedding_shardings)
            else:
                types = list(coll._sharding_type_to_sharding.keys())
                shardings, kind = list(coll._sharding_type_to_sharding.values()), "sequence"
            for name in ("_input_dists", "_output_dists", "_create_input_dist"):
                getattr(coll, name)
        except AttributeError as e:  # a TorchRec release this adapter does not know
            not_captured.append(f"module '{fqn}' ({type(m).__name__}): not captured, this "
                                f"TorchRec version moved what the adapter reads ({e})")
            continue
        plan = getattr(coll, "module_sharding_plan", {}) or {}
        for i, (st, sh) in enumerate(zip(types, shardings)):
            # By type: DynamicEmb's shardings subclass TorchRec's RW ones (other class names,
            # the same input dist, lookup interface and output dist).
            if not isinstance(sh, BaseRwEmbeddingSharding):
                tabs = sorted(t for t, ps in plan.items() if ps.sharding_type == st)
                how = (f"sharded {st} by {type(sh).__name__}, not a subclass of TorchRec's "
                       "row-wise sharding" if st == ROW_WISE else f"sharded {st}")
                not_captured.append(f"module '{fqn}': tables {', '.join(tabs) or '?'} are "
                                    f"{how}; only row_wise shardings are captured")
                continue
            t = RwTarget(fqn, m, coll, i, sh, kind, fp)
            _export_plan(t)
            if t.problems:
                not_captured.append(f"module '{fqn}': row_wise sharding not captured: "
                                    + "; ".join(t.problems))
                continue
            targets.append(t)
    return targets, not_captured


def _timed(fn: _F) -> _F:
    """Adds the hook's wall time to rec.hook_seconds (what capturing costs the training
    thread: host copies and bookkeeping)."""
    import time

    @functools.wraps(fn)
    def run(self: Hooks, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(self, *a, **kw)
        finally:
            self.rec.hook_seconds += time.perf_counter() - t0

    return run  # type: ignore[return-value]


class Hooks:
    """Installs the capture hooks of one RwTarget; ``rec`` receives host copies.

    rec.want(target) -> bool      is this forward captured? (called once per forward, at the
                                  RW input dist: it counts the steps)
    rec.on_module_input(target, inverse_indices or None)
    rec.on_input(target, dict)    keys, lengths, values, weights, stride_per_feature
    rec.on_local(target, local_embs, ctx)
    rec.on_output(target, output)
    rec.on_module_output(target, columns {feature: [B, D]})
    """

    def __init__(self, target: RwTarget, rec: Capture) -> None:
        self.t, self.rec = target, rec
        self.handles: List[Any] = []
        self._active = False
        self._orig_create: Optional[Callable[..., Any]] = None
        t = target
        self.handles.append(t.outer.register_forward_pre_hook(self._module_pre))
        self.handles.append(t.outer.register_forward_hook(self._module_post))
        od = t.coll._output_dists[t.index]
        self.handles.append(od.register_forward_pre_hook(self._odist_pre, with_kwargs=True))
        self.handles.append(od.register_forward_hook(self._odist_post))
        if len(t.coll._input_dists) > t.index:
            self._hook_input(t.coll._input_dists[t.index])
        else:  # created lazily on the first forward: hook it when it appears
            coll = t.coll
            self._orig_create = coll._create_input_dist

            def create_and_hook(*a: Any, **kw: Any) -> None:
                assert self._orig_create is not None
                self._orig_create(*a, **kw)
                self._hook_input(coll._input_dists[t.index])

            coll._create_input_dist = create_and_hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        if self._orig_create is not None:
            self.t.coll.__dict__.pop("_create_input_dist", None)
            self._orig_create = None

    def _hook_input(self, idist: Any) -> None:
        self._idist = idist
        self.handles.append(idist.register_forward_pre_hook(self._idist_pre))

    # -- hooks
    @_timed
    def _module_pre(self, module: Any, args: Tuple[Any, ...]) -> None:
        kjt: Any = args[0] if args else None
        weighted = None
        if hasattr(kjt, "weights_or_none"):
            weighted = kjt.weights_or_none() is not None
        inv = kjt.inverse_indices_or_none() if hasattr(kjt, "inverse_indices_or_none") else None
        if inv is not None:
            keys, ii = inv
            row = {k: i for i, k in enumerate(keys)}
            try:
                inv = _host(ii)[[row[f] for f in self.t.features]]
            except KeyError:
                inv = None
        self.rec.on_module_input(self.t, inv, weighted)

    @_timed
    def _idist_pre(self, module: Any, args: Tuple[Any, ...]) -> None:
        self._active = self.rec.want(self.t)
        if not self._active:
            return
        kjt = args[0]
        d = dict(keys=list(kjt.keys()), lengths=_host(kjt.lengths()), values=_host(kjt.values()),
                 weights=_host(kjt.weights_or_none()), stride_per_feature=None)
        if kjt.variable_stride_per_key():
            d["stride_per_feature"] = np.asarray(kjt.stride_per_key(), dtype=np.int64)
        if self.t.fp_module is not None:
            d["weights"] = _host(self._processed_weights(kjt))
        self.rec.on_input(self.t, d)

    def _processed_weights(self, kjt: Any) -> Any:
        """The per-id weights the lookup really uses in a feature-processed EBC.

        The processors run after the input dist, on each bag as it arrives at the rank that
        owns its ids (the ids of one bag routed to one rank, in their original order). The
        same bags are made here with TorchRec's own bucketize (block sizes of this input
        dist), one KJT per destination rank, and run through the module's processors; the
        result is put back into the KJT's original id order.
        """
        import torch
        from torchrec.distributed.embedding_sharding import bucketize_kjt_before_all2all
        from torchrec.distributed.embedding_types import KJTList

        W, F = self.t.world_size, len(kjt.keys())
        bkt, perm = bucketize_kjt_before_all2all(
            kjt, num_buckets=W, block_sizes=self._idist._feature_block_sizes_tensor,
            output_permute=True, bucketize_pos=False)
        parts = bkt.split([F] * W)
        done = self.t.fp_module.apply_feature_processors_to_kjt_list(KJTList(parts))
        w = torch.cat([p.weights() for p in done]).detach()
        return w[perm]

    @_timed
    def _odist_pre(self, module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        if not self._active:
            return
        embs = args[0] if args else kwargs.get("local_embs")
        ctx = args[1] if len(args) > 1 else kwargs.get("sharding_ctx")
        self.rec.on_local(self.t, _host(embs), context_from_torchrec(ctx))

    @_timed
    def _odist_post(self, module: Any, args: Tuple[Any, ...], out: Any) -> None:
        if not self._active:
            return
        t, rec = self.t, self.rec
        if not hasattr(out, "callbacks"):  # not an Awaitable: a TorchRec this adapter misreads
            import warnings

            warnings.warn(f"dynemb_capture: {t.fqn}: the RW output dist returned "
                          f"{type(out).__name__}, not an Awaitable; batch not captured")
            return

        def grab(res: Any) -> Any:
            import time

            t0 = time.perf_counter()
            rec.on_output(t, _host(res))
            rec.hook_seconds += time.perf_counter() - t0
            return res

        out.callbacks.append(grab)

    @_timed
    def _module_post(self, module: Any, args: Tuple[Any, ...], out: Any) -> None:
        if not self._active or self.t.kind != "pooled" or not hasattr(out, "callbacks"):
            return
        t, rec = self.t, self.rec

        def grab(kt: Any) -> Any:
            # After TorchRec's own callbacks (mean pooling): the module's final output.
            import time

            t0 = time.perf_counter()
            d = kt.to_dict()
            rec.on_module_output(t, {f: _host(d[f]) for f in t.features if f in d})
            rec.hook_seconds += time.perf_counter() - t0
            return kt

        out.callbacks.append(grab)


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def dist_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def fill_oracle(model: Any, seed: int) -> int:
    """Overwrites every RW table's local shard with the hash64 oracle (capture-format.md):
    row g of the table at position t of its exported plan gets oracle_rows(seed, t, g).
    Lets replay check the lookup itself (``capture(..., oracle_seed=seed)``). Returns the
    number of rows written on this rank; reads them back to prove they landed in the
    embedding kernel's own storage."""
    import torch

    from .writer import oracle_rows

    targets, _ = find_rw_shardings(model)
    n = 0
    for t in targets:
        index: Dict[str, int] = {}
        for line in (t.plan_yaml or "").splitlines():
            if line.startswith("  - name: "):
                index[line.split(": ", 1)[1]] = len(index)
        sd = t.coll.state_dict()
        with torch.no_grad():
            for key, val in sd.items():
                name = key.split(".")[-2] if key.endswith(".weight") else None
                if name not in index or not hasattr(val, "local_shards"):
                    continue
                for shard in val.local_shards():
                    off, rows = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
                    if rows == 0:
                        continue
                    w = oracle_rows(seed, index[name], np.arange(off, off + rows),
                                    shard.metadata.shard_sizes[1])
                    shard.tensor.copy_(torch.from_numpy(w))
                    n += rows
        for key, val in t.coll.state_dict().items():
            name = key.split(".")[-2] if key.endswith(".weight") else None
            if name not in index or not hasattr(val, "local_shards"):
                continue
            for shard in val.local_shards():
                off, rows = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
                if rows and not np.array_equal(
                        shard.tensor.detach().cpu().numpy(),
                        oracle_rows(seed, index[name], np.arange(off, off + rows),
                                    shard.metadata.shard_sizes[1])):
                    raise RuntimeError(f"fill_oracle: {t.fqn}.{name}: weights did not land")
    return n
