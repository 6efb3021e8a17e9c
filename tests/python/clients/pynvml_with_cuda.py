"""One process that uses NVML and the driver API (as PyTorch does): NVML's view of device 0
before cuInit, the driver's (cuMemGetInfo, cuDeviceTotalMem) after it and after allocating
argv[1] bytes, and NVML's again. Prints one JSON line."""

import ctypes
import json
import sys

import pynvml
from cuda_ctx import alloc, primary_context

hold = int(sys.argv[1]) if len(sys.argv) > 1 else 0


def nvml(h):
    m = pynvml.nvmlDeviceGetMemoryInfo(h)
    return {"total": m.total, "free": m.free, "used": m.used}


def cuda_info(cuda, dev):
    free, total, dtotal = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
    assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    assert cuda.cuDeviceTotalMem_v2(ctypes.byref(dtotal), dev) == 0
    return {"total": total.value, "free": free.value, "device_total": dtotal.value}


pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {"nvml_before": nvml(h)}
cuda, dev = primary_context()
out["cuda"] = cuda_info(cuda, dev)
out["nvml_attached"] = nvml(h)
if hold:
    alloc(cuda, hold)
out["cuda_after"] = cuda_info(cuda, dev)
out["nvml_after"] = nvml(h)
out["processes"] = sorted([p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
out["pid"] = __import__("os").getpid()
print(json.dumps(out))
