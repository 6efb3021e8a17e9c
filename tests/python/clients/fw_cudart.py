"""The CUDA runtime of this venv's NVIDIA wheel, through ctypes: cudaGetDeviceCount, a malloc,
a free and a too-large malloc; prints their codes as JSON."""
import ctypes
import glob
import os
import site

from fw_common import emit

libs = [p for sp in site.getsitepackages()
        for p in glob.glob(os.path.join(sp, "nvidia/cu13/lib/libcudart.so.13"))
        + glob.glob(os.path.join(sp, "nvidia/cuda_runtime/lib/libcudart.so.12"))]
rt = ctypes.CDLL(libs[0])
n = ctypes.c_int(-1)
code = rt.cudaGetDeviceCount(ctypes.byref(n))
out = dict(lib=os.path.basename(libs[0]), count=[code, n.value])
if code == 0:
    p = ctypes.c_void_p()
    out["malloc"] = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20))
    out["free"] = rt.cudaFree(p)
    out["oom"] = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 50))
emit(**out)
