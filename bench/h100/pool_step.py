"""A small MLP trained on every visible GPU at once, a layer on each (one
device: the whole model there), one loss.item() a step: what a program on a
pool of remote GPUs does. Prints `devices: N`, each step's loss
(`step K loss X`), the median step time after 5 (`step_ms: X`) and
`pool_step: PASS`. Run natively and through cumux: the losses must agree.

    python3 pool_step.py [STEPS]
"""
import statistics
import sys
import time

import torch


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    n = torch.cuda.device_count()
    print("devices:", n)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(1024, 1024).to(f"cuda:{i % n}") for i in range(max(n, 2))]
    head = torch.nn.Linear(1024, 10).to(f"cuda:{(len(layers) - 1) % n}")
    params = [p for layer in layers for p in layer.parameters()] + list(head.parameters())
    opt = torch.optim.SGD(params, lr=0.05)
    x = torch.randn(512, 1024, device="cuda:0")
    y = torch.randint(0, 10, (512,), device=head.weight.device)
    times = []
    for step in range(steps):
        began = time.perf_counter()
        opt.zero_grad()
        h = x
        for layer in layers:
            h = torch.relu(layer(h.to(layer.weight.device)))
        loss = torch.nn.functional.cross_entropy(head(h.to(head.weight.device)), y)
        loss.backward()
        opt.step()
        value = loss.item()
        times.append(time.perf_counter() - began)
        print(f"step {step} loss {value:.6f}")
    print(f"step_ms: {statistics.median(times[5:]) * 1e3:.3f}")
    print("pool_step: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
