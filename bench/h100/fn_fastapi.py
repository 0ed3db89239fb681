#!/usr/bin/env python3
"""The alternative users build, for bench/h100/functions.sh to compare with:
a FastAPI app under uvicorn calling CuPy, doing a function's work per request.

    fn_fastapi.py PORT MODULE [cupy|numpy]

POST /vadd and /mlp take and give the same safetensors bodies as the cumux
functions `vadd` and `mlp` and launch the same kernels (MODULE: the fat binary
of fn_kernels.cu, loaded by CuPy once) with the same buffers zeroed; `numpy`
computes on the CPU instead, to check the plumbing where there is no GPU. One
process, one CUDA context; each handler does its GPU work inline in the
event loop (the fastest setting for sub-millisecond work; a thread pool adds
a hand-off per request). uvloop and httptools when installed, as
`uvicorn[standard]` has them. GET /health answers once it serves.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI, Request, Response  # noqa: E402

from fn_bench import MLP_DIMS, SAFETENSORS, reference, st_dump, st_load  # noqa: E402

port, module = int(sys.argv[1]), sys.argv[2]
backend = sys.argv[3] if len(sys.argv) > 3 else "cupy"
app = FastAPI()


def reply(name, array):
    return Response(st_dump({name: ("F32", [array.size], array.astype(np.float32).tobytes())}),
                    media_type=SAFETENSORS)


if backend == "cupy":
    import cupy as cp

    try:
        kernels = cp.RawModule(path=module)
    except Exception as e:  # noqa: BLE001 - say which way it was loaded
        print(f"fastapi: cannot load {module} ({e}); compiling fn_kernels.cu with NVRTC", flush=True)
        src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fn_kernels.cu")).read()
        kernels = cp.RawModule(code=src.replace("#include <cstdint>", "typedef unsigned int uint32_t;"))
    k_vadd, k_init, k_linear = (kernels.get_function(n) for n in ("vadd", "mlp_init", "linear"))
    u32 = np.uint32

    def cdiv(a, b):
        return (a + b - 1) // b

    def vadd_work(tensors, meta):
        a = cp.asarray(np.frombuffer(tensors["a"][2], np.float32))
        b = cp.asarray(np.frombuffer(tensors["b"][2], np.float32))
        c = cp.zeros_like(a)
        n = a.size
        k_vadd((cdiv(n, 256),), (256,), (a, b, c, u32(n)))
        return c.get()

    def mlp_work(tensors, meta):
        di, dh, do = (int(meta.get(k, v)) for k, v in MLP_DIMS.items())
        x = cp.asarray(np.frombuffer(tensors["x"][2], np.float32))
        bs = x.size // di
        w1, b1 = cp.zeros(di * dh, cp.float32), cp.zeros(dh, cp.float32)
        w2, b2 = cp.zeros(dh * dh, cp.float32), cp.zeros(dh, cp.float32)
        w3, b3 = cp.zeros(dh * do, cp.float32), cp.zeros(do, cp.float32)
        h1, h2 = cp.zeros(bs * dh, cp.float32), cp.zeros(bs * dh, cp.float32)
        y = cp.zeros(bs * do, cp.float32)
        for buf, seed, fan in ((w1, 1, di), (b1, 2, di), (w2, 3, dh), (b2, 4, dh), (w3, 5, dh), (b3, 6, dh)):
            k_init((cdiv(buf.size, 256),), (256,), (buf, u32(buf.size), u32(seed), u32(fan)))
        for xi, w, b, yo, din, dout, relu in ((x, w1, b1, h1, di, dh, 1), (h1, w2, b2, h2, dh, dh, 1),
                                              (h2, w3, b3, y, dh, do, 0)):
            k_linear((cdiv(dout, 128), bs), (128,), (xi, w, b, yo, u32(din), u32(dout), u32(relu)))
        return y.get()
else:
    def vadd_work(tensors, meta):
        return reference("vadd", tensors, meta)

    def mlp_work(tensors, meta):
        return reference("mlp", tensors, meta)


@app.post("/vadd")
async def vadd(request: Request):
    return reply("c", vadd_work(*st_load(await request.body())))


@app.post("/mlp")
async def mlp(request: Request):
    return reply("y", mlp_work(*st_load(await request.body())))


@app.get("/health")
async def health():
    return {"backend": backend}


if __name__ == "__main__":
    options = {}
    for name, module_name in (("loop", "uvloop"), ("http", "httptools")):
        try:
            __import__(module_name)
            options[name] = module_name
        except ImportError:
            pass
    print(f"fastapi: serving on http://127.0.0.1:{port} (backend {backend}; "
          f"{options or 'asyncio, h11'})", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, **options)
