#!/usr/bin/env python3
"""Pinned-memory copy bandwidth through cumux, before and after zero-copy pinned memory.

Starts `cumux serve --device worker-cpu` (the CPU reference device in a worker
process, the path a GPU takes) on a private unix socket, then runs
bench/cuda/microbench `bandwidth` (synchronous cudaMemcpy, pinned and pageable,
4 KiB to 256 MiB) through `cumux run`, alternating CUMUX_PINNED=off (pinned
buffers are plain memory and copies carry their bytes: the old route) and the
default (cudaMallocHost buffers are memfds shared with server and worker;
large synchronous pageable copies staged through a pinned buffer of the
client's own), for ROUNDS rounds, and writes the median per figure as JSON. Needs a release
build and NVIDIA's compiler in .venv (scripts/setup-nvcc):

    cargo build --release
    python3 bench/cpu/pinned.py [--cumux target/release/cumux] [--rounds 3] [--out FILE]
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transport import ROOT, build_microbench  # noqa: E402

SIZES = ("4k", "64k", "1m", "16m", "256m")
KEPT = {
    f"{d}_{m}_{s}_gbps": "higher"
    for m in ("pinned", "pageable")
    for s in SIZES
    for d in ("htod", "dtoh")
}
MODES = {"before": "off", "after": "on"}


def run_one(cumux, address, exe, pinned):
    env = dict(os.environ, CUMUX_PINNED=pinned)
    env.pop("CUMUX_LOG", None)
    out = subprocess.run(
        [cumux, "run", "--server", address, "--", exe, "bandwidth", "1", str(256 << 20)],
        env=env, capture_output=True, text=True, timeout=900,
    )
    if out.returncode != 0:
        sys.exit(f"microbench with CUMUX_PINNED={pinned} failed:\n{out.stdout}\n{out.stderr}")
    metrics = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "metric":
            metrics[parts[1]] = float(parts[2])
    return metrics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cumux", default=os.path.join(ROOT, "target/release/cumux"))
    ap.add_argument("--device", default="worker-cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    opts = ap.parse_args()

    work = tempfile.mkdtemp(prefix="cumux-pinned-bench-")
    exe = build_microbench(work)
    address = f"unix:{work}/s.sock"
    server = subprocess.Popen(
        [opts.cumux, "serve", "--device", opts.device, "--memory", "2G", "--listen", address],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "server.log"), "w"),
    )
    try:
        deadline = time.time() + 30
        while not os.path.exists(f"{work}/s.sock"):
            if time.time() > deadline or server.poll() is not None:
                sys.exit("cumux serve did not start")
            time.sleep(0.05)
        samples = {mode: {} for mode in MODES}
        for r in range(opts.rounds):
            for mode, setting in MODES.items():
                for k, v in run_one(opts.cumux, address, exe, setting).items():
                    samples[mode].setdefault(k, []).append(v)
            print(f"round {r + 1}/{opts.rounds} done", file=sys.stderr)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)

    metrics = []
    for name, better in KEPT.items():
        if name not in samples["before"] or name not in samples["after"]:
            continue
        before = statistics.median(samples["before"][name])
        after = statistics.median(samples["after"][name])
        metrics.append({
            "name": name,
            "unit": "GB/s",
            "better": better,
            "before": round(before, 4),
            "after": round(after, 4),
            "ratio": round(after / before, 4) if before else None,
            "before_rounds": samples["before"][name],
            "after_rounds": samples["after"][name],
        })
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.processor())
    result = {
        "suite": "cpu-pinned",
        "date": datetime.date.today().isoformat(),
        "gpu": f"none: cumux serve --device {opts.device} (CPU reference device)",
        "driver": None,
        "cuda": "13.0 (nvcc from PyPI)",
        "commit": commit,
        "host": f"{cpu}, {os.cpu_count()} cores",
        "baseline": "before",
        "note": "Both columns are cumux on the same server in the same run, microbench "
                "`bandwidth` (synchronous cudaMemcpy, median of reps): 'before' is "
                "CUMUX_PINNED=off (cudaMallocHost buffers are plain memory, and every copy "
                "carries its bytes through the shared-memory rings, the server and the "
                "worker socket), 'after' the default: zero-copy pinned memory (the buffer "
                "is a memfd the worker maps; a copy names region, offset and length) and "
                "synchronous pageable copies of 1 MiB or more staged through the client's "
                "own two-slot pinned buffer. ratio = after / before; figures are the "
                "median of the rounds (each round's value is in *_rounds).",
        "rounds": opts.rounds,
        "metrics": metrics,
    }
    text = json.dumps(result, indent=2) + "\n"
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
