#!/usr/bin/env python3
"""Copies over loopback TCP against a bare TCP stream, in one run.

Starts `cumux serve --device cpu` on a loopback TCP port, then alternates for
ROUNDS rounds: bench/cuda/microbench `bandwidth` (synchronous cudaMemcpy,
pageable and pinned, up to 256 MiB) through `cumux run --server tcp:…`, and a
bare TCP stream (one connection, 1 GiB, Python's sendall into recv_into) on the
same loopback. Writes the medians as JSON: each copy figure against the bare
stream (issue 24: 256 MiB copies at >= 80 % of it). Needs a release build and
NVIDIA's compiler in .venv (scripts/setup-nvcc):

    cargo build --release
    python3 bench/cpu/tcp.py [--cumux target/release/cumux] [--rounds 3] [--out FILE]
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    ROOT, build_microbench, run_facts, run_microbench, server_log, write_result,
)

STREAM_BYTES = 1 << 30
KEPT = [f"{d}_{m}_{s}_gbps" for s in ("1m", "16m", "256m") for m in ("pageable", "pinned")
        for d in ("htod", "dtoh")]


def bare_stream_gbps():
    """GB/s of one loopback TCP connection carrying STREAM_BYTES."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def sink():
        conn, _ = listener.accept()
        buf = memoryview(bytearray(4 << 20))
        got = 0
        while got < STREAM_BYTES:
            n = conn.recv_into(buf)
            if n == 0:
                break
            got += n
        conn.sendall(b"k")
        conn.close()

    t = threading.Thread(target=sink)
    t.start()
    s = socket.create_connection(("127.0.0.1", port))
    chunk = bytes(64 << 20)
    started = time.perf_counter()
    for _ in range(STREAM_BYTES // len(chunk)):
        s.sendall(chunk)
    s.recv(1)
    took = time.perf_counter() - started
    s.close()
    t.join()
    listener.close()
    return STREAM_BYTES / took / 1e9


def start_tcp_server(cumux, work):
    log = open(server_log(work, "tcp"), "w")
    server = subprocess.Popen(
        [cumux, "serve", "--device", "cpu", "--memory", "2G", "--listen", "tcp:127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )
    line = server.stdout.readline()
    address = next((w.rstrip(";") for w in line.split() if w.startswith("tcp:")), None)
    if not address:
        server.kill()
        sys.exit(f"cumux serve did not listen: {line}")
    return server, address


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cumux", default=os.path.join(ROOT, "target/release/cumux"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    opts = ap.parse_args()

    work = tempfile.mkdtemp(prefix="cumux-tcp-bench-")
    exe = build_microbench(work)
    server = None
    bare, copies = [], {}
    try:
        server, address = start_tcp_server(opts.cumux, work)
        env = dict(os.environ)
        env.pop("CUMUX_LOG", None)
        for r in range(opts.rounds):
            bare.append(bare_stream_gbps())
            got = run_microbench(opts.cumux, address, exe, ["bandwidth", "1", str(256 << 20)],
                                 env, 600, "bandwidth over tcp")
            for k, v in got.items():
                copies.setdefault(k, []).append(v)
            print(f"round {r + 1}/{opts.rounds}: bare {bare[-1]:.2f} GB/s, "
                  f"htod 256m {got.get('htod_pageable_256m_gbps', 0):.2f}", file=sys.stderr)
    finally:
        if server:
            server.kill()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)

    stream = statistics.median(bare)
    metrics = []
    for name in KEPT:
        if name not in copies:
            continue
        value = statistics.median(copies[name])
        metrics.append({
            "name": name,
            "unit": "GB/s",
            "better": "higher",
            "bare_tcp": round(stream, 4),
            "cumux": round(value, 4),
            "ratio": round(value / stream, 4),
            "cumux_rounds": copies[name],
        })
    facts = run_facts()
    result = {
        "suite": "cpu-tcp-bandwidth",
        "date": facts["date"],
        "gpu": "none: cumux serve --device cpu over loopback TCP",
        "driver": None,
        "cuda": "13.0 (nvcc from PyPI)",
        "commit": facts["commit"],
        "host": facts["host"],
        "baseline": "bare_tcp",
        "note": "bare_tcp is one loopback TCP connection (Python sendall/recv_into, 1 GiB) "
                "in the same run, alternating with the copies; cumux is a synchronous "
                "cudaMemcpy through cumux run over plain TCP to the CPU device (the bytes "
                "cross the socket once; the CPU device's memory is the server's). ratio = "
                "cumux / bare_tcp; medians of the rounds.",
        "bare_tcp_rounds": bare,
        "rounds": opts.rounds,
        "metrics": metrics,
    }
    write_result(result, opts.out)


if __name__ == "__main__":
    main()
