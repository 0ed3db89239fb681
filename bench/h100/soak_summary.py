#!/usr/bin/env python3
"""Sums up soak.sh's samples per kind of server memory: for each column
(RssAnon, RssFile, RssShmem, mappings, fds, threads, workers, their RSS) the
first and second half's means, a least-squares slope over the second half
with its standard error, and the quiet points (no sessions, every client
gone) against the baseline before any client; then a verdict on each.

    soak_summary.py SAMPLES.csv QUIET.csv

SAMPLES.csv is soak.sh's samples (a header line, then one row per sample);
QUIET.csv holds the quiet points, one row per point: a label (baseline,
half, end), then the same columns as the samples.
"""

import csv
import math
import sys

# The columns judged, with how much change over a half counts as growth
# whatever the noise: a leak must be big enough to matter over 30 minutes.
KINDS = [
    ("rss_anon_kib", "RssAnon KiB", 4096),
    ("rss_file_kib", "RssFile KiB", 4096),
    ("rss_shmem_kib", "RssShmem KiB", 4096),
    ("maps", "mappings", 16),
    ("fds", "open fds", 8),
    ("server_threads", "threads", 4),
    ("workers", "worker processes", 2),
    ("workers_rss_kib", "workers' RSS KiB", 16384),
    ("workers_anon_kib", "workers' RssAnon KiB", 16384),
    ("workers_file_kib", "workers' RssFile KiB", 16384),
]


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def slope(points):
    """Least-squares slope (per minute) of (seconds, value) points, and its
    standard error; None with fewer than 3 points."""
    n = len(points)
    if n < 3:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    residual = sum((y - my - b * (x - mx)) ** 2 for x, y in points)
    se = math.sqrt(residual / (n - 2) / sxx)
    return b * 60, se * 60


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main(samples_path, quiet_path):
    rows = read_rows(samples_path)
    quiet = {}
    try:
        with open(quiet_path, newline="") as f:
            for row in csv.reader(f):
                if row:
                    quiet[row[0]] = row[1:]
    except FileNotFoundError:
        pass
    header = list(rows[0].keys()) if rows else []
    if not rows:
        print("no samples")
        return
    end_s = number(rows[-1]["elapsed_s"]) or 0
    half_s = end_s / 2
    print(f"per kind over {len(rows)} samples, {end_s:.0f} s (second half from {half_s:.0f} s);")
    print("  slope: least squares over the second half, per minute, ± its standard error;")
    print("  quiet points: no sessions, every client gone, workers reaped (baseline: before any client)")
    verdicts = []
    for key, label, floor in KINDS:
        if key not in header:
            continue
        series = [(number(r["elapsed_s"]), number(r[key])) for r in rows]
        series = [(x, y) for x, y in series if x is not None and y is not None]
        if not series:
            continue
        first = [y for x, y in series if x < half_s]
        second = [(x, y) for x, y in series if x >= half_s]
        fit = slope(second)
        column = header.index(key) - 1  # the quiet rows have no elapsed_s
        points = {}
        for name in ("baseline", "half", "end"):
            if name in quiet and 0 <= column < len(quiet[name]):
                points[name] = number(quiet[name][column])
        line = f"  {label:<18}"
        if first:
            line += f" mean {sum(first) / len(first):>10.0f} → {sum(y for _, y in second) / max(len(second), 1):>10.0f}"
        line += f"  min {min(y for _, y in series):.0f} max {max(y for _, y in series):.0f}"
        if fit:
            line += f"  slope {fit[0]:+.1f} ± {fit[1]:.1f}/min"
        quiet_text = ", ".join(
            f"{name} {value:.0f}" for name, value in points.items() if value is not None
        )
        if quiet_text:
            line += f"  quiet: {quiet_text}"
        print(line)
        # Growth: the slope is clearly above its noise (3 standard errors)
        # and adds more than the floor over a half; or the quiet point at the
        # end is above the one at half time by more than the floor.
        grows = []
        if fit and fit[0] > 3 * fit[1] and fit[0] * half_s / 60 > floor:
            grows.append(f"+{fit[0] * half_s / 60:.0f} over the second half")
        if points.get("half") is not None and points.get("end") is not None:
            if points["end"] - points["half"] > floor:
                grows.append(f"quiet end {points['end'] - points['half']:+.0f} against half time")
        if grows:
            verdicts.append(f"{label} GROWS ({'; '.join(grows)})")
    print("verdict: " + ("; ".join(verdicts) if verdicts else "flat: no kind grows past its noise and floor"))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
