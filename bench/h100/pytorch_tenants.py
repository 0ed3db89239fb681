"""Stock PyTorch as a cumux tenant (bench/h100/pytorch_tenants.sh runs it).

  quota GIB HOLD_S  the device PyTorch sees is the tenant's quota: mem_get_info and
                    total_memory say GIB, allocations fail with torch's
                    OutOfMemoryError past it, freed memory can be allocated again,
                    and a training step fits; then it holds its memory HOLD_S s.
  work GIB SECS     allocates GIB and multiplies matrices for SECS s, checking
                    the results: the tenant beside it.
Each prints one line `NAME: PASS ...` or `NAME: FAIL ...`.
"""
import sys
import time

import torch

GIB = 1 << 30


def quota(gib, hold):
    expect = int(gib * GIB)
    free, total = torch.cuda.mem_get_info()
    props = torch.cuda.get_device_properties(0).total_memory
    if total != expect or props != expect:
        return f"FAIL: mem_get_info total {total}, total_memory {props}, expected {expect}"
    chunks, refused = [], None
    try:
        for _ in range(int(gib) + 2):
            chunks.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError as e:
        refused = str(e).splitlines()[0]
    held = len(chunks) * GIB
    if refused is None:
        return f"FAIL: {len(chunks)} GiB allocated under a {gib} GiB quota"
    if held > expect or held < expect - 2 * GIB:
        return f"FAIL: {len(chunks)} GiB allocated before the refusal (quota {gib} GiB)"
    free_full, _ = torch.cuda.mem_get_info()
    del chunks
    torch.cuda.empty_cache()
    free_after, _ = torch.cuda.mem_get_info()
    again = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    del again
    # A small training step within the quota.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(512, 1024, device="cuda")
    y = torch.randint(0, 10, (512,), device="cuda")
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if not losses[-1] < losses[0]:
        return f"FAIL: the loss did not fall ({losses[0]:.3f} -> {losses[-1]:.3f})"
    print(
        f"quota: PASS: total {total / GIB:.2f} GiB; {held // GIB} GiB allocated, then "
        f"refused ({refused[:90]}); free {free_full / GIB:.2f} GiB when full, "
        f"{free_after / GIB:.2f} after freeing; loss {losses[0]:.3f} -> {losses[-1]:.3f}",
        flush=True,
    )
    keep = torch.empty(int(min(gib, 2) * GIB) // 2, dtype=torch.uint8, device="cuda")
    print("holding", flush=True)
    time.sleep(hold)
    del keep
    return None


def work(gib, secs):
    hold = torch.empty(int(gib * GIB), dtype=torch.uint8, device="cuda")
    torch.manual_seed(1)
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    ref = (a.double() @ b.double()).float()
    n, end = 0, time.time() + secs
    while time.time() < end:
        c = a @ b
        n += 1
    torch.cuda.synchronize()
    err = ((c - ref).abs().max() / ref.abs().max()).item()
    del hold
    if err > 1e-2:
        return f"FAIL: relative error {err:.2e}"
    print(f"work: PASS: {gib} GiB held, {n} matmuls in {secs} s, relative error {err:.1e}", flush=True)
    return None


def main():
    mode = sys.argv[1]
    if mode == "quota":
        failed = quota(float(sys.argv[2]), float(sys.argv[3]))
    elif mode == "work":
        failed = work(float(sys.argv[2]), float(sys.argv[3]))
    else:
        failed = f"FAIL: unknown mode {mode}"
    if failed:
        print(f"{mode}: {failed}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
