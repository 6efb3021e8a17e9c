"""Where the driver's entry points come from under the shim: cuGetProcAddress_v2 (default and
per-thread-stream flags, and asking for cuGetProcAddress itself) and dlsym. Reports, for each
lookup, the file that defines the returned address (dladdr). Prints one JSON line."""

import ctypes
import json


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


libc = ctypes.CDLL(None)
libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]


def where(addr):
    info = DlInfo()
    if not addr or not libc.dladdr(addr, ctypes.byref(info)):
        return None, None
    return (info.dli_fname or b"").decode().rsplit("/", 1)[-1], (info.dli_sname or b"").decode()


cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
gpa = cuda.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                ctypes.POINTER(ctypes.c_int)]
out = {"dlsym": {}, "proc_address": {}}
for name in ("cuMemAlloc_v2", "cuMemAllocAsync_ptsz", "cuLaunchKernel", "cuDeviceGetCount"):
    out["dlsym"][name] = where(ctypes.cast(getattr(cuda, name), ctypes.c_void_p).value)
for name, flags in (("cuMemAlloc", 0), ("cuMemAllocAsync", 0), ("cuMemAllocAsync", 2),
                    ("cuLaunchKernel", 2), ("cuGraphLaunch", 2), ("cuGetProcAddress", 0),
                    ("cuDeviceGetCount", 0)):
    p, st = ctypes.c_void_p(), ctypes.c_int()
    r = gpa(name.encode(), ctypes.byref(p), 12000, flags, ctypes.byref(st))
    out["proc_address"][f"{name}/{flags}"] = [r, st.value] + list(where(p.value))
print(json.dumps(out))
