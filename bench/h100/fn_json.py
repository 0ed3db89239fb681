#!/usr/bin/env python3
"""Assembles bench/h100/functions.sh's result from its runs folder: native.txt
(fn_native's metric lines), load-SIDE-FN-cK.txt (fn_load's output; SIDE cumux
or fastapi), register.txt, checks.txt, notes.txt; writes the results JSON
(bench/README.md's shape; FastAPI+CuPy in `fastapi` beside each figure) and
prints a table.

    fn_json.py RUNS PATH DATE GPU DRIVER CUDA COMMIT
"""
import glob
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_json import fmt, write  # noqa: E402

runs, path, date, gpu, driver, cuda, commit = sys.argv[1:8]


def lines(name):
    try:
        with open(os.path.join(runs, name), errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


native = {}
for line in lines("native.txt"):
    p = line.split()
    if len(p) == 4 and p[0] == "metric":
        native[p[1]] = float(p[2])

loads = {}  # (side, fn, clients) -> {requests, errors, rps, p50_us, p99_us}
for file in glob.glob(os.path.join(runs, "load-*-c*.txt")):
    m = re.match(r"load-(\w+)-(\w+)-c(\d+)\.txt$", os.path.basename(file))
    if not m:
        continue
    got = {}
    for line in lines(os.path.basename(file)):
        p = line.split(None, 1)
        if len(p) == 2:
            try:
                got[p[0]] = float(p[1])
            except ValueError:
                got[p[0]] = p[1]
    loads[(m.group(1), m.group(2), int(m.group(3)))] = got

registrations = [float(l.split()[1]) for l in lines("register.txt") if l.startswith("register_ms ")]
checks = [l for l in lines("checks.txt") if l.startswith("check ")]
notes = [l for l in lines("notes.txt") if l.strip()]
metrics = []


def sig(v):
    return None if v is None else float(f"{v:.4g}")


def load(side, fn, clients, key):
    v = loads.get((side, fn, clients), {}).get(key)
    return v if isinstance(v, float) and (key == "rps" or loads[(side, fn, clients)].get("requests")) else None


def metric(name, unit, better, nat, cum, **extra):
    ratio = cum / nat if nat and cum is not None else None
    row = {"name": name, "unit": unit, "better": better, "native": sig(nat), "cumux": sig(cum),
           "ratio": sig(ratio)}
    row.update({k: (sig(v) if isinstance(v, float) else v) for k, v in extra.items()})
    metrics.append(row)


def versus(cum, fa):
    return sig(cum / fa) if cum is not None and fa else None


for q, target in (("p50", 30.0), ("p99", 100.0)):
    nat = native.get(f"vadd_launch_sync_{q}_us")
    cum, fa = load("cumux", "vadd", 1, f"{q}_us"), load("fastapi", "vadd", 1, f"{q}_us")
    metric(f"vadd_invoke_{q}_us", "us", "lower", nat, cum,
           overhead_us=(cum - nat) if cum is not None and nat is not None else None,
           target_overhead_us=target, native_full_us=native.get(f"vadd_full_{q}_us"),
           fastapi=fa, vs_fastapi=versus(cum, fa))

clients = sorted({k[2] for k in loads if k[1] == "vadd"})
for c in clients:
    cum, fa = load("cumux", "vadd", c, "rps"), load("fastapi", "vadd", c, "rps")
    metric(f"vadd_invocations_per_s_c{c}", "1/s", "higher", None, cum, fastapi=fa,
           vs_fastapi=versus(cum, fa), target_vs_fastapi=5.0,
           errors=loads.get(("cumux", "vadd", c), {}).get("errors"))
    cum, fa = load("cumux", "vadd", c, "p99_us"), load("fastapi", "vadd", c, "p99_us")
    metric(f"vadd_p99_us_c{c}", "us", "lower", None, cum, p50_us=load("cumux", "vadd", c, "p50_us"),
           fastapi=fa, fastapi_p50_us=load("fastapi", "vadd", c, "p50_us"),
           vs_fastapi=versus(cum, fa), target_vs_fastapi=0.2)

if registrations:
    metric("register_cold_ms", "ms", "lower", None, registrations[0],
           note="the first registration: the tenant's lane (its session) opened, the module loaded")
if len(registrations) > 1:
    metric("register_ms", "ms", "lower", None, statistics.median(registrations[1:]),
           note=f"median of {len(registrations) - 1} more registrations under new names (module loaded each time)")

for fn in sorted({k[1] for k in loads if k[1].startswith("mlp")}):
    batch = fn[len("mlp_b"):]
    for q in ("p50", "p99"):
        cum, fa = load("cumux", fn, 1, f"{q}_us"), load("fastapi", fn, 1, f"{q}_us")
        metric(f"{fn}_invoke_{q}_us", "us", "lower", native.get(f"mlp_b{batch}_full_{q}_us"), cum,
               fastapi=fa, vs_fastapi=versus(cum, fa))
    for c in sorted({k[2] for k in loads if k[1] == fn and k[2] > 1}):
        cum, fa = load("cumux", fn, c, "rps"), load("fastapi", fn, c, "rps")
        metric(f"{fn}_invocations_per_s_c{c}", "1/s", "higher", None, cum, fastapi=fa,
               vs_fastapi=versus(cum, fa), p99_us=load("cumux", fn, c, "p99_us"),
               fastapi_p99_us=load("fastapi", fn, c, "p99_us"))

for (side, fn, c), got in sorted(loads.items()):
    if got.get("errors") or not got.get("requests"):
        notes.append(f"{side} {fn} with {c} clients: {int(got.get('requests', 0))} answered, "
                     f"{int(got.get('errors', 0))} errors; {got.get('first_error', '')}".strip())

result = {"suite": "functions", "date": date, "gpu": gpu, "driver": driver, "cuda": cuda,
          "commit": commit,
          "checks": {"passed": sum("PASS" in c for c in checks), "total": len(checks)},
          "baseline": "native: the same kernels in a CUDA program (fn_native.cu); fastapi: "
                      "FastAPI + uvicorn + CuPy doing the same work per request (fn_fastapi.py), "
                      "driven by the same client (fn_load.c)",
          "metrics": metrics}
write(path, result, metrics, notes)


print(f"{'metric':<34} {'unit':<5} {'native':>9} {'cumux':>9} {'ratio':>7} {'fastapi':>9} {'cumux/fastapi':>13}")
for m in metrics:
    print(f"{m['name']:<34} {m['unit']:<5} {fmt(m['native']):>9} {fmt(m['cumux']):>9} {fmt(m['ratio']):>7} "
          f"{fmt(m.get('fastapi')):>9} {fmt(m.get('vs_fastapi')):>13}")
for c in checks:
    print(c)
for n in notes:
    print(f"note: {n}")
print(f"wrote {path}")
