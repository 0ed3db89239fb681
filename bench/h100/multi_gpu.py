"""One PyTorch process on two GPUs, as model-parallel code runs: a layer on
each device, activations moved between them with .to(), a backward pass and
SGD steps; then a tensor round-tripped cuda:0 -> cuda:1 -> cpu. Prints each
step's loss (`step N loss X`), the devices' peer access and `multi_gpu: PASS`.
Run natively and through cumux: the losses must agree."""
import sys

import torch


def main():
    n = torch.cuda.device_count()
    print("devices:", n, [torch.cuda.get_device_name(i) for i in range(n)])
    if n < 2:
        print("multi_gpu: SKIP: one device")
        return 0
    print("can_access_peer:", torch.cuda.can_device_access_peer(0, 1))
    torch.manual_seed(0)
    first = torch.nn.Linear(512, 512).to("cuda:0")
    second = torch.nn.Linear(512, 10).to("cuda:1")
    opt = torch.optim.SGD(list(first.parameters()) + list(second.parameters()), lr=0.05)
    x = torch.randn(256, 512, device="cuda:0")
    y = torch.randint(0, 10, (256,), device="cuda:1")
    for step in range(20):
        opt.zero_grad()
        h = torch.relu(first(x)).to("cuda:1")
        loss = torch.nn.functional.cross_entropy(second(h), y)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}")
    big = torch.arange(1 << 22, dtype=torch.float32, device="cuda:0")
    moved = big.to("cuda:1") * 2
    back = moved.cpu()
    if not torch.equal(back, torch.arange(1 << 22, dtype=torch.float32) * 2):
        print("multi_gpu: FAIL: a tensor moved between the devices changed")
        return 1
    for d in range(2):
        torch.cuda.synchronize(d)
    print("multi_gpu: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
