#!/usr/bin/env python3
"""Stock PyTorch checks and benchmarks, one step per process, run the same way
natively and through `cumux run` by bench/h100/pytorch_suite.sh, which compares
the two. Several steps share one process (PyTorch and its libraries load once);
each prints one line, `result STEP JSON`, or `error STEP MESSAGE`:

  checks:  {"values": [floats], "rtol": R, "atol": A}   (compared within tolerance)
  benches: {"ms": median ms per iteration, "iters": N}  (timed, ratio reported)

    pytorch_suite.py STEP...     (each STEP one of CHECKS or BENCHES below)
"""
import json
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


STEP = None


def report(**fields):
    print(f"result {STEP} " + json.dumps(fields), flush=True)


def values(*xs, rtol=1e-5, atol=1e-6):
    report(values=[float(x) for x in xs], rtol=rtol, atol=atol)


def props():
    p = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total
    values(torch.cuda.device_count(), p.major, p.minor, p.multi_processor_count,
           p.total_memory // (1 << 20), total // (1 << 20), rtol=0, atol=0)


def tensor_ops():
    x = torch.arange(1 << 16, device="cuda", dtype=torch.float32)
    y = (x * 2 + 1).sqrt().sin()
    idx = torch.randperm(1 << 16, generator=torch.Generator().manual_seed(0)).cuda()
    values(y.sum(), y[idx][:100].sum(), x.max(), torch.cumsum(x, 0)[-1], (x > 100).sum(),
           rtol=1e-6)


def matmul(dtype, n, rtol):
    torch.manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    c = (a @ b).double()
    values(c.sum(), c.abs().sum(), c[0, 0], c[-1, -1], rtol=rtol, atol=1e-2)


def autocast_bf16():
    torch.manual_seed(0)
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        c = a @ b
    assert c.dtype == torch.bfloat16
    c = c.double()
    values(c.abs().sum(), c[0, 0], c[-1, -1], rtol=2e-2, atol=0.5)


def conv(tf32):
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    m = nn.Conv2d(3, 16, 3, padding=1).cuda()
    x = torch.randn(4, 3, 64, 64, device="cuda")
    y = m(x).double()
    values(y.sum(), y.abs().sum(), rtol=1e-3 if tf32 else 1e-5, atol=1e-3)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.bn(self.c2(x))), 2)
        return self.fc(x.flatten(1))


def cnn_train():
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    m = SmallCNN().cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(32, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (32,), device="cuda")
    losses = []
    for _ in range(10):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    values(*losses, rtol=1e-3, atol=1e-4)


class GPT(nn.Module):
    """A few pre-norm causal transformer layers over a token embedding."""

    def __init__(self, vocab=512, d=256, layers=4, heads=4, ctx=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        return self.head(self.norm(self.body(h, mask=mask, is_causal=True)))


def gpt_setup(batch=16, ctx=128):
    torch.manual_seed(0)
    m = GPT(ctx=ctx).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4)
    data = torch.randint(0, 512, (batch, ctx + 1), device="cuda")
    return m, opt, data


def gpt_step(m, opt, data, bf16):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logits = m(data[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                               data[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    return loss


def gpt_train(bf16):
    torch.backends.cuda.matmul.allow_tf32 = False
    m, opt, data = gpt_setup()
    losses = [gpt_step(m, opt, data, bf16).item() for _ in range(8)]
    values(*losses, rtol=2e-2 if bf16 else 1e-3, atol=1e-3)


def graph_replay():
    x = torch.ones(1 << 16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * 2  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = (x * 2).sin() + 1
    sums = []
    for k in range(3):
        x.fill_(float(k))
        g.replay()
        torch.cuda.synchronize()
        sums.append(y.sum().item())
    values(*sums, rtol=1e-6)


def compiled():
    f = torch.compile(lambda a, b: torch.sin(a) * b + a.cos())
    torch.manual_seed(0)
    a = torch.randn(1 << 16, device="cuda")
    b = torch.randn(1 << 16, device="cuda")
    values(f(a, b).double().sum(), rtol=1e-5, atol=1e-3)


def allocator_pressure():
    """Fills most of the memory the device reports in 256 MiB blocks, frees
    it, and does it again: the caching allocator must size itself to what
    cuMemGetInfo says and recover after an out-of-memory."""
    free, total = torch.cuda.mem_get_info()
    block = 256 << 20
    want = int(free * 0.8) // block
    held = [torch.empty(block, dtype=torch.uint8, device="cuda") for _ in range(want)]
    for i, t in enumerate(held[:8]):
        t.fill_(i)
    first = sum(t[0].item() for t in held[:8])
    oom = 0
    try:
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        oom = 1
    del held
    torch.cuda.empty_cache()
    again = [torch.empty(block, dtype=torch.uint8, device="cuda") for _ in range(want)]
    ok = int(len(again) == want)
    del again
    torch.cuda.empty_cache()
    values(first, oom, ok, rtol=0, atol=0)


def bench(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    report(ms=statistics.median(times), iters=iters, p90=sorted(times)[int(iters * 0.9)])


def gpt_step_bench(bf16):
    torch.backends.cuda.matmul.allow_tf32 = True
    m, opt, data = gpt_setup()
    bench(lambda: gpt_step(m, opt, data, bf16), warmup=5, iters=40)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18's layout (torchvision is not installed on the GPU machine)."""

    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet18_infer_bench():
    torch.manual_seed(0)
    m = ResNet18().cuda().eval()
    x = torch.randn(32, 3, 224, 224, device="cuda")
    with torch.no_grad():
        bench(lambda: m(x), warmup=5, iters=40)


def tiny_kernels_bench():
    """A launch-bound loop: 200 tiny elementwise kernels per iteration."""
    x = torch.zeros(256, device="cuda")

    def loop():
        for _ in range(200):
            x.add_(1.0)
    bench(loop, warmup=3, iters=30)


CHECKS = {
    "props": props,
    "tensor": tensor_ops,
    "matmul_fp32": lambda: matmul(torch.float32, 512, 1e-5),
    "matmul_bf16": lambda: matmul(torch.bfloat16, 512, 2e-2),
    "autocast_bf16": autocast_bf16,
    "conv": lambda: conv(True),
    "conv_notf32": lambda: conv(False),
    "cnn_train": cnn_train,
    "gpt_train_fp32": lambda: gpt_train(False),
    "gpt_train_bf16": lambda: gpt_train(True),
    "graph": graph_replay,
    "compile": compiled,
    "allocator_pressure": allocator_pressure,
}
BENCHES = {
    "gpt_step_fp32_ms": lambda: gpt_step_bench(False),
    "gpt_step_bf16_ms": lambda: gpt_step_bench(True),
    "resnet18_infer_b32_ms": resnet18_infer_bench,
    "tiny_kernels_200_ms": tiny_kernels_bench,
}

if __name__ == "__main__":
    steps = {**CHECKS, **BENCHES}
    if len(sys.argv) < 2 or any(a not in steps for a in sys.argv[1:]):
        sys.exit("usage: pytorch_suite.py STEP... (" + " ".join(steps) + ")")
    for STEP in sys.argv[1:]:
        try:
            steps[STEP]()
        except Exception as e:  # one failing step must not hide the others
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            print(f"error {STEP} {msg}", flush=True)
