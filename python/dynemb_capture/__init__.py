"""dynemb_capture: record what a row-wise (RW) sharded TorchRec job does, for dynemb-dist.

- ``capture(model, dir, batches=...)``: one call on a DistributedModelParallel model; finds
  every RW sharding, exports its plan and writes one capture file per rank and module
  (docs/capture-your-job.md). Needs torch and torchrec (imported only when called).
- ``CaptureWriter``: the low-level per-rank writer for custom jobs (numpy + h5py only).
- ``merge(rank_files, out)``: compress and ``dynemb-dist merge`` per-rank files.

``__version__`` is the version of dynemb-dist itself: this line is its only source (the
top-level CMakeLists.txt and python/pyproject.toml read it).
"""

__version__ = "0.1.0"

from .capture import Capture, CaptureWarning, capture, merge  # noqa: E402
from .torchrec_adapter import context_from_torchrec, fill_oracle  # noqa: E402
from .writer import (  # noqa: E402
    FORMAT,
    FORMAT_VERSION,
    CaptureWriter,
    CaptureWriterError,
    compress_file,
    oracle_rows,
)

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Capture",
    "CaptureWarning",
    "CaptureWriter",
    "CaptureWriterError",
    "capture",
    "compress_file",
    "context_from_torchrec",
    "fill_oracle",
    "merge",
    "oracle_rows",
    "__version__",
]
