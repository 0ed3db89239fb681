#!/usr/bin/env python3
"""Where an unanswered call's time goes, and a synchronize answered by a mark.

Run the server and a client with CUMUX_HOP_TRACE=DIR (the worker inherits it),
then: bench/hop_posted.py DIR [--call Launch]. Each unanswered call of that
kind (the commonest by default) is followed from the client's send to the
worker's driver call: client -> server, the server's handling until it
forwards the work, server -> worker, the worker until its driver call
returned. Where the client saw a synchronize's mark (its "mark-seen" step),
the time from the mark's send to it and from the last call's send before it
to it are reported too. Prints p50/p99 of each segment, in µs.
"""
import argparse
import bisect
import collections
import sys

from hop_trace import load, pct, roles


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--call", default=None)
    args = ap.parse_args()
    procs = load(args.dir)
    role = roles(procs)
    clients = [p for p in procs if role[p] == "client"]
    if not clients:
        sys.exit("no client in the trace")
    answered = set()
    for p in clients:
        answered |= {n for _, _, h, n in procs[p] if h == "client_answer"}
    sends = [(t, n) for p in clients for t, _, h, n in procs[p] if h == "client_send"]
    sends.sort()
    kinds = collections.Counter(n for _, n in sends if n not in answered)
    call = args.call or (kinds.most_common(1)[0][0] if kinds else sys.exit("no unanswered calls"))
    srv = sorted(e for p in procs if role[p] == "server" for e in procs[p])
    wrk = sorted(e for p in procs if role[p] == "worker" for e in procs[p])
    # The server takes a connection's calls in order, on one thread: the
    # n-th receive of a kind is the n-th send of it. What it forwards to the
    # worker before its next receive is that call's; the worker takes
    # forwarded requests in order.
    recv = [(t, tid, n) for t, tid, h, n in srv if h == "server_receive"]
    fwd = [(t, n) for t, tid, h, n in srv if h == "server_forward"]
    w_recv_by = collections.defaultdict(list)
    for t, tid, h, n in wrk:
        if h == "worker_receive":
            w_recv_by[n].append((t, tid))
    # Each forwarded request is the first of its kind the worker received
    # after it and before the next one of that kind was forwarded.
    w_recv, used = [], collections.Counter()
    for t, n in fwd:
        got = w_recv_by[n]
        k = used[n]
        while k < len(got) and got[k][0] < t:
            k += 1
        w_recv.append(got[k] if k < len(got) else None)
        used[n] = k + 1
    w_done = collections.defaultdict(list)
    for t, tid, h, n in wrk:
        if h == "worker_done":
            w_done[tid].append(t)
    by_kind = collections.defaultdict(list)
    for t, tid, n in recv:
        by_kind[n].append((t, tid))
    sent_of = collections.defaultdict(list)
    for t, n in sends:
        sent_of[n].append(t)
    seg = collections.defaultdict(list)
    fwd_times = [t for t, _ in fwd]
    for k, (s_t, s_tid) in enumerate(by_kind.get(call, [])):
        if k >= len(sent_of[call]):
            break
        c_t = sent_of[call][k]
        seg["client_to_server"].append((s_t - c_t) / 1e3)
        i = bisect.bisect_left(fwd_times, s_t)
        nxt = [t for t, tid, _ in recv if t > s_t and tid == s_tid][:1]
        if i >= len(fwd) or (nxt and fwd[i][0] > nxt[0]) or w_recv[i] is None:
            continue
        f_t = fwd[i][0]
        seg["server_handling"].append((f_t - s_t) / 1e3)
        wr_t, wr_tid = w_recv[i]
        seg["server_to_worker"].append((wr_t - f_t) / 1e3)
        dl = w_done[wr_tid]
        j = bisect.bisect_left(dl, wr_t)
        if j < len(dl):
            seg["worker_to_driver_done"].append((dl[j] - wr_t) / 1e3)
            seg["send_to_driver_done"].append((dl[j] - c_t) / 1e3)
    seen = sorted(t for p in clients for t, _, h, n in procs[p] if h == "step" and n == "mark-seen")
    mark_sends = sent_of.get("Mark", [])
    for t in seen:
        i = bisect.bisect_right(mark_sends, t) - 1
        if i >= 0:
            seg["mark_send_to_seen"].append((t - mark_sends[i]) / 1e3)
        j = bisect.bisect_right(sends, (t, "\xff")) - 1
        prior = [s for s in sends[max(0, j - 3):j + 1] if s[1] not in ("Mark",)]
        if prior:
            seg["last_call_to_seen"].append((t - prior[-1][0]) / 1e3)
    # The worker's own steps between taking a request and its driver call's
    # end, on its thread: each segment named by the step that ends it.
    steps = collections.defaultdict(list)
    last = {}
    for t, tid, h, n in wrk:
        if h == "worker_receive":
            last[tid] = (t, "receive")
        elif h in ("step", "worker_done") and tid in last:
            t0, prev = last[tid]
            steps[f"worker {prev}->{n if h == 'step' else 'done'}"].append((t - t0) / 1e3)
            last[tid] = (t, n) if h == "step" else None
            if last[tid] is None:
                del last[tid]
    print(f"{call}: {len(by_kind.get(call, []))} sent; unanswered kinds {dict(kinds)}")
    print(f"{'segment':24} {'n':>7} {'p50 us':>8} {'p99 us':>8}")
    for name, v in list(seg.items()) + sorted(steps.items()):
        print(f"{name:24} {len(v):>7} {pct(v, 50):>8.2f} {pct(v, 99):>8.2f}")


if __name__ == "__main__":
    main()
