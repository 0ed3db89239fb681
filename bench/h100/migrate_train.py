# A deterministic PyTorch training run for issue 17's moves: a small
# transformer on fixed random tokens, one loss.item() a step, every loss
# printed in full so runs compare exactly; an optional block of extra state
# (--state-mb) makes the session larger. Prints "ready" once warm, then
# "step N loss L" per step and "state_bytes:" / "step_ms:" at the end.
import argparse
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--state-mb", type=int, default=0)
p.add_argument("--pause-ms", type=float, default=10.0)
args = p.parse_args()

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"
vocab, width, seq, batch = 512, 256, 64, 16
layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
model = torch.nn.Sequential(
    torch.nn.Embedding(vocab, width),
    torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
    torch.nn.Linear(width, vocab),
).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
gen = torch.Generator().manual_seed(1)
data = torch.randint(0, vocab, (64, batch, seq + 1), generator=gen).to(dev)
extra = None
if args.state_mb:
    extra = (torch.arange(args.state_mb * (1 << 18), device=dev) % 1000).float()
print("ready", flush=True)
times = []
for step in range(args.steps):
    t0 = time.perf_counter()
    tokens = data[step % data.shape[0]]
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    value = loss.item()
    times.append(time.perf_counter() - t0)
    print(f"step {step} loss {value!r}", flush=True)
    if args.pause_ms:
        time.sleep(args.pause_ms / 1000)
if extra is not None:
    want = float((args.state_mb * (1 << 18) - 1) % 1000) * 1000 + float(extra.sum().item() > 0)
    got = extra[-1].item() * 1000 + float(extra.sum().item() > 0)
    print("extra state " + ("PASS" if got == want else f"FAIL {got} != {want}"), flush=True)
times.sort()
print(f"step_ms: {1000 * times[len(times) // 2]:.3f}")
print(f"state_bytes: {torch.cuda.memory_allocated()}")
print("PASS")
