"""numba.cuda (built-in, ctypes binding) on whatever libcuda.so.1 the environment provides.

Allocates device arrays, copies bytes there and back (host->device, device->device,
device->host), reads get_memory_info() around a large allocation, compiles a @cuda.jit kernel
and launches it. Prints one JSON object; exits non-zero on any failure. Kernel results are not
checked: the fake GPU simulates kernel time, it does not execute kernels.
"""

import json
import sys

import numpy as np
from numba import cuda

BIG = int(sys.argv[1]) if len(sys.argv) > 1 else 256 << 20

report = {}
ctx = cuda.current_context()
dev = cuda.get_current_device()
report["device_name"] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
report["compute_capability"] = list(dev.compute_capability)

rng = np.random.default_rng(1234)
host = rng.integers(0, 256, size=3 << 20, dtype=np.uint8)
d_a = cuda.to_device(host)
d_b = cuda.device_array_like(d_a)
d_b.copy_to_device(d_a)  # device -> device
back = d_b.copy_to_host()
report["roundtrip_bytes"] = int(host.nbytes)
report["roundtrip_equal"] = bool(np.array_equal(host, back))

floats = np.linspace(0, 1, 1000, dtype=np.float32)
report["float_roundtrip_equal"] = bool(np.array_equal(floats, cuda.to_device(floats).copy_to_host()))

free0, total0 = ctx.get_memory_info()
big = cuda.device_array(BIG, dtype=np.uint8)
free1, total1 = ctx.get_memory_info()
del big
report.update(free_before=int(free0), total=int(total0), free_with_big=int(free1),
              total_with_big=int(total1), big_bytes=BIG)


@cuda.jit
def add_one(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += 1


d_f = cuda.to_device(np.zeros(4096, dtype=np.float32))
add_one[16, 256](d_f)
cuda.synchronize()
stream = cuda.stream()
add_one[16, 256, stream](d_f)
stream.synchronize()
report["kernel_launched"] = True
report["ptx_has_entry"] = any("add_one" in p for p in add_one.inspect_asm().values())

print(json.dumps(report))
