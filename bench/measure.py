#!/usr/bin/env python3
"""measure.py LOG CMD...: runs CMD with stdout and stderr to LOG and prints, from the child's
own rusage, "wall user sys maxrss_kb rc" (seconds, seconds, seconds, KiB, exit status); the
same line is kept beside the log in LOG.time. The whole-command measure of bench/e2e.sh and
bench/ab_replay.sh."""
import resource
import subprocess
import sys
import time


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    log, cmd = sys.argv[1], sys.argv[2:]
    with open(log, "w") as out:
        t0 = time.monotonic()
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
        wall = time.monotonic() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = f"{wall:.3f} {ru.ru_utime:.3f} {ru.ru_stime:.3f} {ru.ru_maxrss} {rc}"
    with open(log + ".time", "w") as t:
        t.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
