"""The driver API through ctypes, for clients that need a CUDA context and no framework.

- `primary_context(ordinal=0)`: `cuInit`, then device `ordinal`'s primary context made current;
  returns `(cuda, dev)`, the loaded `libcuda.so.1` and the `CUdevice`.
- `alloc(cuda, size)`: `cuMemAlloc_v2` of `size` bytes (asserted to succeed); the pointer.
- `Location`, `Prop`: `CUmemLocation` and `CUmemAllocationProp`, for `cuMemCreate`.
- `Timings`: driver calls timed by name (µs), and the median of each, for the benchmarks;
  `answer_lines(t, each)`: the importing side of a two-process benchmark.
"""
import ctypes
import json
import statistics
import sys
import time


def primary_context(ordinal=0):
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    return cuda, dev


def alloc(cuda, size):
    ptr = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0
    return ptr.value


class Location(ctypes.Structure):  # CUmemLocation
    _fields_ = [("type", ctypes.c_uint), ("id", ctypes.c_int)]


class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_uint), ("handle_types", ctypes.c_uint), ("location", Location),
                ("win32", ctypes.c_void_p), ("flags", ctypes.c_uint8 * 8)]


class Timings:
    """Driver calls timed by name, in µs."""

    def __init__(self, *names):
        self.times = {n: [] for n in names}

    def call(self, name, f, *args):
        """`f(*args)`, a driver call asserted to succeed, its time kept under `name`."""
        t0 = time.perf_counter()
        r = f(*args)
        self.times[name].append((time.perf_counter() - t0) * 1e6)
        assert r == 0, (name, r)

    def medians(self):
        return {k: statistics.median(v) for k, v in self.times.items()}


def answer_lines(t, each):
    """The importing process of a two-process benchmark: `each(line)` for every line on stdin,
    each answered `ok`, then `t`'s medians as one JSON line."""
    for line in sys.stdin:
        each(line.strip())
        print("ok", flush=True)
    print(json.dumps(t.medians()), flush=True)
