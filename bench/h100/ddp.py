"""PyTorch DDP with NCCL, one rank per GPU (run by torchrun): a small MLP
trained for 20 steps on the same data on every rank, then an all-reduce of
256 MiB timed over 50 rounds. Rank 0 prints each step's loss
(`step N loss X`), the median step time after 5 (`step_ms: X`), the
all-reduce bus bandwidth (`allreduce_busbw_gbs: X`)
and `ddp: PASS`. Run natively and through cumux: the losses must agree."""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
    ).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(512, 1024, generator=gen).cuda()
    y = torch.randint(0, 10, (512,), generator=gen).cuda()
    step_times = []
    for step in range(20):
        torch.cuda.synchronize()
        began = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        value = total.item()
        step_times.append(time.perf_counter() - began)
        if rank == 0:
            print(f"step {step} loss {value / world:.6f}", flush=True)
    data = torch.ones(64 << 20, dtype=torch.float32, device="cuda")
    dist.all_reduce(data)
    torch.cuda.synchronize()
    rounds = 50
    start = time.perf_counter()
    for _ in range(rounds):
        dist.all_reduce(data)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / rounds
    busbw = data.numel() * 4 / seconds * 2 * (world - 1) / world / 1e9
    if rank == 0:
        later = sorted(step_times[5:])
        print(f"step_ms: {later[len(later) // 2] * 1e3:.2f}", flush=True)
        print("step_times_ms:", " ".join(f"{t * 1e3:.2f}" for t in step_times), flush=True)
        print(f"allreduce_busbw_gbs: {busbw:.1f}", flush=True)
        print("ddp: PASS", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
