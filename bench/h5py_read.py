#!/usr/bin/env python3
"""Reads every dataset of an HDF5 file with plain h5py, one thread, and prints the time and the
logical (uncompressed) bytes: the baseline beside which bench/e2e.sh puts dynemb-dist's replay.

    h5py_read.py FILE [--json]

Prints `seconds=S bytes=N stored=M datasets=K` (N: the sum of every dataset's element count
times its element size; M: what the file stores for them), or that as JSON with --json.
"""
import json
import sys
import time

import h5py


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    if len(args) != 1:
        sys.exit(__doc__)
    path = args[0]
    total = stored = count = 0
    t0 = time.perf_counter()
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            nonlocal total, stored, count
            if not isinstance(obj, h5py.Dataset):
                return
            data = obj[()]  # the whole dataset, through libhdf5's own filter pipeline
            total += obj.size * obj.dtype.itemsize
            stored += obj.id.get_storage_size()
            count += 1
            del data

        f.visititems(visit)
    seconds = time.perf_counter() - t0
    out = {"seconds": seconds, "bytes": total, "stored": stored, "datasets": count}
    if "--json" in sys.argv[1:]:
        print(json.dumps(out))
    else:
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in out.items()))


if __name__ == "__main__":
    main()
