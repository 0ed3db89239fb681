#!/usr/bin/env python3
"""Where an asynchronous launch's time goes before the kernel is queued: joins the
hop-trace files of one run (CUMUX_HOP_TRACE on server, worker and client) and,
for every `Launch` the client sent, walks the marks of all three processes from
the client's send to the worker's `cuLaunchKernel` returning (the first
`worker_done Enqueue`), including the `step` marks inside the server and the worker.

    bench/hop_path.py DIR [--min-share 0.05]

Prints each transition between consecutive marks (p50/p90/p99 in microseconds),
commonest first; transitions seen in fewer than --min-share of the launches
(interleavings with other work) are left out.
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hop_trace  # noqa: E402


def role(events):
    hops = {h for _, _, h, _ in events}
    if "client_send" in hops:
        return "client"
    return "worker" if "worker_receive" in hops else "server"


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] / 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--min-share", type=float, default=0.05)
    args = ap.parse_args()
    merged = []
    for events in hop_trace.load(args.dir).values():
        r = role(events)
        merged += [(t, r, h, n) for t, _, h, n in events]
    merged.sort()
    launches = [i for i, (_, r, h, n) in enumerate(merged)
                if r == "client" and h == "client_send" and n == "Launch"]
    segments = collections.defaultdict(list)
    end = "worker:worker_done:Enqueue"
    for i in launches:
        t0 = merged[i][0]
        prev, prev_name, seen = t0, "client_send", set()
        for t, r, h, n in merged[i + 1:]:
            if t - t0 > 2e6:
                break
            if r == "client" or (r == "server" and h == "server_receive" and n != "Launch"):
                continue
            name = f"{r}:{h}" if h in ("sleep", "wake", "spin_lost") else f"{r}:{h}:{n}"
            if name in seen:
                continue
            seen.add(name)
            segments[f"{prev_name} -> {name}"].append(t - prev)
            prev, prev_name = t, name
            if name == end:
                break
        segments[f"total: client_send -> {end}"].append(prev - t0)
    print(f"{len(launches)} launches")
    for name, values in sorted(segments.items(), key=lambda kv: -len(kv[1])):
        if len(values) >= len(launches) * args.min_share:
            print(f"{name:72} n={len(values):6} p50 {pct(values, .5):7.1f} "
                  f"p90 {pct(values, .9):7.1f} p99 {pct(values, .99):7.1f}")


if __name__ == "__main__":
    main()
