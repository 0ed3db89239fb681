#!/usr/bin/env python3
"""Server <-> worker over its socket vs shared memory, on worker-cpu, in one run.

Starts two `cumux serve --device worker-cpu` servers on private unix sockets,
one with CUMUX_WORKER_TRANSPORT=socket (the server <-> worker hop as before
issue 5: length-prefixed frames on the socket pair) and one with the default
(that hop through a shared-memory area); the client <-> server hop is shared
memory for both. Runs bench/cuda/microbench (launch_rate, launch_sync,
sync_rtt, bandwidth) through `cumux run`, alternating the servers for ROUNDS
rounds, and writes the median of the rounds per metric as JSON. Needs a
release build and NVIDIA's compiler in .venv (scripts/setup-nvcc):

    cargo build --release
    python3 bench/cpu/worker_transport.py [--cumux target/release/cumux] [--rounds 3] [--out FILE]
"""

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    ROOT, build_microbench, compare_medians, run_facts, run_microbench, server_log,
    start_server, write_result,
)
from transport import RUNS, unit  # noqa: E402

MODES = ("socket", "shm")


def start_mode_server(cumux, work, mode):
    env = dict(os.environ)
    env.pop("CUMUX_LOG", None)
    if mode == "socket":
        env["CUMUX_WORKER_TRANSPORT"] = "socket"
    else:
        env.pop("CUMUX_WORKER_TRANSPORT", None)
    return start_server(cumux, work, mode, "worker-cpu", env)


def run_one(cumux, address, exe, args):
    env = dict(os.environ)
    env.pop("CUMUX_LOG", None)
    env.pop("CUMUX_TRANSPORT", None)
    return run_microbench(cumux, address, exe, args, env, 600, f"{args} on {address}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cumux", default=os.path.join(ROOT, "target/release/cumux"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    opts = ap.parse_args()

    work = tempfile.mkdtemp(prefix="cumux-worker-transport-bench-")
    exe = build_microbench(work)
    servers = {}
    try:
        for mode in MODES:
            servers[mode] = start_mode_server(opts.cumux, work, mode)
        samples = {m: {} for m in MODES}
        for r in range(opts.rounds):
            for args, _ in RUNS:
                for mode in MODES:
                    got = run_one(opts.cumux, servers[mode][1], exe, args)
                    for k, v in got.items():
                        samples[mode].setdefault(k, []).append(v)
            print(f"round {r + 1}/{opts.rounds} done", file=sys.stderr)
        for mode in MODES:
            log = open(server_log(work, mode)).read()
            if "panicked" in log:
                sys.exit(f"the {mode} server panicked:\n{log}")
    finally:
        for server, _ in servers.values():
            server.kill()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)

    metrics = []
    for _, kept in RUNS:
        metrics += compare_medians(kept, samples, "socket", "shm", unit)
    facts = run_facts()
    result = {
        "suite": "cpu-worker-shm",
        "date": facts["date"],
        "gpu": "none: cumux serve --device worker-cpu (CPU reference device in worker processes)",
        "driver": None,
        "cuda": "13.0 (nvcc from PyPI)",
        "commit": facts["commit"],
        "host": facts["host"],
        "baseline": "socket",
        "note": "Both columns are cumux in the same run, alternating two servers: 'socket' has "
                "CUMUX_WORKER_TRANSPORT=socket (server <-> worker frames on the socket pair, "
                "as before issue 5), 'shm' the default shared-memory area for that hop; "
                "client <-> server is shared memory in both. ratio = shm / socket; figures "
                "are the median of the rounds (each round's value is in *_rounds).",
        "rounds": opts.rounds,
        "metrics": metrics,
    }
    write_result(result, opts.out)


if __name__ == "__main__":
    main()
