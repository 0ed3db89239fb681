"""Issue 24's training step: a GPT-2-small-sized model (12 layers, 12 heads,
768 wide, 50257 tokens; plain torch, no downloads) trained with AdamW under
bf16 autocast, one loss.item() a step. bench/h100/remote.sh runs it natively
and through cumux over emulated links.

    python3 remote_step.py [STEPS] [WARMUP] [BATCH] [CTX]

With STEP_GPU_TIME=1 each timed step also records CUDA events after its
forward pass, backward pass and optimizer step and prints `gpu K fwd F bwd B
opt O total T issue I` (ms; issue: the host's time to queue the step, before
its loss.item()) and `gpu_ms_p50: T`: where the GPU's time goes and whether
the step waits on the GPU or on the host.

Prints `pid: N`; `stamp PHASE NS` (CLOCK_MONOTONIC, the hop trace's clock) at
start (before `import torch`), imported, cuda_ready, model_ready, first_step
(the first step's loss.item() returned), steps_begin and steps_end (the timed
steps); each timed step's `step K loss X ms Y`; `step_ms_p50: X`,
`step_ms_p99: Y`; and `remote_step: PASS`.
"""
import os
import sys
import time


def stamp(phase):
    print(f"stamp {phase} {time.monotonic_ns()}", flush=True)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def main():
    print(f"pid: {os.getpid()}", flush=True)
    stamp("start")
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    stamp("imported")

    args = [int(a) for a in sys.argv[1:]]
    steps, warmup, batch, ctx = (args + [30, 5, 8, 1024][len(args):])[:4]
    vocab, width, layers, heads = 50257, 768, 12, 12

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    stamp("cuda_ready")

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.ln2 = nn.LayerNorm(width)
            self.up = nn.Linear(width, 4 * width)
            self.down = nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))

    class GPT2Small(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.pos = nn.Embedding(ctx, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)
            self.head.weight = self.tok.weight  # tied, as GPT-2's

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT2Small().to("cuda")  # built on the host, then copied: what most programs do
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, vocab, (batch, ctx + 1), device="cuda")
    x, y = data[:, :-1], data[:, 1:]
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.1f} M parameters, batch {batch} x {ctx} tokens", flush=True)
    stamp("model_ready")

    gpu_time = os.environ.get("STEP_GPU_TIME") == "1"
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if gpu_time else []
    issued = []

    def mark(i):
        if marks:
            marks[i].record()

    def step():
        began = time.perf_counter()
        mark(0)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))
        mark(1)
        loss.backward()
        mark(2)
        opt.step()
        mark(3)
        issued.append((time.perf_counter() - began) * 1e3)
        return loss.item()

    step()
    stamp("first_step")
    for _ in range(max(warmup - 1, 0)):
        step()
    times, gpu_totals = [], []
    stamp("steps_begin")
    for i in range(steps):
        began = time.perf_counter()
        value = step()
        times.append((time.perf_counter() - began) * 1e3)
        print(f"step {i} loss {value:.5f} ms {times[-1]:.3f}", flush=True)
        if marks:
            parts = [marks[k].elapsed_time(marks[k + 1]) for k in range(3)]
            gpu_totals.append(sum(parts))
            print(f"gpu {i} fwd {parts[0]:.3f} bwd {parts[1]:.3f} opt {parts[2]:.3f} "
                  f"total {gpu_totals[-1]:.3f} issue {issued[-1]:.3f}", flush=True)
    stamp("steps_end")
    print(f"step_ms_p50: {pct(times, 50):.3f}")
    print(f"step_ms_p99: {pct(times, 99):.3f}")
    if gpu_totals:
        print(f"gpu_ms_p50: {pct(gpu_totals, 50):.3f}")
    print("remote_step: PASS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
