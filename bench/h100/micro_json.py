#!/usr/bin/env python3
"""Assembles bench/h100/microbench.sh's result: reads the `metric NAME VALUE UNIT`
lines of LOGS/SUB.native.txt and LOGS/SUB.cumux.txt and LOGS/notes.txt, writes
the results JSON that bench/README.md describes to PATH and prints a table.

    micro_json.py LOGS PATH DATE GPU DRIVER COMMIT MAX_BYTES
"""
import json, math, sys
logs, path, date, gpu, driver, commit, max_bytes = sys.argv[1:]
max_bytes = int(max_bytes)

def metrics(sub, way):
    found = {}
    try:
        with open(f"{logs}/{sub}.{way}.txt", errors="replace") as f:
            for line in f:
                p = line.split()
                if len(p) == 4 and p[0] == "metric":
                    try:
                        v = float(p[2])
                    except ValueError:
                        continue
                    if math.isfinite(v):
                        found[p[1]] = (v, p[3])
    except OSError:
        pass
    return found

# Every figure the program gives, so that one missing on both sides still shows.
expected = {
    "launch_rate": [("launch_rate", "launches/s"), ("launch_async_us", "us"), ("launch_issue_us", "us")],
    "launch_sync": [("launch_sync_p50_us", "us"), ("launch_sync_p99_us", "us")],
    "graph_replay": [("graph_100_kernels_us", "us"), ("graph_100_sync_p50_us", "us")],
    "sync_rtt": [("ctx_sync_p50_us", "us"), ("ctx_sync_p99_us", "us"),
                 ("mem_get_info_p50_us", "us"), ("mem_get_info_p99_us", "us")],
    "bandwidth": [],
}
for size, tag in [(4 << 10, "4k"), (64 << 10, "64k"), (1 << 20, "1m"), (16 << 20, "16m"), (256 << 20, "256m")]:
    if size <= max_bytes:
        for mode in ("pinned", "pageable"):
            for d in ("htod", "dtoh"):
                expected["bandwidth"].append((f"{d}_{mode}_{tag}_gbps", "GB/s"))

notes = [l.rstrip("\n") for l in open(f"{logs}/notes.txt") if l.strip()]
rows = []
for sub, names in expected.items():
    got = {way: metrics(sub, way) for way in ("native", "cumux")}
    order = [n for n, _ in names]
    for way in ("native", "cumux"):
        order += [n for n in got[way] if n not in order]
    units = dict(names)
    for way in ("native", "cumux"):
        lost = [n for n in order if n not in got[way]]
        if lost == order:
            notes.append(f"{way} {sub}: no figures")
        elif lost:
            notes.append(f"{way} {sub}: no figure for {', '.join(lost)}")
    for name in order:
        unit = units.get(name) or (got["native"].get(name) or got["cumux"].get(name))[1]
        raw = {way: (got[way][name][0] if name in got[way] else None) for way in ("native", "cumux")}
        vals = {way: (float(f"{v:.4g}") if v is not None else None) for way, v in raw.items()}
        ratio = None
        if raw["native"] and raw["cumux"] is not None:
            ratio = float(f"{raw['cumux'] / raw['native']:.4g}")
        better = "higher" if unit in ("GB/s", "launches/s") else "lower"
        rows.append({"name": name, "unit": unit, "better": better,
                     "native": vals["native"], "cumux": vals["cumux"], "ratio": ratio})

result = {"suite": "micro", "date": date, "gpu": gpu or None, "driver": driver or None,
          "cuda": "13.0", "commit": commit, "metrics": rows}
if notes:
    result["notes"] = notes
with open(path, "w") as f:
    # One metric a line: the shape of DESIGN.md, easy to read and to diff.
    head = {k: v for k, v in result.items() if k not in ("metrics", "notes")}
    text = json.dumps(head, indent=1)[:-2] + ',\n "metrics": [\n'
    text += ",\n".join("  " + json.dumps(r) for r in rows) + "\n ]"
    if notes:
        text += ',\n "notes": ' + json.dumps(notes, indent=1).replace("\n", "\n ")
    text += "\n}\n"
    json.loads(text)
    f.write(text)

def fmt(v):
    return "null" if v is None else f"{v:.4g}"
print(f"{'metric':<26} {'unit':<11} {'better':<7} {'native':>10} {'cumux':>10} {'ratio':>8}")
for r in rows:
    print(f"{r['name']:<26} {r['unit']:<11} {r['better']:<7} {fmt(r['native']):>10} {fmt(r['cumux']):>10} {fmt(r['ratio']):>8}")
for n in notes:
    print(f"note: {n}")
print(f"\nwrote {path}")
