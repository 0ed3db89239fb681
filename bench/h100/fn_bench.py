#!/usr/bin/env python3
"""Helpers of bench/h100/functions.sh: the plans, request bodies, timed
registrations, a checked invocation, and a Python load generator for when no
C compiler builds fn_load.c. Needs only the standard library (numpy for the
checks); safetensors are written and read here by hand (8-byte length, JSON
header, raw bytes).

    fn_bench.py body vadd N FILE              a, b of N floats
    fn_bench.py body mlp BATCH FILE           x of BATCH x D_IN floats, dims as params
    fn_bench.py register URL TOKEN NAME MODULE PLAN [DEVICE]   prints register_ms
    fn_bench.py check URL TOKEN PATH BODY     invokes once, checks against numpy
    fn_bench.py pyload URL TOKEN PATH BODY CLIENTS SECONDS [WARMUP]
    fn_bench.py wait URL SECONDS              until GET URL answers 200

TOKEN `-` sends none.
"""
import base64
import http.client
import json
import os
import struct
import sys
import threading
import time
import urllib.parse

# The MLP's widths (FN_MLP_DIMS="D_IN,D_HIDDEN,D_OUT" for smaller ones on the CPU device).
MLP_DIMS = dict(zip(("d_in", "d_hidden", "d_out"),
                    (int(v) for v in os.environ.get("FN_MLP_DIMS", "1024,1024,128").split(","))))
SAFETENSORS = "application/x-safetensors"

VADD_PLAN = {
    "inputs": [{"name": "a", "dtype": "f32"}, {"name": "b", "dtype": "f32", "elements": "a"}],
    "outputs": [{"name": "c", "dtype": "f32", "elements": "a"}],
    "launches": [{"kernel": "vadd", "grid": "cdiv(a, 256)", "block": 256,
                  "args": [{"buffer": "a"}, {"buffer": "b"}, {"buffer": "c"}, {"u32": "a"}]}],
}


def _mlp_plan():
    batch = "x / d_in"
    init = [("w1", "d_in * d_hidden", 1, "d_in"), ("b1", "d_hidden", 2, "d_in"),
            ("w2", "d_hidden * d_hidden", 3, "d_hidden"), ("b2", "d_hidden", 4, "d_hidden"),
            ("w3", "d_hidden * d_out", 5, "d_hidden"), ("b3", "d_out", 6, "d_hidden")]
    layers = [("x", "w1", "b1", "h1", "d_in", "d_hidden", 1),
              ("h1", "w2", "b2", "h2", "d_hidden", "d_hidden", 1),
              ("h2", "w3", "b3", "y", "d_hidden", "d_out", 0)]
    launches = [{"kernel": "mlp_init", "grid": f"cdiv({n}, 256)", "block": 256,
                 "args": [{"buffer": b}, {"u32": n}, {"u32": str(seed)}, {"u32": fan}]}
                for b, n, seed, fan in init]
    launches += [{"kernel": "linear", "grid": [f"cdiv({dout}, 128)", batch], "block": 128,
                  "args": [{"buffer": x}, {"buffer": w}, {"buffer": b}, {"buffer": y},
                           {"u32": din}, {"u32": dout}, {"u32": str(relu)}]}
                 for x, w, b, y, din, dout, relu in layers]
    return {
        "inputs": [{"name": "x", "dtype": "f32"}],
        "params": [{"name": k, "dtype": "u32", "default": v} for k, v in MLP_DIMS.items()],
        "outputs": [{"name": "y", "dtype": "f32", "elements": f"{batch} * d_out"}],
        "scratch": [{"name": b, "dtype": "f32", "elements": n} for b, n, _, _ in init]
        + [{"name": h, "dtype": "f32", "elements": f"{batch} * d_hidden"} for h in ("h1", "h2")],
        "launches": launches,
    }


MLP_PLAN = _mlp_plan()
PLANS = {"vadd": VADD_PLAN, "mlp": MLP_PLAN}


