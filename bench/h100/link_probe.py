#!/usr/bin/env python3
"""What an emulated link really gives, for bench/h100/remote.sh: starts
cumux-netem in front of a loopback echo and sink, and measures the round trip
(1-byte pings, TCP_NODELAY) and a bare TCP stream's GB/s through it.

    link_probe.py NETEM RTT GBIT [PINGS] [STREAM_MIB] [STREAMS]

NETEM `-` measures the bare loopback instead (RTT and GBIT unused).

Prints `rtt_ms_p50 X`, `rtt_ms_p99 X`, `stream_gbps X` (one line each), and
with STREAMS > 1 `streams_gbps X`: STREAMS connections at once through the
same relay (one link), STREAM_MIB in all (cumux's lanes, CUMUX_LANES).
"""
import socket
import subprocess
import sys
import threading
import time


def serve(handler):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def loop():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return listener


def echo(conn):
    while True:
        data = conn.recv(65536)
        if not data:
            return
        conn.sendall(data)


def sink(conn):
    header = b""
    while len(header) < 8:
        header += conn.recv(8 - len(header))
    want, got = int.from_bytes(header, "little"), 0
    buf = memoryview(bytearray(4 << 20))
    while got < want:
        n = conn.recv_into(buf)
        if n == 0:
            return
        got += n
    conn.sendall(b"k")


def relay(netem, target, rtt, gbit):
    if netem == "-":  # no relay: the bare loopback
        return None, ("127.0.0.1", target)
    proc = subprocess.Popen([netem, "--to", f"127.0.0.1:{target}", "--rtt", rtt, "--gbit", gbit],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    parts = line.split()
    if len(parts) < 4:
        proc.kill()
        sys.exit(f"cumux-netem did not listen: {line!r}")
    host, port = parts[3].rsplit(":", 1)
    return proc, (host, int(port))


def streams_gbps(at, total, streams):
    """GB/s of `streams` connections to the sink at `at`, `total` bytes in all."""
    each = total // streams
    chunk = bytes(8 << 20)
    conns = [socket.create_connection(at) for _ in range(streams)]

    def send(s):
        s.sendall(each.to_bytes(8, "little"))
        left = each
        while left > 0:
            n = min(left, len(chunk))
            s.sendall(chunk[:n] if n < len(chunk) else chunk)
            left -= n
        s.recv(1)

    threads = [threading.Thread(target=send, args=(s,)) for s in conns]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    for s in conns:
        s.close()
    return each * streams / took / 1e9


def main():
    netem, rtt, gbit = sys.argv[1:4]
    pings = int(sys.argv[4]) if len(sys.argv) > 4 else 200
    mib = int(sys.argv[5]) if len(sys.argv) > 5 else 512
    streams = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    echo_at, sink_at = serve(echo), serve(sink)
    procs = []
    try:
        proc, at = relay(netem, echo_at.getsockname()[1], rtt, gbit)
        procs.append(proc)
        s = socket.create_connection(at)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(pings):
            t0 = time.perf_counter()
            s.sendall(b"x")
            s.recv(1)
            times.append((time.perf_counter() - t0) * 1e3)
        s.close()
        times.sort()
        print(f"rtt_ms_p50 {times[len(times) // 2]:.4f}")
        print(f"rtt_ms_p99 {times[min(len(times) - 1, int(0.99 * len(times)))]:.4f}")

        proc, at = relay(netem, sink_at.getsockname()[1], rtt, gbit)
        procs.append(proc)
        print(f"stream_gbps {streams_gbps(at, mib << 20, 1):.4f}")
        if streams > 1:
            print(f"streams_gbps {streams_gbps(at, mib << 20, streams):.4f}")
    finally:
        for p in procs:
            if p:
                p.kill()
                p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
