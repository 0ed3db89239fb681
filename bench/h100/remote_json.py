#!/usr/bin/env python3
"""Assembles bench/h100/remote.sh's result: reads its manifest (one run a line),
each run's output and the client's hop trace, and writes the results JSON
(bench/README.md's shape) and a table with the round trips a step costs.

    remote_json.py MANIFEST PATH DATE GPU DRIVER CUDA COMMIT PROGRAM

Manifest lines, tab-separated: `step NAME RTT_MS GBIT TRANSPORT FILE TRACE RC`,
`bw NAME RTT_MS GBIT TRANSPORT FILE RC`, `link NAME RTT_MS GBIT - FILE RC`,
`note TEXT`. TRANSPORT is native, tls or plain (plain-direct: no relay).
"""
import collections
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from hop_trace import HOPS  # noqa: E402
from hop_trace import load as load_slowly  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_json import fmt, write  # noqa: E402


def load(directory):
    """{pid: [(t, tid, hop name, call name)]} of a hop-trace folder, as
    hop_trace.load gives it; with numpy, without a Python loop over the
    files' million empty records."""
    try:
        import numpy as np
    except ImportError:
        return load_slowly(directory)
    record = np.dtype([("t", "<u8"), ("tid", "<u4"), ("hop", "u1"), ("name", "S19")])
    out = {}
    for name in os.listdir(directory):
        if not name.endswith(".hop"):
            continue
        data = np.fromfile(os.path.join(directory, name), dtype=record)
        if len(data) == 0 or data[0].tobytes()[:8] != b"CUMUXHOP":
            continue
        used = data[1:][data[1:]["t"] != 0]
        used = used[np.argsort(used["t"], kind="stable")]
        out[int(name.split(".")[0])] = [
            (int(r["t"]), int(r["tid"]), HOPS.get(int(r["hop"]), str(r["hop"])),
             r["name"].split(b"\0")[0].decode(errors="replace")) for r in used]
    return out

manifest, path, date, gpu, driver, cuda, commit, program = sys.argv[1:9]
PHASES = [("import", "start", "imported"), ("cuda_init", "imported", "cuda_ready"),
          ("model", "cuda_ready", "model_ready"), ("first_step", "model_ready", "first_step")]
notes, steps, bws, links = [], [], [], {}


