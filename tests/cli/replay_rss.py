"""Shared by the bounded-memory tests (test_sliced_memory.sh, test_by_destination_memory.sh):
replays of big.h5 whose peak RSS (wait4's ru_maxrss) and stderr are judged, and the failures
collected in one list. Imported with this directory on sys.path."""
import os
import subprocess
import sys


class Replays:
    def __init__(self, dynemb, capture="big.h5"):
        self.dynemb, self.capture = dynemb, capture
        self.fails = []

    def peak(self, *args, want=0, env=None):
        """Replays the capture on cpu with `args` (and `env` over the environment); returns
        (stderr, peak RSS in MiB). An exit other than `want` is a failure."""
        p = subprocess.Popen([self.dynemb, "replay", self.capture, "--backend", "cpu", "--quiet",
                              *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env={**os.environ, **(env or {})})
        err = p.stderr.read().decode(errors="replace")
        _, status, ru = os.wait4(p.pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        if rc != want:
            self.fails.append(f"replay {' '.join(args)}: exit {rc}, want {want}: {err[-400:]}")
        return err, ru.ru_maxrss / 1024.0

    def has_texts(self, err, label, texts):
        for text in texts:
            if text not in err:
                self.fails.append(f"{label}: no '{text}' in: {err[-400:]}")

    def finish(self):
        for f in self.fails:
            print("FAIL:", f)
        sys.exit(1 if self.fails else 0)
