#!/usr/bin/env python3
"""Where a round trip's time goes: joins the hop-trace files of one run.

Run the server and a client with CUMUX_HOP_TRACE=DIR (the worker inherits it),
then: bench/hop_trace.py DIR [--call StreamSynchronize] [--top 20] [--json OUT]
Each waiting call of the client is split into its hops: client -> server,
server before the worker, server -> worker, the worker's driver call,
worker -> server, server after the worker, server -> client. It prints each
hop's p50/p99/max and the slowest calls with their hops and the waits that
slept on a doorbell (futex) inside them.
"""
import argparse
import bisect
import collections
import glob
import json
import os
import struct
import sys

RECORD = 32
HOPS = {1: "client_send", 2: "client_answer", 3: "server_receive", 4: "server_reply",
        5: "server_forward", 6: "server_back", 7: "worker_receive", 8: "worker_done",
        9: "worker_reply", 10: "sleep", 11: "wake", 12: "spin_lost", 13: "printf_marker", 14: "step"}
SEGMENTS = ["client_to_server", "server_before_worker", "server_to_worker", "worker_driver",
            "worker_after_driver", "worker_to_server", "server_after_worker", "server_to_client",
            "total"]


def load(directory):
    """{pid: [(t, tid, hop, name)]} sorted by time."""
    out = {}
    for path in glob.glob(os.path.join(directory, "*.hop")):
        pid = int(os.path.basename(path).split(".")[0])
        with open(path, "rb") as f:
            data = f.read()
        if data[:8] != b"CUMUXHOP":
            continue
        records = []
        for off in range(RECORD, len(data), RECORD):
            t, tid, hop = struct.unpack_from("<QIB", data, off)
            if t == 0:
                continue
            name = data[off + 13:off + 32].split(b"\0")[0].decode(errors="replace")
            records.append((t, tid, HOPS.get(hop, str(hop)), name))
        records.sort()
        out[pid] = records
    return out


def roles(procs):
    """{pid: "client" | "worker" | "server" | "other"}, by the hops it marked."""
    role = {}
    for pid, ev in procs.items():
        hops = {h for _, _, h, _ in ev}
        role[pid] = ("client" if "client_send" in hops else
                     "worker" if "worker_receive" in hops else
                     "server" if "server_receive" in hops else "other")
    return role


def by_thread(events, hop):
    """{tid: sorted [(t, name)]} of one hop."""
    d = collections.defaultdict(list)
    for t, tid, h, name in events:
        if h == hop:
            d[tid].append((t, name))
    return d


def first_after(seq, t0, t1, name=None):
    """First (t, name) in sorted seq with t0 <= t <= t1 (and the name)."""
    i = bisect.bisect_left(seq, (t0, ""))
    while i < len(seq) and seq[i][0] <= t1:
        if name is None or seq[i][1] == name:
            return seq[i]
        i += 1
    return None


