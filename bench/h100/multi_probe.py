"""Two GPUs from frameworks, through whatever libcuda.so.1 the process loads:
`jax` (both devices seen, a pmap, a psum across them: XLA's own NCCL) and
`share` (torch.multiprocessing hands a CUDA tensor to a child process, which
changes it in place: CUDA IPC memory and event handles). Prints one line per
check and `multi_probe: PASS` when all pass.

    python3 multi_probe.py jax|share
"""
import sys


def jax_checks():
    import jax
    import jax.numpy as jnp

    devices = jax.devices()
    print("devices:", devices)
    if len(devices) < 2:
        print("check two devices: FAIL", len(devices))
        return False
    x = jnp.arange(2 * 1024, dtype=jnp.float32).reshape(2, 1024)
    doubled = jax.pmap(lambda v: v * 2)(x)
    ok_map = bool(jnp.all(doubled == x * 2))
    print("check pmap:", "PASS" if ok_map else "FAIL")
    summed = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(x)
    want = x.sum(axis=0)
    ok_sum = bool(jnp.allclose(summed[0], want) and jnp.allclose(summed[1], want))
    print("check psum across devices:", "PASS" if ok_sum else "FAIL")
    return ok_map and ok_sum


def child(q_in, q_out):
    import torch

    t = q_in.get()
    t.mul_(3)
    torch.cuda.synchronize()
    q_out.put(float(t.sum().item()))


def share_checks():
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    t = torch.arange(1024, dtype=torch.float32, device="cuda")
    p = ctx.Process(target=child, args=(q_in, q_out))
    p.start()
    q_in.put(t)
    child_sum = q_out.get(timeout=120)
    p.join(timeout=120)
    torch.cuda.synchronize()
    want = 3 * 1023 * 1024 / 2
    ok = abs(child_sum - want) < 1 and abs(float(t.sum().item()) - want) < 1 and p.exitcode == 0
    print("check tensor shared with a child, changed in place:", "PASS" if ok else "FAIL", child_sum, float(t.sum().item()), p.exitcode)
    return ok


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "jax"
    ok = jax_checks() if which == "jax" else share_checks()
    print("multi_probe:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)
