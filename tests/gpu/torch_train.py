"""A fixed PyTorch training loop (an MLP on synthetic data, AdamW) timed step by step: the
workload for the shim's overhead. Small layers keep it launch-bound, where a hook's cost shows
most. Prints the median step time of several blocks of steps.

usage: torch_train.py [--steps 400] [--blocks 5] [--warmup 50]
"""

import argparse
import statistics
import time

from common import emit, skip

try:
    import torch
except ImportError as e:
    skip(f"torch not importable: {e}")

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=400, help="steps per timed block")
p.add_argument("--blocks", type=int, default=5)
p.add_argument("--warmup", type=int, default=50)
p.add_argument("--width", type=int, default=2048)
p.add_argument("--batch", type=int, default=256)
a = p.parse_args()

torch.manual_seed(0)
layers = []
for _ in range(4):
    layers += [torch.nn.Linear(a.width, a.width), torch.nn.GELU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(a.width, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
xs = torch.randn(8, a.batch, a.width, device="cuda")
ys = torch.randint(0, 10, (8, a.batch), device="cuda")
loss_fn = torch.nn.CrossEntropyLoss()


def step(i):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(xs[i % 8]), ys[i % 8])
    loss.backward()
    opt.step()
    return loss


for i in range(a.warmup):
    step(i)
torch.cuda.synchronize()
per_step = []
for _ in range(a.blocks):
    t0 = time.perf_counter()
    for i in range(a.steps):
        loss = step(i)
    torch.cuda.synchronize()
    per_step.append((time.perf_counter() - t0) / a.steps)
emit(
    {
        "step_seconds_median": statistics.median(per_step),
        "step_seconds_blocks": per_step,
        "final_loss": float(loss),
        "steps": a.steps * a.blocks,
    }
)
