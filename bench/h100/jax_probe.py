"""JAX through cumux, a first look: devices, a jitted product, a gradient and a
few steps of a small regression trained by hand-written SGD, an FFT round
trip and a linear solve (XLA's cuFFT and cuSOLVER calls). Prints one line
per check and `jax_probe: PASS` when all agree with the expected values."""
import sys

import jax
import jax.numpy as jnp


def main():
    devices = jax.devices()
    print("devices:", devices)
    if not devices or devices[0].platform != "gpu":
        print("jax_probe: FAIL: no GPU device")
        return 1
    x = jnp.arange(1024 * 1024, dtype=jnp.float32).reshape(1024, 1024) / 1e6
    prod = jax.jit(lambda a: (a @ a.T).sum())(x)
    print("jit product:", float(prod))
    grad = jax.grad(lambda w: ((x @ w) ** 2).mean())(jnp.ones((1024,), jnp.float32))
    print("grad norm:", float(jnp.linalg.norm(grad)))
    # XLA's own calls into cuFFT and cuSOLVER.
    sig = jnp.sin(jnp.arange(4096, dtype=jnp.float32) * 0.1)
    spectrum = jnp.fft.rfft(sig)
    back = jnp.fft.irfft(spectrum, n=4096)
    fft_err = float(jnp.max(jnp.abs(back - sig)))
    print("fft round trip error:", fft_err)
    a = jax.random.normal(jax.random.PRNGKey(2), (64, 64)) + 64 * jnp.eye(64)
    b = jax.random.normal(jax.random.PRNGKey(3), (64,))
    solve_err = float(jnp.max(jnp.abs(a @ jnp.linalg.solve(a, b) - b)))
    print("solve residual:", solve_err)
    key = jax.random.PRNGKey(0)
    true_w = jax.random.normal(key, (16,))
    data = jax.random.normal(jax.random.PRNGKey(1), (4096, 16))
    target = data @ true_w
    w = jnp.zeros((16,))

    @jax.jit
    def step(w):
        loss, g = jax.value_and_grad(lambda w: ((data @ w - target) ** 2).mean())(w)
        return w - 0.1 * g, loss

    for _ in range(200):
        w, loss = step(w)
    print("final loss:", float(loss))
    ok = float(loss) < 1e-3 and fft_err < 1e-4 and solve_err < 1e-3
    print("jax_probe:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
