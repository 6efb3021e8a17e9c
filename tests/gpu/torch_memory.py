"""PyTorch under a VRAM quota (run under the shim with GPUSLICE_MEMORY and, optionally,
PYTORCH_CUDA_ALLOC_CONF): what mem_get_info and the device properties report, how many 1 GiB
tensors fit before torch's out-of-memory error, whether empty_cache() gives the quota back, and
what nvidia-smi says from inside the slice and from outside (the real usage)."""

import os
import sys

from common import GiB, emit, skip, smi_in_slice, smi_process_used_mib

try:
    import torch
except ImportError as e:
    skip(f"torch not importable: {e}")

LIMIT = 16  # tensors; far above any quota tested, so an unenforced quota ends here, not in a real OOM


def fill(held):
    """Allocate 1 GiB tensors into `held` until out of memory; returns the error seen."""
    while len(held) < LIMIT:
        try:
            held.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
        except Exception as e:  # judged by type below: only torch's OOM error passes
            return {
                "type": f"{type(e).__module__}.{type(e).__qualname__}",
                "is_torch_oom": isinstance(e, torch.cuda.OutOfMemoryError),
                "message": str(e).splitlines()[0][:300] if str(e) else "",
            }
    return None


r = {"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "torch": torch.__version__}
torch.cuda.init()
torch.empty(1, device="cuda")  # the context exists from here
free, total = torch.cuda.mem_get_info()
r["mem_get_info"] = {"free": free, "total": total}
r["total_memory"] = torch.cuda.get_device_properties(0).total_memory
r["smi_real_baseline"] = smi_process_used_mib(os.getpid())

held = []
r["oom"] = fill(held)
r["tensors"] = len(held)
torch.cuda.synchronize()
try:
    r["memory_reserved"] = torch.cuda.memory_reserved()
except RuntimeError as e:  # not every allocator backend keeps these statistics
    r["memory_reserved"] = str(e)[:100]
r["smi_in_slice_full"] = smi_in_slice()
r["smi_real_full"] = smi_process_used_mib(os.getpid())
free_full, _ = torch.cuda.mem_get_info()
r["free_when_full"] = free_full

del held[:]
torch.cuda.synchronize()
torch.cuda.empty_cache()
free_after, _ = torch.cuda.mem_get_info()
r["free_after_empty_cache"] = free_after
held2 = []
r["oom_again"] = fill(held2)
r["tensors_again"] = len(held2)
del held2[:]
torch.cuda.empty_cache()
emit(r)
sys.stdout.flush()
