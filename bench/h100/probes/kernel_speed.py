"""The GPU time of the GPT-2 step's kinds of kernel one at a time (issue 24):
whether a kernel runs slower through cumux than natively. Each op runs REPS
times back to back between two CUDA events, after a warm-up; prints
`op NAME us X` (GPU µs a run, median of ROUNDS) and `kernel_speed: PASS`.

    python3 kernel_speed.py [REPS] [ROUNDS]
"""
import statistics
import sys

import torch
import torch.nn.functional as F


def main():
    reps, rounds = ([int(a) for a in sys.argv[1:]] + [50, 5])[:2]
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    b, t, c, heads, vocab = 8, 1024, 768, 12, 50257
    n = b * t
    bf = torch.bfloat16
    x = torch.randn(n, c, device=dev, dtype=bf)
    h = torch.randn(n, 4 * c, device=dev, dtype=bf)
    w_qkv = torch.randn(3 * c, c, device=dev, dtype=bf)
    w_up = torch.randn(4 * c, c, device=dev, dtype=bf)
    w_down = torch.randn(c, 4 * c, device=dev, dtype=bf)
    w_head = torch.randn(vocab, c, device=dev, dtype=bf)
    g_qkv = torch.randn(n, 3 * c, device=dev, dtype=bf)
    q, k, v = (torch.randn(b, heads, t, c // heads, device=dev, dtype=bf, requires_grad=True)
               for _ in range(3))
    logits = torch.randn(n, vocab, device=dev, dtype=torch.float32)
    target = torch.randint(0, vocab, (n,), device=dev)
    ln = torch.nn.LayerNorm(c, device=dev)
    xf = torch.randn(n, c, device=dev)
    p32 = [torch.randn(c * c, device=dev) for _ in range(48)]
    g32 = [torch.randn(c * c, device=dev) for _ in range(48)]

    def sdpa_fwd_bwd():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.sum().backward()

    ops = {
        "mm_qkv": lambda: x @ w_qkv.t(),
        "mm_up": lambda: x @ w_up.t(),
        "mm_down": lambda: h @ w_down.t(),
        "mm_head": lambda: x @ w_head.t(),
        "mm_dW_qkv": lambda: g_qkv.t() @ x,
        "mm_dX_qkv": lambda: g_qkv @ w_qkv,
        "sdpa_fwd": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "sdpa_fwd_bwd": sdpa_fwd_bwd,
        "layernorm": lambda: ln(xf),
        "gelu": lambda: F.gelu(h, approximate="tanh"),
        "cross_entropy": lambda: F.cross_entropy(logits, target),
        "foreach_add": lambda: torch._foreach_add_(p32, g32, alpha=1e-9),
    }
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for name, op in ops.items():
        for _ in range(3):
            op()
        torch.cuda.synchronize()
        times = []
        for _ in range(rounds):
            start.record()
            for _ in range(reps):
                op()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / reps)
        print(f"op {name} us {statistics.median(times):.2f}", flush=True)
    print("kernel_speed: PASS")


if __name__ == "__main__":
    main()
