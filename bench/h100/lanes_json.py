#!/usr/bin/env python3
"""Assembles bench/h100/lanes.sh's result: the medians over rounds of each
256 MiB copy figure per path and lane count, against native, the link's rate
and the bare streams on the same path (one, and as many as the lanes), as
the results JSON (bench/README.md's shape) and a table.

    lanes_json.py MANIFEST OUT_DIR GPU DRIVER COMMIT GBIT SLOW_GBIT [SIZE] [CUDA]

SIZE names the copies' size as microbench does (256m).

Manifest lines, tab-separated: `link NAME FILE`, `copies NAME LANES PATH FILE RC`.
"""
import collections
import datetime
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_json import fmt, write  # noqa: E402

manifest, out_dir, gpu, driver, commit, gbit, slow_gbit = sys.argv[1:8]
size = sys.argv[8] if len(sys.argv) > 8 else "256m"
cuda = sys.argv[9] if len(sys.argv) > 9 else None


def figures(file, prefix):
    """{name: value} of the lines `prefix NAME VALUE …` in `file`."""
    got = {}
    try:
        with open(file, errors="replace") as f:
            for line in f:
                words = line.split()
                if prefix and len(words) >= 3 and words[0] == prefix:
                    got[words[1]] = float(words[2])
                elif not prefix and len(words) >= 2:
                    try:
                        got[words[0]] = float(words[1])
                    except ValueError:
                        pass
    except OSError:
        pass
    return got


links, runs = {}, collections.defaultdict(list)
with open(manifest) as f:
    for line in f:
        cols = line.rstrip("\n").split("\t")
        if cols[0] == "link":
            links[cols[1]] = figures(cols[2], None)
        elif cols[0] == "copies" and cols[5] == "0":
            runs[(cols[3], cols[2])].append(figures(cols[4], "metric"))


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def sig(v):
    return None if v is None else float(f"{v:.4g}")


KINDS = [f"{d}_{m}_{size}_gbps" for d in ("htod", "dtoh") for m in ("pageable", "pinned")]
native = {k: median([r.get(k) for r in runs.get(("native", "-"), [])]) for k in KINDS}
link_of = {"loop-tls": "loopback", "loop-plain": "loopback",
           f"relay-{gbit}": f"0.5ms-{gbit}g", f"relay-{slow_gbit}": f"0.5ms-{slow_gbit}g"}
metrics, notes, table = [], [], []
for (path, lanes), rs in sorted(runs.items()):
    if path == "native":
        continue
    link = links.get(link_of.get(path, ""), {})
    rate = float(path.split("-")[1]) / 8 if path.startswith("relay-") else None
    # The bare comparison: as many streams as cumux used (lanes, or one).
    bare = link.get("streams_gbps") if lanes not in ("0", "-") else link.get("stream_gbps")
    row = [path, lanes]
    for k in KINDS:
        v = median([r.get(k) for r in rs])
        extra = {"path": path, "lanes": int(lanes), "rounds": [r.get(k) for r in rs]}
        if rate:
            extra.update(link_gbps=rate, of_link=sig(v / rate) if v else None)
        if bare:
            extra.update(bare_gbps=bare, of_bare=sig(v / bare) if v else None)
        ratio = v / native[k] if v and native.get(k) else None
        metrics.append({"name": f"{k[:-5]}_{path}_lanes{lanes}_gbps", "unit": "GB/s",
                        "better": "higher", "native": sig(native.get(k)), "cumux": sig(v),
                        "ratio": sig(ratio), **extra})
        row.append(fmt(v))
    row += [fmt(rate), fmt(bare)]
    table.append(row)

print(f"{size} copies, GB/s (medians of the rounds):")
print(f"{'path':14} {'lanes':>5} {'htod pg':>8} {'htod pin':>8} {'dtoh pg':>8} {'dtoh pin':>8} {'link':>6} {'bare':>6}")
print(f"{'native':14} {'-':>5} " + " ".join(f"{fmt(native[k]):>8}" for k in KINDS))
for r in table:
    print(f"{r[0]:14} {r[1]:>5} " + " ".join(f"{x:>8}" for x in r[2:6]) + f" {r[6]:>6} {r[7]:>6}")
print("bare streams: " + "; ".join(f"{n}: {v}" for n, v in links.items()))

date = datetime.date.today().isoformat()
slug = next((w.lower() for w in gpu.split() if any(c.isdigit() for c in w)), "gpu")
result = {"suite": "lanes", "date": date, "gpu": gpu, "driver": driver, "cuda": cuda, "commit": commit,
          "links": links, "metrics": metrics}
path = os.path.join(out_dir, f"{date}-{slug}-lanes-{commit}.json")
write(path, result, metrics, notes)
print(f"wrote {path}")
