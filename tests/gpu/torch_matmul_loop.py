"""One compute tenant made of PyTorch matmuls: after warming up it waits for a common start
time, then counts the matmuls that complete in a fixed window. Two tenants started with the
same --start-at measure the same window; their rates divided by a solo run's rate are the
shares of the GPU they achieved.

usage: torch_matmul_loop.py --start-at EPOCH --seconds S [--n 8192] [--batch 4]
"""

import argparse
import time

from common import emit, skip, wait_until

try:
    import torch
except ImportError as e:
    skip(f"torch not importable: {e}")

p = argparse.ArgumentParser()
p.add_argument("--start-at", type=float, required=True)
p.add_argument("--seconds", type=float, required=True)
p.add_argument("--n", type=int, default=8192)
p.add_argument("--batch", type=int, default=4, help="matmuls queued between synchronizations")
a = p.parse_args()

x = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16)
y = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(x)
for _ in range(3):
    torch.matmul(x, y, out=out)
torch.cuda.synchronize()
late = time.time() - a.start_at  # > 0: warm-up overran the common start; the window shrinks

wait_until(a.start_at)
end = a.start_at + a.seconds
t0 = time.time()
done = 0
while time.time() < end:
    for _ in range(a.batch):
        torch.matmul(x, y, out=out)
    torch.cuda.synchronize()
    done += a.batch
t1 = time.time()
emit(
    {
        "matmuls": done,
        "window_seconds": t1 - t0,
        "rate": done / (t1 - t0),
        "late_start_seconds": max(0.0, late),
        "n": a.n,
    }
)
