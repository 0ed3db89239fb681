#!/usr/bin/env python3
"""Copies over loopback TCP against a bare TCP stream, in one run.

Starts `cumux serve --device cpu` on a loopback TCP port, then alternates for
ROUNDS rounds: bench/cuda/microbench `bandwidth` (synchronous cudaMemcpy,
pageable and pinned, up to 256 MiB) through `cumux run --server tcp:…`, and a
bare TCP stream (as many connections as the session opens: its own and its
`--lanes`, default 4; 1 GiB in all, Python's sendall into recv_into) on the
same loopback. Writes the medians as JSON: each copy figure against the bare
stream (issue 24: 256 MiB copies at >= 80 % of it). `--device worker-cpu`
puts a worker process behind the server, as a GPU has; `--transports
plain,tls` measures both (TLS: the server's self-signed certificate, pinned).
`--cumux` given twice or more is an A/B of those builds, alternating within
each round. `--device cuda` runs on a GPU machine (with native figures from
the same program). Needs a release build and NVIDIA's compiler (in .venv from
scripts/setup-nvcc, or NVCC=):

    cargo build --release
    python3 bench/cpu/tcp.py [--cumux target/release/cumux ...] [--rounds 3] [--out FILE]
        [--device cpu|worker-cpu|cuda] [--transports plain[,tls]] [--lanes N]
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


def bare_stream_gbps(streams=1):
    """GB/s of `streams` loopback TCP connections at once carrying STREAM_BYTES
    between them (each its share, sent from a thread of its own)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(streams)
    port = listener.getsockname()[1]
    chunk = bytes(16 << 20)
    share = STREAM_BYTES // streams // len(chunk) * len(chunk)

    def sink(conn):
        buf = memoryview(bytearray(4 << 20))
        got = 0
        while got < share:
            n = conn.recv_into(buf)
            if n == 0:
                break
            got += n
        conn.sendall(b"k")
        conn.close()

    def accept_all():
        sinks = [threading.Thread(target=sink, args=(listener.accept()[0],))
                 for _ in range(streams)]
        for t in sinks:
            t.start()
        for t in sinks:
            t.join()

    def source(s):
        for _ in range(share // len(chunk)):
            s.sendall(chunk)
        s.recv(1)

    acceptor = threading.Thread(target=accept_all)
    acceptor.start()
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(streams)]
    sources = [threading.Thread(target=source, args=(c,)) for c in conns]
    started = time.perf_counter()
    for t in sources:
        t.start()
    for t in sources:
        t.join()
    took = time.perf_counter() - started
    for c in conns:
        c.close()
    acceptor.join()
    listener.close()
    return share * streams / took / 1e9


def start_tcp_server(cumux, work, device, transport):
    """`cumux serve` on a loopback port: plain, or TLS with a self-signed
    certificate made in WORK. (process, address, client environment)."""
    log = open(server_log(work, transport), "w")
    env = dict(os.environ)
    env["XDG_STATE_HOME"] = os.path.join(work, "state")
    # TLS on a port every interface reaches; plain on loopback only.
    listen = "tcp:0.0.0.0:0" if transport == "tls" else "tcp:127.0.0.1:0"
    server = subprocess.Popen(
        [cumux, "serve", "--device", device, "--memory", "2G", "--listen", listen],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env,
    )
    line = server.stdout.readline()
    words = [w.rstrip(";),") for w in line.split()]
    address = next((w for w in words if w.startswith("tcp:")), None)
    if not address:
        server.kill()
        sys.exit(f"cumux serve did not listen: {line}")
    port = address.rsplit(":", 1)[1]
    client = dict(os.environ)
    client.pop("CUMUX_LOG", None)
    if transport == "tls":
        fingerprint = next((w for w in words if w.startswith("sha256:")), None)
        if not fingerprint:
            server.kill()
            sys.exit(f"cumux serve did not say its certificate: {line}")
        client["CUMUX_TLS_FINGERPRINT"] = fingerprint
    return server, f"tcp:127.0.0.1:{port}", client


