"""``capture()``: one call that captures every RW sharding of a DistributedModelParallel model.

    import dynemb_capture

    with dynemb_capture.capture(model, "caps/", batches=range(100, 104)) as cap:
        ...train as usual...
    # caps/<module>/rank<r>.h5 on every rank; with merge (default), rank 0 then writes
    # caps/<module>.h5 (compressed), ready for `dynemb-dist replay`.

Step ``s`` is the s-th forward (0-based) of a sharded module since the ``with`` began;
``batches`` names the steps to capture, which become capture batches 0, 1, ... in order.
On the training thread a captured step costs one host copy of its tensors (KJT, context,
lookup output, output dist result and, for pooled modules with MEAN tables, the module's
output); a writer thread per file writes them, uncompressed unless ``compression`` says so,
once they pass a memory budget or when the ``with`` block ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from types import TracebackType
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple, Type, Union

import numpy as np

from . import torchrec_adapter as adapter
from .writer import CaptureWriter, CaptureWriterError, compress_file

if TYPE_CHECKING:
    from .torchrec_adapter import RwTarget

StrPath = Union[str, "os.PathLike[str]"]


class CaptureWarning(UserWarning):
    """What capture() does not capture (sharding types, module types), never silent."""


def _nbytes(obj: Any) -> int:
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    return 0


class AsyncWriter:
    """A CaptureWriter on its own thread. write_batch() queues host arrays and returns.

    The thread writes once the queued arrays pass ``budget_bytes`` (then everything queued)
    and at close(): HDF5 writing holds Python's GIL, so a thread that wrote every batch as it
    arrived would slow the training thread during the captured steps themselves. With the
    default budget a short capture is written when the ``with`` block ends.
    """

    def __init__(self, writer: CaptureWriter, budget_bytes: int = 256 << 20) -> None:
        self.writer = writer
        self.budget = int(budget_bytes)
        self._items: List[Tuple[int, Dict[str, Any]]] = []
        self._bytes = 0
        self._cv = threading.Condition()
        self._closing = False
        self._err: Optional[BaseException] = None
        self._th = threading.Thread(target=self._run, name=f"dynemb-capture-{writer.rank}",
                                    daemon=True)
        self._th.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._closing or self._bytes > self.budget)
                items, self._items, self._bytes = self._items, [], 0
                closing = self._closing
            for k, kw in items:
                if self._err is None:
                    try:
                        self.writer.write_batch(k, **kw)
                    except Exception as e:  # reported by write_batch() / close()
                        self._err = e
            if closing:
                with self._cv:
                    if not self._items:
                        return

    def write_batch(self, k: int, **kw: Any) -> None:
        if self._err is not None:
            raise self._err
        with self._cv:
            self._items.append((k, kw))
            self._bytes += _nbytes(kw)
            if self._bytes > self.budget:
                self._cv.notify()

    def _finish(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._th.join()

    def close(self) -> None:
        self._finish()
        if self._err is not None:
            self.writer.abort()
            raise self._err
        self.writer.close()

    def abort(self) -> None:
        with self._cv:
            self._items, self._bytes = [], 0
        self._finish()
        self.writer.abort()


def find_dynemb(dynemb: Optional[str] = None) -> Optional[str]:
    """The dynemb-dist binary: the argument, $DYNEMB, or dynemb-dist on PATH (None if none)."""
    for c in (dynemb, os.environ.get("DYNEMB"), shutil.which("dynemb-dist")):
        if c and os.path.exists(c):
            return c
    return None


def merge(rank_files: Sequence[StrPath], out: StrPath, dynemb: Optional[str] = None,
          compression: Optional[str] = "gzip") -> "subprocess.CompletedProcess[str]":
    """Compresses the per-rank files (a copy each, ``compression`` None to skip) and runs
    ``dynemb-dist merge`` on them into ``out``. Returns the merge's CompletedProcess; raises
    CaptureWriterError when dynemb-dist is not found or the merge fails."""
    exe = find_dynemb(dynemb)
    if exe is None:
        raise CaptureWriterError("merge: dynemb-dist not found (pass dynemb= or set $DYNEMB)")
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out))) as tmp:
        files = []
        for i, f in enumerate(rank_files):
            if compression:
                c = os.path.join(tmp, f"{i}-{os.path.basename(f)}")
                compress_file(f, c, compression)
                files.append(c)
            else:
                files.append(os.fspath(f))
        p = subprocess.run([exe, "merge", *files, "-o", os.fspath(out), "--force"],
                           capture_output=True, text=True)
    if p.returncode != 0:
        raise CaptureWriterError(f"dynemb-dist merge -o {out}: exit {p.returncode}: "
                                 f"{p.stderr.strip()}")
    return p


class _Record:
    __slots__ = ("k", "step", "data", "inv", "weighted")

    def __init__(self, k: int, step: int, inv: Any, weighted: Optional[bool]) -> None:
        self.k, self.step, self.inv = k, step, inv
        self.data: Dict[str, Any] = {}
        self.weighted = weighted  # the module's own input KJT carried weights (None: unseen)


class Capture:
    """The context manager returned by capture(); see its docstring."""

    def __init__(self, model: Any, out_dir: StrPath, batches: Iterable[int],
                 module_output: Union[str, bool] = "auto", compression: Optional[str] = None,
                 merge: bool = True, merge_compression: Optional[str] = "gzip",
                 dynemb: Optional[str] = None, oracle_seed: Optional[int] = None,
                 budget_bytes: int = 256 << 20) -> None:
        self.model = model
        self.out_dir = os.fspath(out_dir)
        steps = sorted({int(b) for b in batches})
        if not steps or steps[0] < 0:
            raise ValueError("batches: give the step numbers to capture (>= 0)")
        self._wanted = {s: k for k, s in enumerate(steps)}
        if module_output not in ("auto", True, False):
            raise ValueError("module_output: 'auto', True or False")
        self.module_output = module_output
        self.compression = compression
        self.do_merge = merge
        self.merge_compression = merge_compression
        self.dynemb = dynemb
        self.oracle_seed = oracle_seed
        self.budget_bytes = budget_bytes
        self.targets: List[RwTarget] = []
        self.not_captured: List[str] = []
        self.rank_files: Dict[str, str] = {}  # fqn -> this rank's file
        self.merged: Dict[str, str] = {}      # fqn -> merged capture (rank 0, after exit)
        self.captured: Dict[str, int] = {}    # fqn -> number of batches written by this rank
        self._hooks: List[Any] = []
        self._writers: Dict[str, AsyncWriter] = {}
        self._steps: Dict[str, int] = {}
        self._cur: Dict[str, Optional[_Record]] = {}
        self._inv: Dict[str, Any] = {}
        self._weighted: Dict[str, Optional[bool]] = {}
        self._warned: set[str] = set()
        self.hook_seconds = 0.0  # training-thread time spent in the capture hooks

    # -- set-up / tear-down
    def __enter__(self) -> "Capture":
        self.targets, self.not_captured = adapter.find_rw_shardings(self.model)
        for msg in self.not_captured:
            warnings.warn(f"dynemb_capture: {msg}", CaptureWarning, stacklevel=2)
        if not self.targets:
            warnings.warn("dynemb_capture: no row_wise sharding found in the model; nothing "
                          "will be captured", CaptureWarning, stacklevel=2)
        for t in self.targets:
            d = os.path.join(self.out_dir, t.fqn or "model")
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, f"rank{t.rank}.h5")
            w = CaptureWriter(path, t.plan_yaml or "", t.world_size, t.rank,
                              oracle_seed=self.oracle_seed, compression=self.compression)
            self._writers[t.fqn] = AsyncWriter(w, self.budget_bytes)
            self.rank_files[t.fqn] = path
            self.captured[t.fqn] = 0
            self._steps[t.fqn] = 0
            self._cur[t.fqn] = None
            self._inv[t.fqn] = None
            self._weighted[t.fqn] = None
            self._hooks.append(adapter.Hooks(t, self))
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if exc_type is not None:
            for w in self._writers.values():
                w.abort()
            return
        for t in self.targets:
            self._submit(t)
        self._warn_missing_steps()
        for t in self.targets:
            w = self._writers[t.fqn]
            if self.captured[t.fqn] == 0:
                w.abort()  # a file of 0 batches replays nothing: none is written
                warnings.warn(f"dynemb_capture: module '{t.fqn}': 0 batches captured on rank "
                              f"{t.rank}; no file written", CaptureWarning, stacklevel=2)
                try:  # the module's directory, if nothing else is in it
                    os.rmdir(os.path.dirname(self.rank_files[t.fqn]))
                except OSError:
                    pass
                del self.rank_files[t.fqn]
            else:
                w.close()
        adapter.barrier()
        if self.do_merge and adapter.dist_rank() == 0:
            for t in self.targets:
                self._merge_one(t)
        adapter.barrier()

    def _warn_missing_steps(self) -> None:
        """A CaptureWarning per module whose requested steps did not (all) run."""
        for t in self.targets:
            ran = self._steps[t.fqn]
            missing = [s for s in self._wanted if s >= ran]
            if missing:
                warnings.warn(f"dynemb_capture: module '{t.fqn}': requested steps "
                              f"{_ranges(missing)} did not run (steps 0..{ran - 1} ran"
                              f"{'' if ran else ': none'}); {self.captured[t.fqn]} of "
                              f"{len(self._wanted)} batches captured", CaptureWarning,
                              stacklevel=3)

    def _merge_one(self, t: RwTarget) -> None:
        if self.captured[t.fqn] == 0:
            return  # said in __exit__'s warning
        d = os.path.dirname(self.rank_files[t.fqn])
        files = [os.path.join(d, f"rank{r}.h5") for r in range(t.world_size)]
        missing = [f for f in files if not os.path.exists(f)]
        out = os.path.join(self.out_dir, f"{t.fqn or 'model'}.h5")
        if missing:
            warnings.warn(f"dynemb_capture: {t.fqn}: rank files not on this filesystem "
                          f"({missing[0]} ...); merge them with `dynemb-dist merge "
                          f"{d}/rank*.h5 -o {out}`", CaptureWarning, stacklevel=3)
            return
        if find_dynemb(self.dynemb) is None:
            warnings.warn(f"dynemb_capture: dynemb-dist not found; merge with `dynemb-dist "
                          f"merge {d}/rank*.h5 -o {out}`", CaptureWarning, stacklevel=3)
            return
        merge(files, out, self.dynemb, self.merge_compression)
        self.merged[t.fqn] = out

    # -- called by the adapter's hooks (training thread)
    def on_module_input(self, t: RwTarget, inv: Any, weighted: Optional[bool] = None) -> None:
        self._inv[t.fqn] = inv
        self._weighted[t.fqn] = weighted

    def want(self, t: RwTarget) -> bool:
        self._submit(t)  # a record still waiting for a module output that never came
        step = self._steps[t.fqn]
        self._steps[t.fqn] = step + 1
        k = self._wanted.get(step)
        if k is None:
            self._inv[t.fqn] = None
            return False
        self._cur[t.fqn] = _Record(k, step, self._inv[t.fqn], self._weighted[t.fqn])
        self._inv[t.fqn] = None
        self._weighted[t.fqn] = None
        return True

    def on_input(self, t: RwTarget, d: Dict[str, Any]) -> None:
        r = self._cur[t.fqn]
        assert r is not None  # want() made it
        r.data.update(d)

    def on_local(self, t: RwTarget, local_embs: Any, ctx: Optional[Dict[str, Any]]) -> None:
        r = self._cur[t.fqn]
        assert r is not None
        r.data["local_embs"], r.data["ctx"] = local_embs, ctx

    def _wants_module_output(self, t: RwTarget) -> bool:
        if t.kind != "pooled":
            return False
        return t.has_mean if self.module_output == "auto" else bool(self.module_output)

    def on_output(self, t: RwTarget, out: Any) -> None:
        r = self._cur[t.fqn]
        if r is None:
            return
        r.data["output"] = out
        if not self._wants_module_output(t):
            self._submit(t)

    def on_module_output(self, t: RwTarget, cols: Dict[str, Any]) -> None:
        r = self._cur[t.fqn]
        if r is None or not self._wants_module_output(t):
            return
        if all(f in cols for f in t.features):
            mo = np.concatenate([cols[f] for f in t.features], axis=1)
            r.data["module_output"] = np.ascontiguousarray(mo, dtype=np.float32)
            if r.inv is not None:
                r.data["inverse_indices"] = r.inv
        self._submit(t)

    def _submit(self, t: RwTarget) -> None:
        r = self._cur.get(t.fqn)
        if r is None:
            return
        self._cur[t.fqn] = None
        if "output" not in r.data:
            return  # the forward did not reach the output dist
        if self._wants_module_output(t) and "module_output" not in r.data \
                and t.fqn not in self._warned:
            self._warned.add(t.fqn)
            warnings.warn(f"dynemb_capture: {t.fqn}: the module's output was not waited on in "
                          "its step; batches written without module_output", CaptureWarning)
        r.data.setdefault("keys", None)
        if t.kind == "pooled" and r.weighted is not None:
            # TorchRec's MEAN divides by the weights of the module's own input KJT, or by the
            # id count when it has none (a feature-processed EBC: the weights come later).
            r.data["mean_divisor"] = "weights" if r.weighted else "count"
        self._writers[t.fqn].write_batch(r.k, iteration=r.step, **r.data)
        self.captured[t.fqn] += 1


def _ranges(steps: Sequence[int]) -> str:
    """[2, 3, 4, 7] -> '2..4, 7'."""
    out, i = [], 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(str(steps[i]) if i == j else f"{steps[i]}..{steps[j]}")
        i = j + 1
    return ", ".join(out)


def capture(model: Any, out_dir: StrPath, batches: Iterable[int],
            module_output: Union[str, bool] = "auto", compression: Optional[str] = None,
            merge: bool = True, merge_compression: Optional[str] = "gzip",
            dynemb: Optional[str] = None, oracle_seed: Optional[int] = None,
            budget_bytes: int = 256 << 20) -> Capture:
    """Captures every row-wise sharding of ``model`` (a DistributedModelParallel) while the
    ``with`` block trains, one file per rank and sharded module.

    model:          the DMP model (every ShardedEmbeddingCollection /
                    ShardedEmbeddingBagCollection / feature-processed EBC in it is found
                    from its sharding plan; other sharding types and unknown sharded modules
                    are named in a CaptureWarning).
    out_dir:        files go to out_dir/<module fqn>/rank<r>.h5 (and out_dir/<fqn>.h5 merged).
    batches:        the steps to capture (the n-th forward of each module is step n).
    module_output:  "auto" (pooled modules with a MEAN table), True or False: also write the
                    module's final pooled output (after TorchRec's mean pooling) and, in VBE
                    batches, the inverse indices.
    compression:    None (default), "lzf" or "gzip" in the job's files.
    merge:          rank 0 merges at exit when it sees every rank file (one filesystem):
                    compresses copies with ``merge_compression`` and runs dynemb-dist merge.
    dynemb:         the dynemb-dist binary for the merge (default $DYNEMB, then PATH).
    oracle_seed:    when the tables hold hash64-oracle weights, its seed (/oracle).
    budget_bytes:   host memory per module held for the writer thread; it writes when the
                    captured arrays pass it, and at the end of the ``with`` block.
    """
    return Capture(model, out_dir, batches, module_output, compression, merge,
                   merge_compression, dynemb, oracle_seed, budget_bytes)
