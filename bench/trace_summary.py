#!/usr/bin/env python3
"""Prints a DYNEMB_TRACE file (a Chrome trace of one command) as text: per thread, the time in
each span name; then the timeline of spans at least --min-ms long, in start order.

    DYNEMB_TRACE=/tmp/t.json dynemb-dist replay X.h5 --backend cuda --quiet
    python3 bench/trace_summary.py /tmp/t.json [--min-ms 5]
"""
import argparse
import collections
import json
import signal


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--min-ms", type=float, default=5.0, help="timeline: shortest span shown")
    a = ap.parse_args()
    with open(a.trace) as f:
        ev = json.load(f)["traceEvents"]
    end = max((e["ts"] + e["dur"] for e in ev), default=0.0)
    print(f"# {len(ev)} spans, last ends {end / 1e3:.1f} ms after main()")
    per = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
    for e in ev:
        cell = per[e["tid"]][e["name"]]
        cell[0] += 1
        cell[1] += e["dur"]
    for tid in sorted(per):
        items = sorted(per[tid].items(), key=lambda kv: -kv[1][1])
        print(f"thread {tid}: " + ", ".join(f"{n} {ms / 1e3:.1f} ms ({c}x)" for n, (c, ms) in items))
    print(f"# timeline (spans >= {a.min_ms} ms): start  end  thread  name  arg")
    for e in sorted(ev, key=lambda e: e["ts"]):
        if e["dur"] >= a.min_ms * 1e3:
            arg = e.get("args", {}).get("arg", -1)
            print(f"{e['ts'] / 1e3:8.1f} {(e['ts'] + e['dur']) / 1e3:8.1f}  t{e['tid']:<3} "
                  f"{e['name']}{'' if arg < 0 else f' [{arg}]'}")


if __name__ == "__main__":
    main()
