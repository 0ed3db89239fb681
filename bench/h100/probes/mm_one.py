"""The GPT-2 step's slowest matmul shapes through cumux (kernel_speed.py), a few runs each,
for a profiler to look at: `python3 mm_one.py [RUNS]`."""
import sys

import torch

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
torch.backends.cuda.matmul.allow_tf32 = True
bf = torch.bfloat16
n, c = 8192, 768
x = torch.randn(n, c, device="cuda", dtype=bf)
h = torch.randn(n, 4 * c, device="cuda", dtype=bf)
w_qkv = torch.randn(3 * c, c, device="cuda", dtype=bf)
w_down = torch.randn(c, 4 * c, device="cuda", dtype=bf)
g_qkv = torch.randn(n, 3 * c, device="cuda", dtype=bf)
for _ in range(runs):
    x @ w_qkv.t()
    h @ w_down.t()
    g_qkv @ w_qkv
torch.cuda.synchronize()
print("mm_one: PASS")
