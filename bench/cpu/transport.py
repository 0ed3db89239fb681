#!/usr/bin/env python3
"""Socket vs shared-memory transport on the CPU reference device, in one run.

Starts `cumux serve --device cpu` on a private unix socket, then runs
bench/cuda/microbench (launch_rate, launch_sync, sync_rtt, bandwidth) through
`cumux run`, alternating CUMUX_TRANSPORT=socket and shm for ROUNDS rounds, and
writes the median of the rounds per metric as JSON (bench/README.md, "CPU
transport"). Needs a release build and NVIDIA's compiler in .venv
(scripts/setup-nvcc):

    cargo build --release
    python3 bench/cpu/transport.py [--cumux target/release/cumux] [--rounds 3] [--out FILE]
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

# (subcommand args, metrics kept: name -> better)
RUNS = [
    (["launch_rate", "20000"], {"launch_issue_us": "lower", "launch_async_us": "lower"}),
    (["launch_sync", "2000"], {"launch_sync_p50_us": "lower", "launch_sync_p99_us": "lower"}),
    (
        ["sync_rtt", "5000"],
        {
            "ctx_sync_p50_us": "lower",
            "ctx_sync_p99_us": "lower",
            "mem_get_info_p50_us": "lower",
            "mem_get_info_p99_us": "lower",
        },
    ),
    (
        ["bandwidth", "5", str(16 << 20)],
        {
            f"{d}_pageable_{s}_gbps": "higher"
            for s in ("4k", "64k", "1m", "16m")
            for d in ("htod", "dtoh")
        },
    ),
]


def run_one(cumux, address, exe, args, transport):
    env = dict(os.environ, CUMUX_TRANSPORT=transport)
    env.pop("CUMUX_LOG", None)
    return run_microbench(cumux, address, exe, args, env, 600, f"{args} over {transport}")


def unit(name):
    return "GB/s" if name.endswith("_gbps") else "us"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cumux", default=os.path.join(ROOT, "target/release/cumux"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    opts = ap.parse_args()

    work = tempfile.mkdtemp(prefix="cumux-transport-bench-")
    exe = build_microbench(work)
    server = None
    try:
        server, address = start_server(opts.cumux, work, "s", "cpu")
        samples = {"socket": {}, "shm": {}}
        for r in range(opts.rounds):
            for args, _ in RUNS:
                for transport in ("socket", "shm"):
                    got = run_one(opts.cumux, address, exe, args, transport)
                    for k, v in got.items():
                        samples[transport].setdefault(k, []).append(v)
            print(f"round {r + 1}/{opts.rounds} done", file=sys.stderr)
    finally:
        if server:
            server.kill()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)

    metrics = []
    for _, kept in RUNS:
        metrics += compare_medians(kept, samples, "socket", "shm", unit)
    facts = run_facts()
    result = {
        "suite": "cpu-transport",
        "date": facts["date"],
        "gpu": "none: cumux serve --device cpu (CPU reference device)",
        "driver": None,
        "cuda": "13.0 (nvcc from PyPI)",
        "commit": facts["commit"],
        "host": facts["host"],
        "baseline": "socket",
        "note": "Both columns are cumux on the same server in the same run: 'socket' is "
                "CUMUX_TRANSPORT=socket (length-prefixed frames on the unix socket), 'shm' "
                "the default shared-memory rings. ratio = shm / socket; figures are the "
                "median of the rounds (each round's value is in *_rounds).",
        "rounds": opts.rounds,
        "metrics": metrics,
    }
    write_result(result, opts.out)


if __name__ == "__main__":
    main()