def last_before(seq, t0, t1, name=None):
    i = bisect.bisect_right(seq, (t1, "\xff")) - 1
    while i >= 0 and seq[i][0] >= t0:
        if name is None or seq[i][1] == name:
            return seq[i]
        i -= 1
    return None


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100.0 * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--call", default=None, help="waiting call to split (default: the commonest)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", default=None)
    ap.add_argument("--by-call", action="store_true",
                    help="instead: each call kind's count and time waited, from the client's side")
    args = ap.parse_args()
    procs = load(args.dir)
    role = roles(procs)
    servers = [p for p in procs if role[p] == "server"]
    workers = [p for p in procs if role[p] == "worker"]
    merged = lambda pids: sorted(e for p in pids for e in procs[p])
    srv, wrk = merged(servers), merged(workers)
    s_recv, s_reply = by_thread(srv, "server_receive"), by_thread(srv, "server_reply")
    s_fwd, s_back = by_thread(srv, "server_forward"), by_thread(srv, "server_back")
    w_recv, w_done = by_thread(wrk, "worker_receive"), by_thread(wrk, "worker_done")
    w_reply = by_thread(wrk, "worker_reply")
    sleeps = {r: sorted(t for t, _, h, _ in merged([p for p in procs if role[p] == r]) if h == "sleep")
              for r in ("client", "server", "worker")}
    lost = {r: sorted(t for t, _, h, _ in merged([p for p in procs if role[p] == r]) if h == "spin_lost")
            for r in ("client", "server", "worker")}

    calls = []
    for pid in procs:
        if role[pid] != "client":
            continue
        pending = {}
        for t, tid, hop, name in procs[pid]:
            if hop == "client_send":
                pending[tid] = (t, name)
            elif hop == "client_answer" and tid in pending and pending[tid][1] == name:
                calls.append((pending.pop(tid)[0], t, name, pid))
    if not calls:
        sys.exit("no waiting client calls in the trace")
    if args.by_call:
        # Where a program's waiting went: time from send to answer, per call.
        per = collections.defaultdict(list)
        for send, answer, name, _ in calls:
            per[name].append((answer - send) / 1e3)
        sends = collections.Counter(n for p in procs if role[p] == "client"
                                    for _, _, h, n in procs[p] if h == "client_send")
        print(f"{'call':24} {'sent':>8} {'waited':>8} {'total ms':>10} {'p50 us':>8} {'max us':>10}")
        for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1]))[:args.top]:
            print(f"{name:24} {sends[name]:>8} {len(v):>8} {sum(v) / 1e3:>10.1f} {pct(v, 50):>8.1f} {max(v):>10.1f}")
        first = min(c[0] for c in calls)
        last = max(c[1] for c in calls)
        waited = sum(sum(v) for v in per.values())
        print(f"client: {(last - first) / 1e9:.2f} s from its first call to its last answer, "
              f"{waited / 1e6:.2f} s of it waiting for answers")
        unanswered = {n: c for n, c in sends.items() if n not in per}
        print("sent without waiting: " +
              ", ".join(f"{n} {c}" for n, c in sorted(unanswered.items(), key=lambda kv: -kv[1])[:8]))
        return
    wanted = args.call or collections.Counter(c[2] for c in calls).most_common(1)[0][0]
    calls = [c for c in calls if c[2] == wanted]

    # The server thread and worker thread that serve this client: the ones
    # whose events fall inside its calls most often.
    def busiest(threads, windows):
        score = collections.Counter()
        for tid, seq in threads.items():
            for t0, t1, name in windows[:200]:
                if first_after(seq, t0, t1, name):
                    score[tid] += 1
        return score.most_common(1)[0][0] if score else None

    s_tid = busiest(s_recv, [(c[0], c[1], wanted) for c in calls])
    forwards = []
    for send, answer, name, _ in calls[:200]:
        f = last_before(s_fwd.get(s_tid, []), send, answer)
        b = f and first_after(s_back.get(s_tid, []), f[0], answer, f[1])
        if f and b:
            forwards.append((f[0], b[0], f[1]))
    w_tid = busiest(w_recv, forwards)
    rows = []
    for send, answer, name, _ in calls:
        row = {"t": send, "total": (answer - send) / 1e3}
        r = first_after(s_recv.get(s_tid, []), send, answer, name)
        p = r and first_after(s_reply.get(s_tid, []), r[0], answer, name)
        if r and p:
            row["client_to_server"] = (r[0] - send) / 1e3
            row["server_to_client"] = (answer - p[0]) / 1e3
            f = last_before(s_fwd.get(s_tid, []), r[0], p[0])
            b = f and first_after(s_back.get(s_tid, []), f[0], p[0], f[1])
            if f and b:
                row["server_before_worker"] = (f[0] - r[0]) / 1e3
                row["server_after_worker"] = (p[0] - b[0]) / 1e3
                row["worker_call"] = f[1]
                wr = first_after(w_recv.get(w_tid, []), f[0], b[0], f[1])
                if wr:
                    wt = wr[0]
                    d = first_after(w_done.get(w_tid, []), wt, b[0], f[1])
                    e = d and first_after(w_reply.get(w_tid, []), d[0], b[0], f[1])
                    if d and e:
                        row["server_to_worker"] = (wt - f[0]) / 1e3
                        row["worker_driver"] = (d[0] - wt) / 1e3
                        row["worker_after_driver"] = (e[0] - d[0]) / 1e3
                        row["worker_to_server"] = (b[0] - e[0]) / 1e3
        for r_, ts in sleeps.items():
            row["sleeps_" + r_] = bisect.bisect_right(ts, answer) - bisect.bisect_left(ts, send)
        for r_, ts in lost.items():
            row["spin_lost_" + r_] = bisect.bisect_right(ts, answer) - bisect.bisect_left(ts, send)
        rows.append(row)

    print(f"{len(rows)} {wanted} calls; processes: " +
          ", ".join(f"{role[p]} {p}" for p in sorted(procs)))
    print(f"{'hop (us)':24} {'n':>6} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    summary = {}
    for seg in SEGMENTS:
        v = [r[seg] for r in rows if seg in r]
        summary[seg] = {"n": len(v), "p50": pct(v, 50), "p90": pct(v, 90), "p99": pct(v, 99),
                        "max": max(v) if v else float("nan")}
        s = summary[seg]
        print(f"{seg:24} {s['n']:>6} {s['p50']:>8.1f} {s['p90']:>8.1f} {s['p99']:>8.1f} {s['max']:>8.1f}")
    slow = sorted(rows, key=lambda r: -r["total"])[:args.top]
    print(f"\nslowest {len(slow)} (us; sleeps and lost spins per process role):")
    short = ["c>s", "s-pre", "s>w", "drv", "w-post", "w>s", "s-post", "s>c", "total"]
    print(" ".join(f"{h:>7}" for h in short) + "   sleeps c/s/w  lost c/s/w")
    for r in slow:
        cells = " ".join(f"{r[s]:>7.1f}" if s in r else f"{'-':>7}" for s in SEGMENTS)
        print(cells + f"   {r['sleeps_client']}/{r['sleeps_server']}/{r['sleeps_worker']}"
              f"        {r['spin_lost_client']}/{r['spin_lost_server']}/{r['spin_lost_worker']}")
    # Per thread over the whole run: doorbell sleeps (count, time asleep) and lost spins.
    print("\nthreads that slept or lost a spin (role pid tid: sleeps, ms asleep, lost spins):")
    threads = []
    for pid, ev in procs.items():
        asleep = collections.defaultdict(int)
        since, count, lost_n = {}, collections.Counter(), collections.Counter()
        for t, tid, hop, _ in ev:
            if hop == "sleep":
                since[tid] = t
                count[tid] += 1
            elif hop == "wake" and tid in since:
                asleep[tid] += t - since.pop(tid)
            elif hop == "spin_lost":
                lost_n[tid] += 1
        for tid in set(count) | set(lost_n):
            threads.append((role[pid], pid, tid, count[tid], asleep[tid] / 1e6, lost_n[tid]))
    for r in sorted(threads, key=lambda r: -r[3])[:12]:
        print(f"  {r[0]} {r[1]} {r[2]}: {r[3]} sleeps, {r[4]:.1f} ms asleep, {r[5]} lost spins")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"call": wanted, "calls": len(rows), "hops_us": summary,
                       "slowest": slow}, f, indent=1)


if __name__ == "__main__":
    main()
