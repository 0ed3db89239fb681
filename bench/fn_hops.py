#!/usr/bin/env python3
"""Where a function invocation's time goes in the server: joins the hop-trace
files of one `cumux serve --functions` run (CUMUX_HOP_TRACE=DIR; the worker
inherits it) and splits each invocation into its hops, by the functions'
marks (`fn-http-in`, `fn-lane-start`, `fn-inputs-in`, `fn-launched`,
`fn-lane-answer`, `fn-http-resumed`, `fn-http-out`) and the worker round trip
of the read that waits for the work (`server_back` of
the read, `worker_receive`/`worker_reply` in the worker).

    bench/fn_hops.py DIR [--json OUT]

Prints each segment's p50/p99/mean in microseconds. `--census` also counts,
per invocation (from one `fn-http-in` to the next, the scrub after the answer
included), the requests the server sent its worker by kind, the waits that
slept on a doorbell in each process, and how often the next mark in time is
another thread's (hand-offs, and work of two threads overlapping).
"""
import argparse
import bisect
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hop_trace import load, pct  # noqa: E402

# What the worker round trip of the read that waits for the work is called.
READS = ("StreamRead", "MemcpyDtoH")

SEGMENTS = [
    ("http_to_lane", "fn-http-in", "fn-lane-start"),
    ("lane_buffers_inputs", "fn-lane-start", "fn-inputs-in"),
    ("lane_launches", "fn-inputs-in", "fn-launched"),
    ("lane_to_worker", "fn-launched", "w:receive"),
    ("worker", "w:receive", "w:reply"),
    ("worker_to_lane", "w:reply", "s:back"),
    ("lane_outputs", "s:back", "fn-lane-answer"),
    ("lane_to_http", "fn-lane-answer", "fn-http-resumed"),
    ("http_encode", "fn-http-resumed", "fn-http-out"),
    ("total", "fn-http-in", "fn-http-out"),
]


def census(procs):
    """Per invocation: worker requests by kind, doorbell sleeps, thread changes."""
    marks = []
    for pid, ev in procs.items():
        names = {n for _, _, h, n in ev if h == "step"}
        role = "server" if "fn-http-in" in names else "worker"
        marks.extend((t, role, tid, hop, name) for t, tid, hop, name in ev)
    marks.sort()
    starts = [i for i, m in enumerate(marks) if m[3] == "step" and m[4] == "fn-http-in"]
    n = len(starts) - 1
    if n < 1:
        return
    counts = collections.Counter()
    handoffs = 0
    for a, b in zip(starts, starts[1:]):
        last = None
        for _, role, tid, hop, name in marks[a:b]:
            if hop == "server_forward":
                counts[f"server -> worker {name}"] += 1
            elif hop == "sleep":
                counts[f"{role} doorbell sleeps"] += 1
            if last is not None and (role, tid) != last:
                handoffs += 1
            last = (role, tid)
    print(f"census over {n} invocations (per invocation)")
    for what, c in sorted(counts.items()):
        print(f"  {what:40} {c / n:6.2f}")
    print(f"  {'thread changes between consecutive marks':40} {handoffs / n:6.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--json", default=None)
    ap.add_argument("--census", action="store_true")
    args = ap.parse_args()
    procs = load(args.dir)
    if args.census:
        census(procs)
    server = worker = None
    for pid, ev in procs.items():
        names = {n for _, _, h, n in ev if h == "step"}
        if "fn-http-in" in names:
            server = ev
        elif any(h == "worker_receive" for _, _, h, _ in ev):
            worker = ev
    if server is None:
        sys.exit("no functions marks in the trace")
    steps = collections.defaultdict(list)
    for t, _, hop, name in server:
        if hop == "step" and name.startswith("fn-"):
            steps[name].append(t)
        elif hop == "server_back" and name in READS:
            steps["s:back"].append(t)
    for t, _, hop, name in worker or []:
        if name in READS and hop in ("worker_receive", "worker_reply"):
            steps["w:" + hop.split("_")[1]].append(t)
    for v in steps.values():
        v.sort()

    def after(name, t0, t1):
        seq = steps.get(name, [])
        i = bisect.bisect_left(seq, t0)
        return seq[i] if i < len(seq) and seq[i] <= t1 else None

    spans = collections.defaultdict(list)
    ins = steps["fn-http-in"]
    count = 0
    for k, t_in in enumerate(ins):
        t_next = ins[k + 1] if k + 1 < len(ins) else float("inf")
        t_out = after("fn-http-out", t_in, t_next)
        if t_out is None:
            continue
        # Every mark of this invocation lies between its http-in and http-out
        # (one client at a time: invocations do not overlap).
        at = {"fn-http-in": t_in, "fn-http-out": t_out}
        for name in ("fn-lane-start", "fn-inputs-in", "fn-launched", "fn-lane-answer",
                     "fn-http-resumed", "s:back", "w:receive", "w:reply"):
            at[name] = after(name, t_in, t_out)
        count += 1
        for seg, a, b in SEGMENTS:
            if at.get(a) is not None and at.get(b) is not None:
                spans[seg].append((at[b] - at[a]) / 1e3)
    print(f"{count} invocations (one client at a time)")
    print(f"{'segment':22} {'p50 us':>8} {'p99 us':>8} {'mean us':>8}")
    out = {}
    for seg, _, _ in SEGMENTS:
        v = spans.get(seg, [])
        if not v:
            continue
        out[seg] = {"p50": pct(v, 50), "p99": pct(v, 99), "mean": sum(v) / len(v), "n": len(v)}
        print(f"{seg:22} {pct(v, 50):8.1f} {pct(v, 99):8.1f} {sum(v) / len(v):8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
