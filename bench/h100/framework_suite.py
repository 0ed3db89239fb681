#!/usr/bin/env python3
"""Issue 23's framework suite beyond stock PyTorch: JAX, CuPy, numba-cuda,
Triton, transformers, PyTorch's FFT and linear algebra, and PyTorch with
expandable segments. Run the same way natively and through `cumux run` by
bench/h100/framework_suite.sh, which compares the two (same line protocol as
pytorch_suite.py): each step prints `result STEP JSON` with
{"values": [floats], "rtol": R, "atol": A}, or `error STEP MESSAGE`.

    framework_suite.py STEP...     (each STEP one of STEPS below)

Steps of different frameworks belong in different processes (groups), and
`expandable` in a process of its own: its allocator setting must come before
PyTorch starts.
"""
import json
import os
import sys
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402

STEP = None


def values(*xs, rtol=1e-5, atol=1e-6):
    flat = []
    for x in xs:
        flat.extend(float(v) for v in np.ravel(np.asarray(x, dtype=np.float64)))
    print(f"result {STEP} " + json.dumps({"values": flat, "rtol": rtol, "atol": atol}), flush=True)


def rng(seed=0):
    return np.random.default_rng(seed)


# JAX: jit, grad, an optax training loop, an FFT.
def jax_jit():
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(rng().standard_normal((512, 512)).astype(np.float32))
    f = jax.jit(lambda a: jnp.tanh(a @ a.T).sum(axis=1) + jnp.sin(a).mean())
    y = f(x)
    assert jax.devices()[0].platform == "gpu", jax.devices()
    values(y[:8], y.sum(), rtol=1e-4, atol=1e-4)


def jax_grad():
    import jax
    import jax.numpy as jnp

    w = jnp.asarray(rng(1).standard_normal(256).astype(np.float32))
    x = jnp.asarray(rng(2).standard_normal((64, 256)).astype(np.float32))
    loss = lambda w: jnp.mean(jnp.log1p(jnp.exp(x @ w)))  # noqa: E731
    g = jax.jit(jax.grad(loss))(w)
    values(loss(w), g[:8], jnp.linalg.norm(g), rtol=1e-4, atol=1e-5)


def jax_optax():
    import jax
    import jax.numpy as jnp
    import optax

    r = rng(3)
    x = jnp.asarray(r.standard_normal((256, 32)).astype(np.float32))
    y = jnp.asarray((r.standard_normal(256) > 0).astype(np.int32))
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"w1": jax.random.normal(k1, (32, 64)) * 0.1, "b1": jnp.zeros(64),
              "w2": jax.random.normal(k2, (64, 2)) * 0.1, "b2": jnp.zeros(2)}
    opt = optax.adam(1e-2)
    state = opt.init(params)

    def loss_fn(p):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return optax.softmax_cross_entropy_with_integer_labels(h @ p["w2"] + p["b2"], y).mean()

    @jax.jit
    def step(p, s):
        loss, g = jax.value_and_grad(loss_fn)(p)
        u, s = opt.update(g, s)
        return optax.apply_updates(p, u), s, loss

    losses = []
    for _ in range(100):
        params, state, loss = step(params, state)
        losses.append(loss)
    values(losses[0], losses[49], losses[99], rtol=1e-3, atol=1e-5)


def jax_fft():
    import jax.numpy as jnp

    x = jnp.asarray(rng(4).standard_normal(4096).astype(np.float32))
    f = jnp.fft.rfft(x)
    back = jnp.fft.irfft(f, n=4096)
    values(jnp.abs(f)[:8], jnp.max(jnp.abs(back - x)) < 1e-4, rtol=1e-4, atol=1e-3)


# CuPy: cuBLAS, cuFFT, cuSOLVER, RawKernel, streams, pinned memory.
def cupy_blas():
    import cupy as cp

    a = cp.asarray(rng(5).standard_normal((512, 384)).astype(np.float32))
    b = cp.asarray(rng(6).standard_normal((384, 256)).astype(np.float32))
    c = a @ b
    values(c[0, :8].get(), cp.abs(c).sum().get(), rtol=1e-4, atol=1e-4)


def cupy_fft():
    import cupy as cp

    x = cp.asarray(rng(7).standard_normal(8192) + 1j * rng(8).standard_normal(8192))
    f = cp.fft.fft(x)
    values(cp.abs(f[:8]).get(), cp.abs(cp.fft.ifft(f) - x).max().get() < 1e-9, rtol=1e-6, atol=1e-6)


def cupy_solve():
    import cupy as cp

    m = rng(9).standard_normal((128, 128))
    a = cp.asarray(m @ m.T + 128 * np.eye(128))
    b = cp.asarray(rng(10).standard_normal(128))
    x = cp.linalg.solve(a, b)
    w = cp.linalg.eigvalsh(a)
    values(x[:8].get(), w[-4:].get(), cp.linalg.norm(a @ x - b).get() < 1e-8, rtol=1e-6, atol=1e-9)


