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
from transport import ROOT, RUNS, build_microbench  # noqa: E402

MODES = ("socket", "shm")


def start_server(cumux, work, mode):
    sock = os.path.join(work, f"{mode}.sock")
    env = dict(os.environ)
    env.pop("CUMUX_LOG", None)
    if mode == "socket":
        env["CUMUX_WORKER_TRANSPORT"] = "socket"
    else:
        env.pop("CUMUX_WORKER_TRANSPORT", None)
    server = subprocess.Popen(
        [cumux, "serve", "--device", "worker-cpu", "--memory", "2G", "--listen", f"unix:{sock}"],
        env=env, stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(work, f"{mode}-server.log"), "w"),
    )
    deadline = time.time() + 30
    while not os.path.exists(sock):
        if time.time() > deadline or server.poll() is not None:
            sys.exit(f"cumux serve ({mode}) did not start")
        time.sleep(0.05)
    return server, f"unix:{sock}"


def run_one(cumux, address, exe, args):
    env = dict(os.environ)
    env.pop("CUMUX_LOG", None)
    env.pop("CUMUX_TRANSPORT", None)
    out = subprocess.run(
        [cumux, "run", "--server", address, "--", exe, *args],
        env=env, capture_output=True, text=True, timeout=600,
    )
    if out.returncode != 0:
        sys.exit(f"microbench {args} on {address} failed:\n{out.stdout}\n{out.stderr}")
    metrics = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "metric":
            metrics[parts[1]] = float(parts[2])
    return metrics


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
            servers[mode] = start_server(opts.cumux, work, mode)
        samples = {m: {} for m in MODES}
        for r in range(opts.rounds):
            for args, _ in RUNS:
                for mode in MODES:
                    got = run_one(opts.cumux, servers[mode][1], exe, args)
                    for k, v in got.items():
                        samples[mode].setdefault(k, []).append(v)
            print(f"round {r + 1}/{opts.rounds} done", file=sys.stderr)
        for mode in MODES:
            log = open(os.path.join(work, f"{mode}-server.log")).read()
            if "panicked" in log:
                sys.exit(f"the {mode} server panicked:\n{log}")
    finally:
        for server, _ in servers.values():
            server.kill()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)

    metrics = []
    for _, kept in RUNS:
        for name, better in kept.items():
            sock = statistics.median(samples["socket"][name])
            shm = statistics.median(samples["shm"][name])
            metrics.append({
                "name": name,
                "unit": "GB/s" if name.endswith("_gbps") else "us",
                "better": better,
                "socket": round(sock, 4),
                "shm": round(shm, 4),
                "ratio": round(shm / sock, 4) if sock else None,
                "socket_rounds": samples["socket"][name],
                "shm_rounds": samples["shm"][name],
            })
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.processor())
    result = {
        "suite": "cpu-worker-shm",
        "date": datetime.date.today().isoformat(),
        "gpu": "none: cumux serve --device worker-cpu (CPU reference device in worker processes)",
        "driver": None,
        "cuda": "13.0 (nvcc from PyPI)",
        "commit": commit,
        "host": f"{cpu}, {os.cpu_count()} cores",
        "baseline": "socket",
        "note": "Both columns are cumux in the same run, alternating two servers: 'socket' has "
                "CUMUX_WORKER_TRANSPORT=socket (server <-> worker frames on the socket pair, "
                "as before issue 5), 'shm' the default shared-memory area for that hop; "
                "client <-> server is shared memory in both. ratio = shm / socket; figures "
                "are the median of the rounds (each round's value is in *_rounds).",
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
