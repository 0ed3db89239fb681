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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NVCC_ROOT = os.path.join(ROOT, ".venv/lib/python3.11/site-packages/nvidia/cu13")

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


def build_microbench(out_dir):
    exe = os.path.join(out_dir, "microbench")
    nvcc = os.path.join(NVCC_ROOT, "bin/nvcc")
    subprocess.run(
        [nvcc, "-O2", "-arch=sm_90", "-L" + os.path.join(NVCC_ROOT, "lib"), "-o", exe,
         os.path.join(ROOT, "bench/cuda/microbench.cu")],
        check=True,
    )
    return exe


def run_one(cumux, address, exe, args, transport):
    env = dict(os.environ, CUMUX_TRANSPORT=transport)
    env.pop("CUMUX_LOG", None)
    out = subprocess.run(
        [cumux, "run", "--server", address, "--", exe, *args],
        env=env, capture_output=True, text=True, timeout=600,
    )
    if out.returncode != 0:
        sys.exit(f"microbench {args} over {transport} failed:\n{out.stdout}\n{out.stderr}")
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

    work = tempfile.mkdtemp(prefix="cumux-transport-bench-")
    exe = build_microbench(work)
    address = f"unix:{work}/s.sock"
    server = subprocess.Popen(
        [opts.cumux, "serve", "--device", "cpu", "--memory", "2G", "--listen", address],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "server.log"), "w"),
    )
    try:
        deadline = time.time() + 30
        while not os.path.exists(f"{work}/s.sock"):
            if time.time() > deadline or server.poll() is not None:
                sys.exit("cumux serve did not start")
            time.sleep(0.05)
        samples = {"socket": {}, "shm": {}}
        for r in range(opts.rounds):
            for args, _ in RUNS:
                for transport in ("socket", "shm"):
                    got = run_one(opts.cumux, address, exe, args, transport)
                    for k, v in got.items():
                        samples[transport].setdefault(k, []).append(v)
            print(f"round {r + 1}/{opts.rounds} done", file=sys.stderr)
    finally:
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
        "suite": "cpu-transport",
        "date": datetime.date.today().isoformat(),
        "gpu": "none: cumux serve --device cpu (CPU reference device)",
        "driver": None,
        "cuda": "13.0 (nvcc from PyPI)",
        "commit": commit,
        "host": f"{cpu}, {os.cpu_count()} cores",
        "baseline": "socket",
        "note": "Both columns are cumux on the same server in the same run: 'socket' is "
                "CUMUX_TRANSPORT=socket (length-prefixed frames on the unix socket), 'shm' "
                "the default shared-memory rings. ratio = shm / socket; figures are the "
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
