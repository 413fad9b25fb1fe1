"""Low-level per-rank capture writer for dynemb-dist (capture format v1, capture-format.md).

Needs only h5py and numpy. Tensors may be numpy arrays or anything with
``.detach().cpu().numpy()`` (torch tensors); this module never imports torch.

Each rank of a training job writes its own file; ``dynemb-dist merge rank*.h5 -o capture.h5``
assembles one capture from them (it checks that plan, world size and batches agree and that
every rank 0..W-1 appears exactly once)::

    from dynemb_capture import CaptureWriter, context_from_torchrec

    w = CaptureWriter(f"rank{rank}.h5", plan_yaml, world_size=W, rank=rank, oracle_seed=None)
    ...
    w.write_batch(k, kjt.lengths(), kjt.values(), weights=kjt.weights_or_none(),
                  ctx=context_from_torchrec(sharding_ctx), local_embs=embs, output=out)
    ...
    w.close()          # writes rank<r>.h5.tmp-<pid>-<random> and renames it to rank<r>.h5

Nothing is compressed by default (a captured step then costs about one host copy of its
tensors); ``compression="lzf"`` is a fast codec, ``"gzip"`` the small one.
``compress_file()`` recompresses a finished rank file before ``dynemb-dist merge``.

``k`` is the capture batch index (0..nb-1, every index written once); pass
``iteration=`` to remember which training step it was (stored as an attribute).

For a TorchRec DistributedModelParallel model, ``dynemb_capture.capture(model, dir)`` does
all of this (docs/capture-your-job.md); use CaptureWriter directly for a custom job.

For a sequence (EmbeddingCollection) sharding the context is a SequenceShardingContext and
``local_embs`` is ``[N_local, D]``; for a pooled one it is an EmbeddingShardingContext and
``local_embs`` is ``[sum_s B_s, sum_D]`` (1-D for variable batch per feature).
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
from types import TracebackType
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Type, Union

import h5py
import numpy as np
import numpy.typing as npt

#: A tensor as the writer takes it: a numpy array, a list, or anything with
#: ``.detach().cpu().numpy()`` (a torch tensor; torch is never imported here).
TensorLike = Any
#: A context dict as context_from_torchrec() returns it (field name -> array or flag).
Context = Dict[str, Any]

FORMAT = "dynemb-dist-capture"
FORMAT_VERSION = 1

# Chunk target for large datasets: capture-format.md requires chunks <= 1 MiB.
_CHUNK_BYTES = 1 << 20
# Datasets smaller than this are stored contiguous (compression buys nothing there).
_COMPRESS_MIN_BYTES = 64 << 10


class CaptureWriterError(ValueError):
    """Input that cannot be written as capture format v1; the message names the field."""


_REAPER_CODE = (
    "import os, sys\n"
    "paths = set()\n"
    "for line in sys.stdin:\n"
    "    op, p = line[:1], line[1:].rstrip('\\n')\n"
    "    (paths.add if op == '+' else paths.discard)(p)\n"
    "for p in paths:\n"
    "    try:\n"
    "        os.remove(p)\n"
    "    except OSError:\n"
    "        pass\n"
)


class _Reaper:
    """Removes this process's temporary files when it dies, however it dies.

    A signal handler cannot do it: mp.spawn's SIGTERM finds a rank blocked inside a gloo
    collective, where Python runs no handler, and the SIGKILL that follows runs nothing. So a
    small child process holds the list (a line "+path" / "-path" per change on its stdin) and,
    when its stdin reaches end of file (this process exited, normally or not), removes every
    path still listed. One per process, started with the first temporary file.
    """

    def __init__(self) -> None:
        self._fd = -1   # write end of the helper's stdin (close-on-exec)
        self._pid = -1  # the process that started it
        self._lock = threading.Lock()

    def _start(self) -> None:
        r, w = os.pipe()
        try:
            os.posix_spawn(sys.executable, [sys.executable, "-c", _REAPER_CODE], dict(os.environ),
                           file_actions=[(os.POSIX_SPAWN_DUP2, r, 0),
                                         (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                         (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)],
                           setsid=True)  # its own session: a Ctrl-C to the job spares it
        except OSError:
            os.close(w)
            w = -1
        os.close(r)
        self._fd = w

    def _send(self, line: str) -> None:
        with self._lock:
            if self._pid != os.getpid():  # none yet, or a forked child: one of its own
                self._pid = os.getpid()
                self._start()
            if self._fd < 0:
                return
            try:
                os.write(self._fd, line.encode("utf-8", "surrogateescape") + b"\n")
            except OSError:
                pass

    def add(self, path: str) -> None:
        """``path`` is removed if this process dies before discard(path)."""
        self._send("+" + os.path.abspath(path))

    def discard(self, path: str) -> None:
        self._send("-" + os.path.abspath(path))


_reaper = _Reaper()


def to_numpy(x: TensorLike) -> Any:
    """numpy array from a numpy array, a list, or a tensor (duck-typed, no torch import).

    bfloat16 tensors (numpy has no bfloat16) come back as a float32 array; the writer
    stores them as bfloat16 bit patterns (see _encode_float).
    """
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        t = x.detach().cpu()
        if str(getattr(t, "dtype", "")) == "torch.bfloat16":
            # bf16 -> fp32 is exact; _encode_float keeps the upper 16 bits again.
            arr = t.float().numpy()
            return _BF16(arr)
        return t.numpy()
    return np.asarray(x)


class _BF16(np.ndarray):
    """Marks a float32 array whose values are bfloat16 (came from a torch.bfloat16 tensor)."""

    def __new__(cls, arr: Any) -> "_BF16":
        return np.asarray(arr, dtype=np.float32).view(cls)


def _int_list(x: TensorLike) -> npt.NDArray[np.int64]:
    a = to_numpy(x)
    return np.asarray(a, dtype=np.int64)


def _chunks_for(shape: Tuple[int, ...], itemsize: int) -> Tuple[int, ...]:
    """Chunk shape of at most _CHUNK_BYTES: whole trailing rows, as many as fit."""
    if len(shape) == 1:
        return (max(1, min(shape[0], _CHUNK_BYTES // itemsize)),)
    row_elems = int(np.prod(shape[1:]))
    rows = max(1, min(shape[0], _CHUNK_BYTES // max(1, row_elems * itemsize)))
    tail = list(shape[1:])
    # A single row over 1 MiB: split the last dimension too.
    while rows == 1 and int(np.prod(tail)) * itemsize > _CHUNK_BYTES:
        tail[-1] = max(1, tail[-1] // 2)
    return (rows, *tail)


COMPRESSIONS = (None, "lzf", "gzip")


def _put(group: Any, name: str, arr: Any, compression: Optional[str] = None) -> Any:
    """Writes arr as group/name; with a compression, large datasets are chunked (<= 1 MiB)
    + shuffle + the codec (gzip at level 4, or lzf)."""
    arr = np.ascontiguousarray(arr)
    # Fixed-width little-endian only (capture-format.md).
    if arr.dtype.kind != "S":
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    if compression and arr.nbytes >= _COMPRESS_MIN_BYTES and arr.size > 0:
        return group.create_dataset(
            name,
            data=arr,
            chunks=_chunks_for(arr.shape, arr.dtype.itemsize),
            shuffle=True,
            compression=compression,
            compression_opts=4 if compression == "gzip" else None,
        )
    return group.create_dataset(name, data=arr)


def keys_array(keys: Iterable[Union[str, bytes]]) -> npt.NDArray[np.bytes_]:
    """KJT keys as fixed-length NUL-padded byte strings (numpy ``S<n>``, n >= 1)."""
    enc = [k.encode("utf-8") if isinstance(k, str) else bytes(k) for k in keys]
    n = max([1] + [len(k) for k in enc])
    return np.array(enc, dtype=f"S{n}")


def _encode_float(arr: Any, what: str) -> Tuple[Any, Optional[str]]:
    """float32/float16 kept as is; bfloat16 (from torch) as uint16 bits + attr dtype."""
    if isinstance(arr, _BF16):
        bits = np.asarray(arr, dtype=np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16), "bfloat16"
    arr = np.asarray(arr)
    if arr.dtype == np.float32 or arr.dtype == np.float16:
        return arr, None
    if arr.dtype == np.float64:
        raise CaptureWriterError(f"{what}: float64 is not a capture dtype (use float32)")
    raise CaptureWriterError(f"{what}: dtype {arr.dtype} is not float32/float16/bfloat16")


class CaptureWriter:
    """Writes one rank's capture file (format v1 plus the root attribute ``rank``).

    path:        final file name; written as ``path + ".tmp-<pid>-<random>"`` and renamed by close().
    plan_yaml:   the plan text (plan-format.md), stored verbatim as /plan.
    world_size:  W of the RW sharding process group.
    rank:        this rank, 0 <= rank < W.
    oracle_seed: when the embedding weights follow the hash64 oracle, its seed S (/oracle).
    compression: None (default: nothing compressed, the cheapest for a training job),
                 "lzf" (fast) or "gzip" (level 4, small; what merge-time compression uses).
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], plan_yaml: str, world_size: int,
                 rank: int, oracle_seed: Optional[int] = None,
                 compression: Optional[str] = None) -> None:
        if compression not in COMPRESSIONS:
            raise CaptureWriterError(f"compression: {compression!r} (None, 'lzf' or 'gzip')")
        self.compression = compression
        if not isinstance(plan_yaml, str) or not plan_yaml.strip():
            raise CaptureWriterError("plan_yaml: empty plan text")
        world_size, rank = int(world_size), int(rank)
        if world_size < 1:
            raise CaptureWriterError(f"world_size: {world_size} < 1")
        if not 0 <= rank < world_size:
            raise CaptureWriterError(f"rank: {rank} not in [0, {world_size})")
        self.path = os.fspath(path)
        self.world_size, self.rank = world_size, rank
        self._tmp = _temp_name(self.path)
        _reaper.add(self._tmp)
        self._f: Optional[Any] = h5py.File(self._tmp, "x")  # never an existing name
        self._batches: Set[int] = set()
        self._num_features: Optional[int] = None
        f = self._f
        f.attrs["format"] = FORMAT
        f.attrs["format_version"] = np.int64(FORMAT_VERSION)
        f.attrs["world_size"] = np.int64(world_size)
        f.attrs["rank"] = np.int64(rank)
        f.attrs["num_batches"] = np.int64(0)
        f.create_dataset("plan", data=plan_yaml)
        if oracle_seed is not None:
            g = f.create_group("oracle")
            g.attrs["kind"] = "hash64"
            g.attrs["seed"] = np.uint64(oracle_seed)

    def __enter__(self) -> "CaptureWriter":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write_table(self, name: str, weight: TensorLike) -> None:
        """/tables/<name>/weight: the full unsharded table [num_embeddings, D] (optional; the
        oracle makes it unnecessary). Write it in one rank's file (merge copies rank 0's)."""
        if self._f is None:
            raise CaptureWriterError("write_table after close()")
        data, tag = _encode_float(to_numpy(weight), f"/tables/{name}/weight")
        if data.ndim != 2:
            raise CaptureWriterError(f"/tables/{name}/weight: {data.ndim}-D, want [rows, D]")
        ds = _put(self._f.require_group(f"tables/{name}"), "weight", data, self.compression)
        if tag:
            ds.attrs["dtype"] = tag

    def write_batch(
        self,
        k: int,
        lengths: TensorLike,
        values: TensorLike,
        weights: Optional[TensorLike] = None,
        stride_per_feature: Optional[TensorLike] = None,
        ctx: Optional[Context] = None,
        local_embs: Optional[TensorLike] = None,
        output: Optional[TensorLike] = None,
        iteration: Optional[int] = None,
        keys: Optional[Sequence[Union[str, bytes]]] = None,
        module_output: Optional[TensorLike] = None,
        inverse_indices: Optional[TensorLike] = None,
        mean_divisor: Optional[Union[str, Sequence[str]]] = None,
    ) -> None:
        """Writes /batches/<k>/rank<r>/ for this rank.

        lengths:  int32|int64 [F*B] key-major ([sum_f B_f] with stride_per_feature (VBE)).
        values:   int64|int32 [N].  weights: float32 [N] or None.
        stride_per_feature: int64 [F] (VBE batch only) or None.
        ctx:      dict from context_from_torchrec() (or the same keys by hand), or None.
        local_embs, output: the lookup output fed to the output dist and the dist's result
                  (pooled MEAN tables: the undivided sums, as the dist returns them).
        keys:     the F KJT keys in the order the RW input dist saw them (the plan's order).
        module_output: pooled only, the module's final output restricted to this sharding's
                  features, plan column order, float32 [B_r, sum_D] ([B_full, sum_D] in VBE).
        inverse_indices: int64 [F, B_full], the module input KJT's inverse indices, rows in
                  plan feature order (required with module_output in a VBE batch).
        mean_divisor: pooled only, what the module's MEAN pooling divides each feature's bags
                  by: "count" (the ids) or "weights" (the sum of their weights), one string
                  for every feature or a list of F. Give it when the module's own input KJT is
                  not the one captured: a feature-processed EBC's input has no weights (its
                  MEAN divides by the id count) while ``weights`` holds the processed ones the
                  lookup uses. Without it replay takes the weights when there are any.
        """
        if self._f is None:
            raise CaptureWriterError("write_batch after close()")
        k = int(k)
        if k < 0 or k in self._batches:
            raise CaptureWriterError(f"batch {k}: negative or already written")
        where = f"/batches/{k}/rank{self.rank}"

        lengths = np.asarray(to_numpy(lengths)).reshape(-1)
        values = np.asarray(to_numpy(values)).reshape(-1)
        if lengths.dtype not in (np.int32, np.int64):
            raise CaptureWriterError(f"{where}/lengths: dtype {lengths.dtype} (int32|int64)")
        if values.dtype not in (np.int32, np.int64):
            raise CaptureWriterError(f"{where}/values: dtype {values.dtype} (int64|int32)")
        if lengths.size and lengths.min() < 0:
            raise CaptureWriterError(f"{where}/lengths: negative length")
        if int(lengths.sum()) != values.size:
            raise CaptureWriterError(
                f"{where}/lengths: sum {int(lengths.sum())} != len(values) {values.size}"
            )
        # Everything that can be refused is checked before the group exists.
        ka = keys_array(keys) if keys is not None else None
        if ka is not None:
            self._check_features(where + "/keys", ka.size)
        md = None
        if mean_divisor is not None:
            nf = ka.size if ka is not None else self._num_features
            if stride_per_feature is not None:
                nf = int(np.asarray(to_numpy(stride_per_feature)).size)
            md_list = [mean_divisor] * (nf or 0) if isinstance(mean_divisor, str) \
                else list(mean_divisor)
            if not md_list:
                raise CaptureWriterError(f"{where}/mean_divisor: give one per feature (F is "
                                         "not known without keys)")
            for i, d in enumerate(md_list):
                if d not in ("count", "weights"):
                    raise CaptureWriterError(f"{where}/mean_divisor: entry {i} is {d!r}, want "
                                             "'count' or 'weights'")
                if d == "weights" and weights is None:
                    raise CaptureWriterError(f"{where}/mean_divisor: entry {i} is 'weights' "
                                             "but the KJT has no weights")
            self._check_features(where + "/mean_divisor", len(md_list))
            md = keys_array(md_list)
        mo = None
        if module_output is not None:
            mo, _ = _encode_float(to_numpy(module_output), f"{where}/module_output")
            if mo.dtype != np.float32 or mo.ndim != 2:
                raise CaptureWriterError(
                    f"{where}/module_output: {mo.dtype} {mo.ndim}-D, want float32 [B, sum_D]")
        inv = None
        if inverse_indices is not None:
            inv = np.asarray(to_numpy(inverse_indices))
            if inv.dtype.kind not in "iu" or inv.ndim != 2:
                raise CaptureWriterError(
                    f"{where}/inverse_indices: {inv.dtype} {inv.ndim}-D, want int64 [F, B_full]")
            self._check_features(where + "/inverse_indices", inv.shape[0])
            if mo is not None and inv.shape[1] != mo.shape[0]:
                raise CaptureWriterError(
                    f"{where}/inverse_indices: B_full {inv.shape[1]} != module_output rows "
                    f"{mo.shape[0]}")
        elif mo is not None and stride_per_feature is not None:
            raise CaptureWriterError(f"{where}/inverse_indices: required with module_output "
                                     "in a VBE batch")
        g = self._f.create_group(where)
        c = self.compression
        _put(g, "lengths", lengths, c)
        _put(g, "values", values, c)
        if ka is not None:
            _put(g, "keys", ka)
        if md is not None:
            _put(g, "mean_divisor", md)
        if weights is not None:
            w = np.asarray(to_numpy(weights), dtype=np.float32).reshape(-1)
            if w.size != values.size:
                raise CaptureWriterError(f"{where}/weights: {w.size} != len(values) {values.size}")
            _put(g, "weights", w, c)
        if stride_per_feature is not None:
            spf = _int_list(stride_per_feature).reshape(-1)
            if int(spf.sum()) != lengths.size:
                raise CaptureWriterError(
                    f"{where}/stride_per_feature: sum {int(spf.sum())} != len(lengths) "
                    f"{lengths.size}"
                )
            self._check_features(where + "/stride_per_feature", spf.size)
            _put(g, "stride_per_feature", spf)
        if ctx:
            self._write_ctx(g.create_group("ctx"), where + "/ctx", ctx, values.size)
        for name, arr in (("local_embs", local_embs), ("output", output)):
            if arr is None:
                continue
            data, tag = _encode_float(to_numpy(arr), f"{where}/{name}")
            ds = _put(g, name, data, c)
            if tag:
                ds.attrs["dtype"] = tag
        if mo is not None:
            _put(g, "module_output", mo, c)
        if inv is not None:
            _put(g, "inverse_indices", inv.astype(np.int64), c)
        if iteration is not None:
            self._f[f"/batches/{k}"].attrs["iteration"] = np.int64(iteration)
        self._batches.add(k)

    def _check_features(self, what: str, nf: int) -> None:
        if self._num_features is None:
            self._num_features = nf
        elif nf != self._num_features:
            raise CaptureWriterError(f"{what}: {nf} features, earlier batches had {self._num_features}")

    def _write_ctx(self, g: Any, where: str, ctx: Context, n_ids: int) -> None:
        W = self.world_size
        known = {
            "input_splits",
            "output_splits",
            "batch_size_per_rank",
            "batch_size_per_rank_per_feature",
            "sparse_features_recat",
            "unbucketize_permute",
            "lengths_after_input_dist",
            "variable_batch_per_feature",
        }
        for key in ctx:
            if key not in known:
                raise CaptureWriterError(f"{where}/{key}: not a capture context field")
        for name in ("input_splits", "output_splits", "batch_size_per_rank"):
            if ctx.get(name) is not None:
                a = _int_list(ctx[name]).reshape(-1)
                if a.size != W:
                    raise CaptureWriterError(f"{where}/{name}: length {a.size} != world_size {W}")
                _put(g, name, a, self.compression)
        if ctx.get("input_splits") is not None and ctx.get("unbucketize_permute") is not None:
            # Sequence: the ids sent out are exactly this rank's ids.
            s = int(_int_list(ctx["input_splits"]).sum())
            if s != n_ids:
                raise CaptureWriterError(f"{where}/input_splits: sum {s} != len(values) {n_ids}")
        if ctx.get("batch_size_per_rank_per_feature") is not None:
            a = _int_list(ctx["batch_size_per_rank_per_feature"])
            if a.ndim != 2 or a.shape[0] != W:
                raise CaptureWriterError(
                    f"{where}/batch_size_per_rank_per_feature: shape {a.shape}, want [W={W}, F]"
                )
            _put(g, "batch_size_per_rank_per_feature", a, self.compression)
        if ctx.get("sparse_features_recat") is not None:
            _put(g, "sparse_features_recat",
                 np.asarray(to_numpy(ctx["sparse_features_recat"]), dtype=np.int32).reshape(-1),
                 self.compression)
        if ctx.get("unbucketize_permute") is not None:
            p = _int_list(ctx["unbucketize_permute"]).reshape(-1)
            if p.size != n_ids:
                raise CaptureWriterError(
                    f"{where}/unbucketize_permute: length {p.size} != len(values) {n_ids}"
                )
            _put(g, "unbucketize_permute", p, self.compression)
        if ctx.get("lengths_after_input_dist") is not None:
            a = _int_list(ctx["lengths_after_input_dist"])
            if a.ndim != 2:
                raise CaptureWriterError(
                    f"{where}/lengths_after_input_dist: {a.ndim}-D, want [F, sum_s B_s]"
                )
            _put(g, "lengths_after_input_dist", a, self.compression)
        vb = ctx.get("variable_batch_per_feature")
        g.attrs["variable_batch_per_feature"] = np.int64(1 if vb else 0)

    def close(self) -> None:
        """Checks batches are 0..nb-1, sets num_batches, closes and renames into place."""
        if self._f is None:
            return
        nb = len(self._batches)
        if self._batches != set(range(nb)):
            missing = sorted(set(range(max(self._batches) + 1)) - self._batches)
            self.abort()
            raise CaptureWriterError(f"{self.path}: batches not contiguous, missing {missing}")
        self._f.attrs["num_batches"] = np.int64(nb)
        self._f.close()
        self._f = None
        os.replace(self._tmp, self.path)
        _reaper.discard(self._tmp)

    def abort(self) -> None:
        """Drops the half-written temp file (the final path is never touched)."""
        if self._f is not None:
            self._f.close()
            self._f = None
        if os.path.exists(self._tmp):
            os.remove(self._tmp)
        _reaper.discard(self._tmp)


