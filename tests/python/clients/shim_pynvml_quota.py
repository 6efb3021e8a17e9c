"""pynvml under the shim: the memory NVML reports for device 0 (v1 and v2 structs).

Optional argv: bytes to allocate through the driver first (ctypes), to see them as used.
Prints one JSON line.
"""

import ctypes
import json
import sys

import pynvml

hold = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if hold:
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(hold)) == 0

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
try:
    m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    v2 = {"total": m2.total, "free": m2.free, "used": m2.used}
except TypeError:  # older pynvml without the version argument
    v2 = None
print(json.dumps({"total": m1.total, "free": m1.free, "used": m1.used, "v2": v2}))