def kit_label(cumux, index):
    """The commit a kit was built at (COMMIT beside the binary), else its place."""
    try:
        return open(os.path.join(os.path.dirname(cumux), "COMMIT")).readline().strip()
    except OSError:
        return f"kit{index + 1}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cumux", action="append",
                    help="a cumux binary (its libcumux_client.so beside it); "
                         "twice or more: an A/B, alternating within each round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "worker-cpu", "cuda"])
    ap.add_argument("--transports", default="plain")
    ap.add_argument("--lanes", type=int, default=None,
                    help="CUMUX_LANES for the client (its default: 4); the bare "
                         "stream then runs as many connections as the session "
                         "(1 + lanes)")
    opts = ap.parse_args()
    lanes = 4 if opts.lanes is None else opts.lanes
    transports = opts.transports.split(",")
    kits = opts.cumux or [os.path.join(ROOT, "target/release/cumux")]
    labels = [kit_label(k, i) for i, k in enumerate(kits)]
    if len(set(labels)) < len(labels):
        labels = [f"{label}-{i + 1}" for i, label in enumerate(labels)]
    # Columns: (kit, transport), named `transport` for one kit, `label/transport` for several.
    columns = [(i, t) for i in range(len(kits)) for t in transports]
    name = (lambda i, t: t) if len(kits) == 1 else (lambda i, t: f"{labels[i]}/{t}")

    work = tempfile.mkdtemp(prefix="cumux-tcp-bench-")
    exe = build_microbench(work)
    args = ["bandwidth", "1", str(256 << 20)]
    native = {}
    bare, copies = [], {name(i, t): {} for i, t in columns}
    servers = []
    try:
        for r in range(opts.rounds):
            bare.append(bare_stream_gbps(1 + lanes))
            if opts.device == "cuda":
                got = run_native(exe, args)
                for k, v in got.items():
                    native.setdefault(k, []).append(v)
            for i, t in columns:
                # A fresh server for each run: kits never share a GPU's memory.
                server, address, env = start_tcp_server(kits[i], work, opts.device, t)
                if opts.lanes is not None:
                    env["CUMUX_LANES"] = str(opts.lanes)
                servers.append(server)
                try:
                    got = run_microbench(kits[i], address, exe, args, env, 600,
                                         f"bandwidth over {t} ({labels[i]})")
                finally:
                    server.kill()
                    server.wait()
                for k, v in got.items():
                    copies[name(i, t)].setdefault(k, []).append(v)
                print(f"round {r + 1}/{opts.rounds} {name(i, t)}: bare {bare[-1]:.2f} GB/s, "
                      f"htod 256m {got.get('htod_pinned_256m_gbps', 0):.2f}, dtoh 256m "
                      f"{got.get('dtoh_pinned_256m_gbps', 0):.2f}", file=sys.stderr)
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
                server.wait()
        shutil.rmtree(work, ignore_errors=True)

    stream = statistics.median(bare)
    metrics = []
    for column, figures in copies.items():
        for metric in KEPT:
            if metric not in figures:
                continue
            value = statistics.median(figures[metric])
            row = {
                "name": metric if column == "plain" else f"{column}/{metric}",
                "unit": "GB/s",
                "better": "higher",
                "bare_tcp": round(stream, 4),
                "cumux": round(value, 4),
                "ratio": round(value / stream, 4),
                "cumux_rounds": figures[metric],
            }
            if metric in native:
                row["native"] = round(statistics.median(native[metric]), 4)
            metrics.append(row)
    facts = run_facts()
    result = {
        "suite": "tcp-bandwidth",
        "date": facts["date"],
        "gpu": gpu_name() if opts.device == "cuda" else
        f"none: cumux serve --device {opts.device} over loopback TCP",
        "device": opts.device,
        "cuda": "13.0",
        "commit": ",".join(labels) if opts.cumux else facts["commit"],
        "host": facts["host"],
        "baseline": "bare_tcp",
        "note": f"bare_tcp is {1 + lanes} loopback TCP connection(s) at once, as many as a "
                "session opens (its own and its lanes; Python sendall/recv_into, 1 GiB in all) "
                "in the same run, alternating with the copies; cumux is a synchronous "
                "cudaMemcpy through cumux run over loopback TCP, a fresh server a run; "
                "ratio = cumux / bare_tcp; medians of the rounds; `native`: the same program "
                "without cumux. Columns: " + ", ".join(copies) +
                " (tls: the server's self-signed certificate, pinned).",
        "bare_tcp_rounds": bare,
        "lanes": lanes,
        "rounds": opts.rounds,
        "metrics": metrics,
    }
    write_result(result, opts.out)


def run_native(exe, args):
    """microbench ARGS without cumux: its metrics by name."""
    out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"native microbench failed:\n{out.stdout}\n{out.stderr}")
    return {p[1]: float(p[2]) for p in (l.split() for l in out.stdout.splitlines())
            if len(p) == 4 and p[0] == "metric"}


def gpu_name():
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.splitlines()[0].strip() if out.stdout else "unknown GPU"


if __name__ == "__main__":
    main()