def st_dump(tensors, metadata=None):
    """safetensors bytes of {name: (dtype, shape, raw bytes)}."""
    header, blobs, at = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def st_load(data):
    """{name: (dtype, shape, raw bytes)}, metadata."""
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    return {k: (v["dtype"], v["shape"], data[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in header.items()}, meta


def floats(count, seed):
    """`count` float32s as bytes, a fixed pattern in [-1, 1)."""
    return struct.pack(f"<{count}f", *(((i * 7919 + seed * 104729) % 2001) / 1000.0 - 1.0
                                       for i in range(count)))


def body(kind, size):
    if kind == "vadd":
        return st_dump({"a": ("F32", [size], floats(size, 1)), "b": ("F32", [size], floats(size, 2))})
    d_in = MLP_DIMS["d_in"]
    return st_dump({"x": ("F32", [size * d_in], floats(size * d_in, 3))}, MLP_DIMS)


def connection(url):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=600), u.path.rstrip("/")


def request(url, token, method, path, data, content_type):
    conn, base = connection(url)
    headers = {"Content-Type": content_type, "Accept": content_type}
    if token and token != "-":
        headers["Authorization"] = f"Bearer {token}"
    conn.request(method, base + path, body=data, headers=headers)
    reply = conn.getresponse()
    out = reply.status, reply.read()
    conn.close()
    return out


def register(url, token, name, module, plan, device=None):
    with open(module, "rb") as f:
        image = f.read()
    doc = {"plan": PLANS.get(plan) or json.load(open(plan)),
           "module_base64": base64.b64encode(image).decode()}
    query = f"?device={device}" if device else ""
    t0 = time.perf_counter()
    status, text = request(url, token, "PUT", f"/v1/functions/{name}{query}",
                           json.dumps(doc).encode(), "application/json")
    ms = (time.perf_counter() - t0) * 1e3
    if status != 200:
        print(f"register {name}: HTTP {status}: {text[:300].decode(errors='replace')}")
        return 1
    print(f"register_ms {ms:.3f}")
    return 0


def reference(kind, tensors, meta):
    import numpy as np

    def arr(name):
        return np.frombuffer(tensors[name][2], dtype=np.float32)

    if kind == "vadd":
        return arr("a") + arr("b")
    dims = {k: int(meta.get(k, v)) for k, v in MLP_DIMS.items()}

    def init(n, seed, fan_in):
        i = np.arange(n, dtype=np.uint64)
        h = (((i + 1) * 2654435761) & 0xFFFFFFFF) ^ ((seed * 40503 + 0x9E3779B9) & 0xFFFFFFFF)
        h ^= h >> 15
        h = (h * 2246822519) & 0xFFFFFFFF
        h ^= h >> 13
        u = (h & 0xFFFFFF).astype(np.float32) / np.float32(8388608.0) - np.float32(1.0)
        return u * np.float32(1.0 / np.sqrt(fan_in))

    di, dh, do = dims["d_in"], dims["d_hidden"], dims["d_out"]
    x = arr("x").reshape(-1, di)
    h = np.maximum(x @ init(di * dh, 1, di).reshape(di, dh) + init(dh, 2, di), 0)
    h = np.maximum(h @ init(dh * dh, 3, dh).reshape(dh, dh) + init(dh, 4, dh), 0)
    return (h @ init(dh * do, 5, dh).reshape(dh, do) + init(do, 6, dh)).reshape(-1)


def check(url, token, path, body_file):
    data = open(body_file, "rb").read()
    status, reply = request(url, token, "POST", path, data, SAFETENSORS)
    if status != 200:
        print(f"check {path}: FAIL: HTTP {status}: {reply[:300].decode(errors='replace')}")
        return 1
    outputs, _ = st_load(reply)
    try:
        import numpy as np
    except ImportError:
        print(f"check {path}: answered (no numpy to check against)")
        return 0
    kind = "vadd" if "vadd" in path else "mlp"
    want = reference(kind, *st_load(data))
    got = np.frombuffer(next(iter(outputs.values()))[2], dtype=np.float32)
    ok = got.shape == want.shape and np.allclose(got, want, rtol=2e-3, atol=2e-4)
    worst = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("nan")
    print(f"check {path}: {'PASS' if ok else 'FAIL'} ({got.size} values, worst abs diff {worst:.2e})")
    return 0 if ok else 1


def pyload(url, token, path, body_file, clients, seconds, warmup=1.0):
    data = open(body_file, "rb").read()
    headers = {"Content-Type": SAFETENSORS, "Accept": SAFETENSORS}
    if token and token != "-":
        headers["Authorization"] = f"Bearer {token}"
    began = time.perf_counter()
    measure_from, end = began + warmup, began + warmup + seconds
    results = []

    def client():
        conn, base = connection(url)
        lat, errors = [], 0
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                break
            try:
                conn.request("POST", base + path, body=data, headers=headers)
                reply = conn.getresponse()
                reply.read()
                ok = reply.status == 200
            except (OSError, http.client.HTTPException):
                conn.close()
                conn, base = connection(url)
                ok = False
            t1 = time.perf_counter()
            if t0 >= measure_from:
                if ok:
                    lat.append((t1 - t0) * 1e6)
                else:
                    errors += 1
        results.append((lat, errors))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat = sorted(x for r in results for x in r[0])
    errors = sum(r[1] for r in results)
    print(f"requests {len(lat)}\nerrors {errors}\nrps {len(lat) / seconds:.1f}")
    if lat:
        print(f"p50_us {lat[len(lat) // 2]:.1f}\np99_us {lat[min(len(lat) - 1, int(0.99 * len(lat)))]:.1f}")
    return 0


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "body":
        with open(args[2], "wb") as f:
            f.write(body(args[0], int(args[1])))
        return 0
    if cmd == "register":
        return register(*args)
    if cmd == "check":
        return check(*args)
    if cmd == "wait":
        deadline = time.time() + float(args[1])
        while time.time() < deadline:
            try:
                conn, base = connection(args[0])
                conn.request("GET", base)
                if conn.getresponse().status == 200:
                    return 0
            except OSError:
                pass
            time.sleep(0.2)
        return 1
    if cmd == "pyload":
        return pyload(args[0], args[1], args[2], args[3], int(args[4]), float(args[5]),
                      *(float(a) for a in args[6:]))
    sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main())