def read(file):
    try:
        with open(file, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def parse_step(file):
    out = {"stamps": {}, "steps": 0, "pid": None}
    for line in read(file):
        p = line.split()
        if len(p) == 3 and p[0] == "stamp":
            out["stamps"][p[1]] = int(p[2])
        elif len(p) == 2 and p[0] == "pid:":
            out["pid"] = int(p[1])
        elif len(p) == 2 and p[0] in ("step_ms_p50:", "step_ms_p99:"):
            out[p[0][:-1]] = float(p[1])
        elif len(p) >= 4 and p[0] == "step" and p[2] == "loss":
            out["steps"] += 1
    s = out["stamps"]
    if "start" in s and "first_step" in s:
        out["startup_s"] = (s["first_step"] - s["start"]) / 1e9
    return out


def trips(run):
    """Round trips (answered calls) and sends of the program's process, per
    step and at start-up, from its hop trace."""
    if not run["trace"] or not os.path.isdir(run["trace"]):
        return
    traces = load(run["trace"])
    if not traces:
        notes.append(f"{run['name']}: no hop trace in {run['trace']}")
        return
    pid = run["pid"] if run["pid"] in traces else max(
        traces, key=lambda k: sum(1 for r in traces[k] if r[2] == "client_answer"))
    records = traces[pid]
    s = run["stamps"]

    def within(a, b, hop):
        if a not in s or b not in s:
            return None
        return [r[3] for r in records if s[a] <= r[0] <= s[b] and r[2] == hop]

    answered = within("steps_begin", "steps_end", "client_answer")
    sent = within("steps_begin", "steps_end", "client_send")
    if answered is not None and run["steps"]:
        n = run["steps"]
        run["trips_per_step"] = len(answered) / n
        run["sends_per_step"] = len(sent) / n
        run["step_calls"] = {k: round(v / n, 3) for k, v in
                             collections.Counter(answered).most_common(8)}
    start = within("start", "first_step", "client_answer")
    if start is not None:
        run["startup_trips"] = len(start)
        run["startup_calls"] = collections.Counter(start).most_common(12)
        run["startup_phases"] = {name: len(within(a, b, "client_answer") or [])
                                 for name, a, b in PHASES}


for line in read(manifest):
    p = line.rstrip("\n").split("\t")
    if p[0] == "note":
        notes.append(p[1])
    elif p[0] == "step" and len(p) == 8:
        run = {"name": p[1], "rtt": p[2], "gbit": p[3], "transport": p[4], "trace": p[6],
               "rc": p[7]}
        run.update(parse_step(p[5]))
        if run["transport"] != "native":
            trips(run)
        if "step_ms_p50" not in run:
            notes.append(f"{run['name']}: no step figures (rc {run['rc']}; see runs/{run['name']}.txt)")
        steps.append(run)
    elif p[0] == "bw" and len(p) == 7:
        got = {}
        for l in read(p[5]):
            q = l.split()
            if len(q) == 4 and q[0] == "metric":
                got[q[1]] = float(q[2])
        if not got:
            notes.append(f"{p[1]}: no bandwidth figures (rc {p[6]})")
        bws.append({"name": p[1], "rtt": p[2], "gbit": p[3], "transport": p[4], "metrics": got})
    elif p[0] == "link" and len(p) == 7:
        got = {}
        for l in read(p[5]):
            q = l.split()
            if len(q) == 2:
                try:
                    got[q[0]] = float(q[1])
                except ValueError:
                    pass
        links[(p[2], p[3])] = got


def sig(v):
    return None if v is None else float(f"{v:.4g}")


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def label(rtt, gbit, transport):
    tail = "" if transport == "tls" else f"_{transport.replace('-', '_')}"
    if transport == "plain-direct":
        return "loopback_plain"
    return f"rtt{rtt}ms_{gbit}g{tail}"


metrics = []


def metric(name, unit, better, native, cumux, **extra):
    ratio = cumux / native if native and cumux is not None else None
    row = {"name": name, "unit": unit, "better": better, "native": sig(native),
           "cumux": sig(cumux), "ratio": sig(ratio)}
    row.update(extra)
    metrics.append(row)


native_runs = [r for r in steps if r["transport"] == "native"]
native = {k: median([r.get(k) for r in native_runs]) for k in ("step_ms_p50", "step_ms_p99", "startup_s")}
groups = collections.OrderedDict()
for r in steps:
    if r["transport"] != "native":
        groups.setdefault((r["transport"], r["rtt"], r["gbit"]), []).append(r)
for (transport, rtt, gbit), runs in groups.items():
    tag = label(rtt, gbit, transport)
    link = links.get((rtt, gbit), {})
    p50 = median([r.get("step_ms_p50") for r in runs])
    target = native["step_ms_p50"] + 1.2 * float(rtt) if native["step_ms_p50"] else None
    metric(f"{program}_step_ms_p50_{tag}", "ms", "lower", native["step_ms_p50"], p50,
           runs=len(runs), target_ms=sig(target),
           within_target=(p50 <= target) if p50 is not None and target else None,
           link_rtt_ms_p50=link.get("rtt_ms_p50"))
    metric(f"{program}_step_ms_p99_{tag}", "ms", "lower", native["step_ms_p99"],
           median([r.get("step_ms_p99") for r in runs]))
    tps = [r["trips_per_step"] for r in runs if "trips_per_step" in r]
    metric(f"{program}_round_trips_per_step_traced_{tag}", "round trips", "lower", None, median(tps),
           floor=1, sends_per_step=sig(median([r.get("sends_per_step") for r in runs])),
           calls=next((r["step_calls"] for r in runs if "step_calls" in r), None))
    first = next((r for r in runs if "startup_s" in r), None)
    if first:
        metric(f"startup_s_{tag}", "s", "lower", native["startup_s"], first["startup_s"])
        if "startup_trips" in first:
            metric(f"startup_round_trips_traced_{tag}", "round trips", "lower", None,
                   first["startup_trips"], phases=first["startup_phases"],
                   top_calls=first["startup_calls"])

# Round trips as the link sees them: how much a step (and start-up) grows per
# ms of measured RTT, between the two longest RTTs of one bandwidth over TLS.
# Unlike the hop trace, this counts every wait, copies chunked over a socket too.
by_gbit = collections.defaultdict(dict)
for (transport, rtt, gbit), runs in groups.items():
    measured = links.get((rtt, gbit), {}).get("rtt_ms_p50")
    if transport == "tls" and measured:
        by_gbit[gbit][measured] = runs
if by_gbit:
    gbit, points = max(by_gbit.items(), key=lambda kv: len(kv[1]))
    if len(points) >= 2:
        (ra, runs_a), (rb, runs_b) = sorted(points.items())[-2:]
        pa, pb = (median([r.get("step_ms_p50") for r in x]) for x in (runs_a, runs_b))
        if pa is not None and pb is not None:
            metric(f"{program}_round_trips_per_step_from_rtt_{gbit}g", "round trips", "lower", None,
                   (pb - pa) / (rb - ra), floor=1, between_rtt_ms=[ra, rb])
        sa, sb = (median([r.get("startup_s") for r in x]) for x in (runs_a, runs_b))
        if sa is not None and sb is not None:
            metric(f"startup_round_trips_from_rtt_{gbit}g", "round trips", "lower", None,
                   (sb - sa) * 1e3 / (rb - ra), between_rtt_ms=[ra, rb])
notes.append("traced round trips are the client's answered calls in its hop trace "
             "(CUMUX_HOP_TRACE); copies chunked over a socket (Link::calls_with_chunks, "
             "calls_into_chunks) send without marks and are not counted there; the "
             "from_rtt figures count every wait the link sees")

# TLS against plain TCP at the same link, medians of the alternating rounds.
for (transport, rtt, gbit), runs in groups.items():
    if transport != "plain" or ("tls", rtt, gbit) not in groups:
        continue
    tls = [r.get("step_ms_p50") for r in groups[("tls", rtt, gbit)]]
    plain = [r.get("step_ms_p50") for r in runs]
    t, p = median(tls), median(plain)
    metric(f"tls_over_plain_step_p50_rtt{rtt}ms_{gbit}g", "ratio", "lower", None,
           t / p if t and p else None, target=1.03, tls_ms=tls, plain_ms=plain)

native_bw = next((b["metrics"] for b in bws if b["transport"] == "native"), {})
for b in bws:
    if b["transport"] == "native":
        continue
    tag = label(b["rtt"], b["gbit"], b["transport"])
    link = links.get((b["rtt"], b["gbit"]), {})
    rate = float(b["gbit"]) / 8 if b["gbit"] not in ("", "-", "none") else None
    names = [n for n in b["metrics"] if n.endswith("_256m_gbps")] or \
        sorted(b["metrics"], key=lambda n: -b["metrics"][n])[:4]
    for n in sorted(names):
        v = b["metrics"][n]
        extra = {}
        if rate:
            extra.update(link_gbps=rate, of_link=sig(v / rate))
        if link.get("stream_gbps"):
            extra.update(bare_stream_gbps=link["stream_gbps"], of_bare_stream=sig(v / link["stream_gbps"]))
        metric(f"{n[:-5]}_{tag}_gbps", "GB/s", "higher", native_bw.get(n), v, **extra)

result = {"suite": "remote", "date": date, "gpu": gpu, "driver": driver, "cuda": cuda,
          "commit": commit, "program": program,
          "links": {("loopback" if g == "none" else f"rtt{r}ms_{g}g"): v
                    for (r, g), v in links.items()},
          "metrics": metrics}
write(path, result, metrics, notes)


print(f"{'metric':<48} {'unit':<11} {'native':>9} {'cumux':>9} {'ratio':>7}  more")
for m in metrics:
    more = {k: v for k, v in m.items() if k not in ("name", "unit", "better", "native", "cumux", "ratio")}
    print(f"{m['name']:<48} {m['unit']:<11} {fmt(m['native']):>9} {fmt(m['cumux']):>9} "
          f"{fmt(m['ratio']):>7}  {json.dumps(more) if more else ''}")
for (r, g), v in links.items():
    print(f"link rtt {r} ms, {g} Gbit/s: {json.dumps(v)}")
for n in notes:
    print(f"note: {n}")
print(f"wrote {path}")
