"""What a PyTorch process's CUDA context takes on the device, beside what its allocator holds
(run unwrapped, on an otherwise quiet device): NVML's figure for this process less
`torch.cuda.memory_reserved()`, after the first tensor and again after a bf16 matmul (cuBLAS's
handle and kernels load then). The node-mode audit allows each process `--context-allowance`
for it; the fake GPU models it as 1/32 of the device, at most 512 MiB (docs/fakegpu.md).
"""

import os

from common import emit, nvml_reading, skip

try:
    import torch
except ImportError as e:
    skip(f"torch not importable: {e}")


def outside_allocator():
    torch.cuda.synchronize()
    used = nvml_reading()["procs"].get(str(os.getpid()))
    reserved = torch.cuda.memory_reserved()
    return {"nvml_used": used, "reserved": reserved,
            "context_bytes": None if used is None else used - reserved}


r = {"torch": torch.__version__, "cuda": torch.version.cuda}
torch.cuda.init()
x = torch.ones(1, device="cuda")
r["first_tensor"] = outside_allocator()
a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
(a @ a).sum().item()
r["after_matmul"] = outside_allocator()
emit(r)
