"""NVIDIA's math libraries through whatever libcuda.so.1 the process loads:
cuFFT, cuSOLVER, cuSPARSE, cuRAND and cuBLAS, from PyTorch and CuPy, each
result checked against numpy. Prints one line per check
(`check NAME: PASS|FAIL detail`) and `libs_probe: PASS` when all pass.

    python3 libs_probe.py [torch|cupy|all]
"""
import sys
import traceback

import numpy as np

RESULTS = []


def check(name, fn):
    try:
        detail = fn()
        ok = detail is True or (isinstance(detail, str) and detail.startswith("ok"))
        RESULTS.append(ok)
        print(f"check {name}: {'PASS' if ok else 'FAIL'} {'' if detail is True else detail}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is a result here
        RESULTS.append(False)
        print(f"check {name}: FAIL {type(e).__name__}: {e}", flush=True)
        traceback.print_exc(limit=3)


def close(a, b, tol=1e-3):
    a, b = np.asarray(a), np.asarray(b)
    err = float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))
    return True if err < tol else f"relative error {err:.3g}"


def torch_checks():
    import torch

    rng = np.random.default_rng(0)
    x = rng.standard_normal(4096).astype(np.float32)
    m = rng.standard_normal((64, 64)).astype(np.float64)
    spd = m @ m.T + 64 * np.eye(64)
    b = rng.standard_normal(64)
    dev = "cuda"
    check("torch.fft.rfft", lambda: close(torch.fft.rfft(torch.tensor(x, device=dev)).cpu().numpy(), np.fft.rfft(x)))
    check("torch.fft.fft2", lambda: close(torch.fft.fft2(torch.tensor(m, device=dev)).cpu().numpy(), np.fft.fft2(m), 1e-9))
    check("torch.linalg.solve", lambda: close(torch.linalg.solve(torch.tensor(m, device=dev), torch.tensor(b, device=dev)).cpu().numpy(), np.linalg.solve(m, b), 1e-8))
    check("torch.linalg.cholesky", lambda: close(torch.linalg.cholesky(torch.tensor(spd, device=dev)).cpu().numpy(), np.linalg.cholesky(spd), 1e-9))
    check("torch.linalg.eigh", lambda: close(torch.linalg.eigh(torch.tensor(spd, device=dev))[0].cpu().numpy(), np.linalg.eigh(spd)[0], 1e-9))
    check("torch.linalg.svd", lambda: close(torch.linalg.svdvals(torch.tensor(m, device=dev)).cpu().numpy(), np.linalg.svd(m, compute_uv=False), 1e-9))
    check("torch.matmul", lambda: close((torch.tensor(m, device=dev) @ torch.tensor(m, device=dev)).cpu().numpy(), m @ m, 1e-9))
    def sparse():
        dense = np.where(rng.random((128, 128)) < 0.05, rng.standard_normal((128, 128)), 0.0).astype(np.float32)
        v = rng.standard_normal((128, 4)).astype(np.float32)
        s = torch.tensor(dense, device=dev).to_sparse_csr()
        return close((s @ torch.tensor(v, device=dev)).cpu().numpy(), dense @ v)
    check("torch.sparse_csr@dense", sparse)
    def rand():
        g = torch.Generator(device=dev).manual_seed(0)
        r = torch.rand(1 << 20, device=dev, generator=g).cpu().numpy()
        return True if abs(r.mean() - 0.5) < 0.01 and r.min() >= 0 and r.max() < 1 else f"mean {r.mean()}"
    check("torch.rand", rand)


def cupy_checks():
    import cupy as cp

    rng = np.random.default_rng(1)
    x = rng.standard_normal(4096).astype(np.complex64)
    m = rng.standard_normal((64, 64))
    b = rng.standard_normal(64)
    check("cupy.fft.fft", lambda: close(cp.fft.fft(cp.asarray(x)).get(), np.fft.fft(x)))
    check("cupy.fft.irfftn", lambda: close(cp.fft.irfftn(cp.asarray(np.fft.rfftn(m))).get(), m, 1e-9))
    check("cupy.linalg.solve", lambda: close(cp.linalg.solve(cp.asarray(m), cp.asarray(b)).get(), np.linalg.solve(m, b), 1e-8))
    check("cupy.linalg.qr", lambda: close(np.abs(cp.linalg.qr(cp.asarray(m))[1].get()), np.abs(np.linalg.qr(m)[1]), 1e-8))
    check("cupy.linalg.eigh", lambda: close(cp.linalg.eigh(cp.asarray(m + m.T))[0].get(), np.linalg.eigh(m + m.T)[0], 1e-8))
    def sparse():
        import cupyx.scipy.sparse as sp
        dense = np.where(rng.random((128, 128)) < 0.05, rng.standard_normal((128, 128)), 0.0)
        v = rng.standard_normal(128)
        return close((sp.csr_matrix(cp.asarray(dense)) @ cp.asarray(v)).get(), dense @ v, 1e-9)
    check("cupy.sparse_csr@vec", sparse)
    def rand():
        r = cp.random.default_rng(0).random(1 << 20).get()
        return True if abs(r.mean() - 0.5) < 0.01 else f"mean {r.mean()}"
    check("cupy.random", rand)
    def curand_legacy():
        r = cp.random.RandomState(0).standard_normal(1 << 20, dtype=cp.float32).get()
        return True if abs(r.mean()) < 0.01 and abs(r.std() - 1) < 0.01 else f"mean {r.mean()} std {r.std()}"
    check("cupy.random.RandomState (cuRAND)", curand_legacy)
    check("cupy.matmul", lambda: close((cp.asarray(m) @ cp.asarray(m)).get(), m @ m, 1e-9))


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which in ("torch", "all"):
        check("import torch", lambda: __import__("torch").cuda.is_available() or "no CUDA")
        torch_checks()
    if which in ("cupy", "all"):
        cupy_checks()
    ok = all(RESULTS)
    print(f"libs_probe: {'PASS' if ok else 'FAIL'} ({sum(RESULTS)}/{len(RESULTS)})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
