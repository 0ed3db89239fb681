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
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    ROOT, build_microbench, compare_medians, run_facts, run_microbench, start_server,
    write_result,
)

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
    args = ["bandwidth", "1", str(256 << 20)]
    return run_microbench(cumux, address, exe, args, env, 900, f"with CUMUX_PINNED={pinned}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cumux", default=os.path.join(ROOT, "target/release/cumux"))
    ap.add_argument("--device", default="worker-cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    opts = ap.parse_args()

    work = tempfile.mkdtemp(prefix="cumux-pinned-bench-")
    exe = build_microbench(work)
    server = None
    try:
        server, address = start_server(opts.cumux, work, "s", opts.device)
        samples = {mode: {} for mode in MODES}
        for r in range(opts.rounds):
            for mode, setting in MODES.items():
                for k, v in run_one(opts.cumux, address, exe, setting).items():
                    samples[mode].setdefault(k, []).append(v)
            print(f"round {r + 1}/{opts.rounds} done", file=sys.stderr)
    finally:
        if server:
            server.kill()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)

    metrics = compare_medians(KEPT, samples, "before", "after", lambda _: "GB/s",
                              skip_missing=True)
    facts = run_facts()
    result = {
        "suite": "cpu-pinned",
        "date": facts["date"],
        "gpu": f"none: cumux serve --device {opts.device} (CPU reference device)",
        "driver": None,
        "cuda": "13.0 (nvcc from PyPI)",
        "commit": facts["commit"],
        "host": facts["host"],
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
    write_result(result, opts.out)


if __name__ == "__main__":
    main()