def cupy_rawkernel():
    import cupy as cp

    k = cp.RawKernel(r"""
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}""", "saxpy")
    n = 100_000
    x = cp.arange(n, dtype=cp.float32)
    y = cp.ones(n, dtype=cp.float32)
    k(((n + 255) // 256,), (256,), (cp.float32(2.0), x, y, cp.int32(n)))
    values(y[:4].get(), y[-1].get(), y.sum().get(), rtol=1e-6)


def cupy_streams():
    import cupy as cp

    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with s1:
        a = cp.arange(1 << 20, dtype=cp.float32)
        for _ in range(20):
            a = a * 1.0001 + 1
        done = s1.record()
    s2.wait_event(done)
    with s2:
        b = cp.sqrt(a).sum()
    s2.synchronize()
    values(b.get(), a[:4].get(), rtol=1e-5)


def cupy_pinned():
    import cupy as cp

    n = 1 << 22
    pinned = cp.cuda.alloc_pinned_memory(n * 4)
    host = np.frombuffer(pinned, np.float32, n)
    host[:] = np.arange(n, dtype=np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    d = cp.empty(n, cp.float32)
    d.set(host, stream=s)
    with s:
        d *= 3
    d.get(stream=s, out=host)
    s.synchronize()
    values(host[:4], host[-1], host.sum(dtype=np.float64), rtol=1e-9)


# numba-cuda: a kernel compiled by NVVM, loaded through the driver API.
def numba_kernel():
    # numba-cuda 0.30 still calls numpy's row_stack, which NumPy 2.4 removed
    # (it fails natively the same way): the machine's versions, not cumux's.
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    from numba import cuda

    @cuda.jit
    def scale(x, out, a):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = a * x[i] + i

    x = np.arange(10_000, dtype=np.float32)
    dx = cuda.to_device(x)
    dout = cuda.device_array_like(dx)
    scale[(x.size + 127) // 128, 128](dx, dout, np.float32(0.5))
    out = dout.copy_to_host()
    values(out[:4], out[-1], out.sum(dtype=np.float64), rtol=1e-6)


# Triton: a kernel compiled by Triton, launched from PyTorch.
def triton_kernel():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=m) * 2 + tl.load(y_ptr + i, mask=m), mask=m)

    n = 98_432
    x = torch.arange(n, device="cuda", dtype=torch.float32)
    y = torch.ones(n, device="cuda")
    out = torch.empty_like(x)
    add[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    values(out[:4].cpu(), out.sum().item(), rtol=1e-6)


# PyTorch's FFT and linear algebra (cuFFT, cuSOLVER, cuBLAS).
def torch_fft():
    import torch

    x = torch.tensor(rng(11).standard_normal((16, 1024)).astype(np.float32), device="cuda")
    f = torch.fft.rfft(x)
    f2 = torch.fft.fft2(x)
    values(f.abs()[0, :8].cpu(), f2.abs().sum().item(), torch.fft.irfft(f, n=1024).sub(x).abs().max().item() < 1e-4,
           rtol=1e-4, atol=1e-3)


def torch_linalg():
    import torch

    m = torch.tensor(rng(12).standard_normal((96, 96)), device="cuda")
    spd = m @ m.T + 96 * torch.eye(96, device="cuda", dtype=m.dtype)
    b = torch.tensor(rng(13).standard_normal(96), device="cuda")
    x = torch.linalg.solve(spd, b)
    s = torch.linalg.svdvals(m)
    w = torch.linalg.eigvalsh(spd)
    q, r = torch.linalg.qr(m)
    values(x[:6].cpu(), s[:4].cpu(), w[-4:].cpu(), torch.linalg.cholesky(spd).diagonal()[:4].cpu(),
           (q @ r - m).abs().max().item() < 1e-9, rtol=1e-6, atol=1e-9)


# transformers: a small GPT-2 built from its config (no download), forward and backward.
def transformers_gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=128)
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 1000, (8, 64), generator=torch.Generator().manual_seed(1)).cuda()
    losses = []
    for _ in range(5):
        out = model(input_ids=ids, labels=ids)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    values(losses, rtol=2e-3, atol=1e-4)


# PyTorch with expandable segments (virtual memory management underneath).
def expandable():
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(256, 512, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")
    losses = []
    for i in range(30):
        big = torch.empty((64 + i) << 20, dtype=torch.uint8, device="cuda")  # grows and shrinks segments
        del big
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    reserved = torch.cuda.memory_reserved()
    values(losses[0], losses[29], reserved > 0, rtol=1e-4, atol=1e-5)


STEPS = {f.__name__: f for f in [
    jax_jit, jax_grad, jax_optax, jax_fft,
    cupy_blas, cupy_fft, cupy_solve, cupy_rawkernel, cupy_streams, cupy_pinned,
    numba_kernel, triton_kernel, torch_fft, torch_linalg, transformers_gpt2, expandable,
]}


def main():
    global STEP
    for step in sys.argv[1:]:
        STEP = step
        try:
            STEPS[step]()
        except Exception as e:  # noqa: BLE001 - every failure is a result here
            traceback.print_exc(limit=4)
            print(f"error {step} {type(e).__name__}: {str(e)[:200]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
