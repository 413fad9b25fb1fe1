"""dynemb_capture: record what a row-wise (RW) sharded TorchRec job does, for dynemb-dist.

- ``capture(model, dir, batches=...)``: one call on a DistributedModelParallel model; finds
  every RW sharding, exports its plan and writes one capture file per rank and module
  (docs/capture-your-job.md). Needs torch and torchrec (imported only when called).
- ``CaptureWriter``: the low-level per-rank writer for custom jobs (numpy + h5py only).
- ``merge(rank_files, out)``: compress and ``dynemb-dist merge`` per-rank files.

The package version equals dynemb-dist's (``__version__``, the top-level CMakeLists.txt).
"""

__version__ = "0.1.0"

from .capture import Capture, CaptureWarning, capture, merge  # noqa: E402,F401
from .torchrec_adapter import context_from_torchrec, fill_oracle  # noqa: E402,F401
from .writer import (  # noqa: E402,F401
    FORMAT,
    FORMAT_VERSION,
    CaptureWriter,
    CaptureWriterError,
    compress_file,
    fmix64,
    keys_array,
    oracle_rows,
    to_numpy,
)
