"""The fake GPU's driver where it must behave like NVIDIA's, through ctypes (no framework):

- `fake_driver.py events`: `cuEventDestroy` of an event whose record is still queued returns at
  once (the stream is still busy after it), the handle is dead, a `cuStreamWaitEvent` queued
  before the destroy still waits for the record, and a host function may destroy an event
  recorded behind it on its own stream (a driver that waited there would deadlock).
- `fake_driver.py versions`: what `cuDriverGetVersion`, `cuGetProcAddress_v2` and NVML say about
  the driver.
- `fake_driver.py headroom`: device memory a context takes, and what is left to allocate.
"""
import ctypes
import sys

import pynvml

from cuda_ctx import primary_context
from fw_common import emit

SPIN_PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry gpuslice_spin(.param .u64 ns) { ret; }
"""
NOT_READY = 600
INVALID_HANDLE = 400
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} -> {rc}")


def spin_function(cuda):
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(mod), SPIN_PTX), "cuModuleLoadData")
    check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"gpuslice_spin"), "cuModuleGetFunction")
    return fn


def spin(cuda, fn, stream, ns):
    arg = ctypes.c_uint64(ns)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(arg), ctypes.c_void_p))
    check(cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, None), "cuLaunchKernel")


def stream(cuda):
    s = ctypes.c_void_p()
    check(cuda.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
    return s


def event(cuda):
    e = ctypes.c_void_p()
    check(cuda.cuEventCreate(ctypes.byref(e), 0), "cuEventCreate")
    return e


def events():
    cuda, _ = primary_context()
    fn = spin_function(cuda)
    out = {}
    # Destroy while the record is queued behind a 3 s kernel.
    busy = stream(cuda)
    spin(cuda, fn, busy, 3_000_000_000)
    e = event(cuda)
    check(cuda.cuEventRecord(e, busy), "cuEventRecord")
    waiter = stream(cuda)
    check(cuda.cuStreamWaitEvent(waiter, e, 0), "cuStreamWaitEvent")
    out["destroy"] = cuda.cuEventDestroy_v2(e)
    out["busy_after_destroy"] = cuda.cuStreamQuery(busy)
    out["query_destroyed"] = cuda.cuEventQuery(e)
    # The wait queued before the destroy still holds until the record (after the kernel).
    out["waiter_sync"] = cuda.cuStreamSynchronize(waiter)
    out["busy_after_waiter"] = cuda.cuStreamQuery(busy)
    # A host function destroys the event recorded behind it on its own stream.
    s = stream(cuda)
    late = event(cuda)
    destroyed = []

    @HOST_FN
    def destroy_late(_):
        destroyed.append(cuda.cuEventDestroy_v2(late))

    spin(cuda, fn, s, 50_000_000)
    check(cuda.cuLaunchHostFunc(s, destroy_late, None), "cuLaunchHostFunc")
    check(cuda.cuEventRecord(late, s), "cuEventRecord")
    out["host_fn_stream_sync"] = cuda.cuStreamSynchronize(s)
    out["host_fn_destroy"] = destroyed
    # Destroyed events are reused once their records ran: many create/record/destroy cycles
    # on a busy stream all succeed.
    spin(cuda, fn, s, 200_000_000)
    rcs = set()
    for _ in range(2000):
        x = event(cuda)
        rcs.add(cuda.cuEventRecord(x, s))
        rcs.add(cuda.cuEventDestroy_v2(x))
    rcs.add(cuda.cuStreamSynchronize(s))
    out["cycles"] = sorted(rcs)
    emit(**out)


def proc_address(cuda, name, version):
    p, status = ctypes.c_void_p(), ctypes.c_int()
    rc = cuda.cuGetProcAddress_v2(name.encode(), ctypes.byref(p), version, ctypes.c_uint64(0),
                                  ctypes.byref(status))
    return rc, p.value, status.value


def symbol(cuda, name):
    return ctypes.cast(getattr(cuda, name), ctypes.c_void_p).value


def versions():
    cuda = ctypes.CDLL("libcuda.so.1")
    v = ctypes.c_int()
    check(cuda.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
    v = v.value
    resolved = {}
    # What a runtime of the driver's own version and a newer one (13.2) get.
    for name in ("cuCtxSynchronize", "cuCtxGetDevice", "cuMemAlloc", "cuEventElapsedTime",
                 "cuGraphInstantiate", "cuStreamBeginCapture", "cuMemGetDefaultMemPool",
                 "cuGraphGetId"):
        for asked in (v, 13020):
            rc, p, status = proc_address(cuda, name, asked)
            exported = None
            for sym in (name, name + "_v2", name + "_v3", name + "_v4"):
                try:
                    if p and symbol(cuda, sym) == p:
                        exported = sym
                except AttributeError:
                    pass
            resolved[f"{name}@{asked}"] = dict(rc=rc, status=status, symbol=exported)
    pynvml.nvmlInit()
    nvml = dict(
        driver=pynvml.nvmlSystemGetDriverVersion(),
        cuda=pynvml.nvmlSystemGetCudaDriverVersion_v2(),
        nvml=pynvml.nvmlSystemGetNVMLVersion(),
    )
    emit(driver_version=v, resolved=resolved, nvml=nvml)


def headroom():
    cuda = ctypes.CDLL("libcuda.so.1")
    check(cuda.cuInit(0), "cuInit")
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    before = pynvml.nvmlDeviceGetMemoryInfo(h).used
    cuda, _ = primary_context()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
    p = ctypes.c_uint64()
    whole = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(total.value))
    rest = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(free.value))
    more = ctypes.c_uint64()
    one_more = cuda.cuMemAlloc_v2(ctypes.byref(more), ctypes.c_size_t(1))
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    emit(total=total.value, free=free.value, nvml_used_before=before, alloc_total=whole,
         alloc_free=rest, alloc_one_more=one_more,
         nvml_process_used=[x.usedGpuMemory for x in procs],
         nvml_used=pynvml.nvmlDeviceGetMemoryInfo(h).used)


if __name__ == "__main__":
    {"events": events, "versions": versions, "headroom": headroom}[sys.argv[1]]()