def _temp_name(path: str) -> str:
    """``path + ".tmp-<pid>-<random>"``: a name nobody can plant ahead of time (a symbolic link to
    a victim, an input named so); opened with mode "x" (O_CREAT | O_EXCL), whatever is already
    there is never followed or truncated."""
    return f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def compress_file(src: Union[str, "os.PathLike[str]"], dst: Union[str, "os.PathLike[str]"],
                  compression: str = "gzip") -> None:
    """Copies capture file src to dst with every dataset of 64 KiB or more chunked (<= 1 MiB)
    + shuffle + compression (gzip level 4 by default). Groups, attributes, dtypes and values
    are unchanged. Runs after the job (before ``dynemb-dist merge``), not on its critical path.
    """
    if compression not in ("lzf", "gzip"):
        raise CaptureWriterError(f"compression: {compression!r} ('lzf' or 'gzip')")
    tmp = _temp_name(os.fspath(dst))
    _reaper.add(tmp)
    try:
        with h5py.File(src, "r") as fi, h5py.File(tmp, "x") as fo:
            def copy_attrs(a: Any, b: Any) -> None:
                for k, v in a.attrs.items():
                    b.attrs[k] = v

            copy_attrs(fi, fo)

            def visit(name: str, obj: Any) -> None:
                if isinstance(obj, h5py.Group):
                    copy_attrs(obj, fo.require_group(name))
                    return
                parent, _, base = name.rpartition("/")
                g = fo.require_group(parent) if parent else fo
                if obj.ndim >= 1 and obj.dtype.kind in "iuf" and obj.nbytes >= _COMPRESS_MIN_BYTES:
                    ds = _put(g, base, obj[()], compression)
                    copy_attrs(obj, ds)
                else:
                    fi.copy(obj, g, name=base)

            fi.visititems(visit)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
        _reaper.discard(tmp)


