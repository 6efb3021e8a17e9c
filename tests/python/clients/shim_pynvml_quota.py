"""pynvml under the shim: the memory NVML reports for device 0 (v1 and v2 structs).

Optional argv: bytes to allocate through the driver first (ctypes), to see them as used.
Prints one JSON line.
"""

import json
import sys

import pynvml
from cuda_ctx import alloc, primary_context

hold = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if hold:
    cuda, _ = primary_context()
    alloc(cuda, hold)

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
try:
    m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    v2 = {"total": m2.total, "free": m2.free, "used": m2.used}
except TypeError:  # older pynvml without the version argument
    v2 = None
print(json.dumps({"total": m1.total, "free": m1.free, "used": m1.used, "v2": v2}))