# ---------------------------------------------------------------- hash64 oracle (numpy)

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = 0x9E3779B97F4A7C15


def fmix64(k: Any) -> npt.NDArray[np.uint64]:
    """MurmurHash3 64-bit finalizer on uint64 arrays (wrapping arithmetic)."""
    h: npt.NDArray[np.uint64] = np.asarray(k, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(33)
        h *= _M1
        h ^= h >> np.uint64(33)
        h *= _M2
        h ^= h >> np.uint64(33)
    return h


def oracle_rows(seed: int, table_index: int, rows: Any, dim: int) -> npt.NDArray[np.float32]:
    """hash64 oracle (capture-format.md): float32 [len(rows), dim] for rows g of table t.

    rows are global rows (continuous) or raw keys ((hash_)roundrobin), as int64 or uint64.
    """
    t0 = (int(seed) + _GOLDEN * (int(table_index) + 1)) % (1 << 64)
    h_t = fmix64(np.uint64(t0))
    g = np.asarray(rows).astype(np.int64).view(np.uint64).reshape(-1, 1)
    c = np.arange(dim, dtype=np.uint64).reshape(1, -1)
    with np.errstate(over="ignore"):
        h = fmix64(h_t ^ g)
        h = fmix64(h + c)
    byte = ((h >> np.uint64(56)) & np.uint64(0xFF)).astype(np.int64)
    return ((byte - 128).astype(np.float32) / np.float32(64.0)).astype(np.float32)
