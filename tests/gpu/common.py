"""Shared pieces of the real-GPU workloads that scripts/gpu-validate.sh runs.

Every workload is a separate Python process (so a crash is a measured outcome, not the end of
the run) that prints exactly one JSON object as its last stdout line; `verdict.py` reads it.
Workloads never decide PASS or FAIL themselves: they measure, the verdict judges.
"""

import ctypes
import json
import os
import subprocess
import sys
import time

GiB = 1 << 30
MiB = 1 << 20


def emit(obj):
    """Print the workload's result: one JSON line, last on stdout."""
    sys.stdout.flush()
    print(json.dumps(obj, sort_keys=True), flush=True)


def skip(reason):
    """End the workload as not applicable here (a library missing, no GPU backend)."""
    emit({"skip": reason})
    sys.exit(0)


def unwrapped_env():
    """This process's environment without the shim: for tools that must see the real device."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


def nvidia_smi(args, wrapped):
    """Run nvidia-smi with CSV output; `wrapped` keeps LD_PRELOAD (and the slice variables), so
    it answers as a member of this process's slice would see the device. Returns rows of cells,
    or an error string."""
    env = dict(os.environ) if wrapped else unwrapped_env()
    try:
        out = subprocess.run(
            ["nvidia-smi", *args, "--format=csv,noheader,nounits"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi: {e}"
    if out.returncode != 0:
        return f"nvidia-smi exit {out.returncode}: {(out.stderr or out.stdout).strip()[:200]}"
    return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def smi_process_used_mib(pid):
    """Real device memory (MiB) the driver attributes to `pid`, seen from outside the slice.
    In a container the driver may show host pids: then, if exactly one process is listed, that
    one is taken and the fact is recorded."""
    rows = nvidia_smi(["--query-compute-apps=pid,used_memory"], wrapped=False)
    if isinstance(rows, str):
        return {"error": rows}
    for r in rows:
        if len(r) >= 2 and r[0] == str(pid):
            return {"used_mib": _num(r[1])}
    if len(rows) == 1 and len(rows[0]) >= 2:
        return {"used_mib": _num(rows[0][1]), "note": f"pid {pid} not listed; the only process was taken"}
    return {"error": f"pid {pid} not among {rows}"}


def smi_in_slice():
    """memory.total and memory.used as nvidia-smi reports them from inside this slice."""
    # The device the workload used: the first of CUDA_VISIBLE_DEVICES (an index or a UUID).
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    rows = nvidia_smi(["-i", first, "--query-gpu=memory.total,memory.used"], wrapped=True)
    if isinstance(rows, str):
        return {"error": rows}
    if not rows or len(rows[0]) < 2:
        return {"error": f"unexpected nvidia-smi output {rows}"}
    return {"total_mib": _num(rows[0][0]), "used_mib": _num(rows[0][1])}


def _num(s):
    try:
        return float(s)
    except ValueError:
        return s


def wait_until(t):
    """Sleep until wall-clock time `t` (seconds since the epoch): lets concurrent tenants measure
    the same window although they started at different moments."""
    d = t - time.time()
    if d > 0:
        time.sleep(d)


# ---- NVML, read directly (ctypes), as the node's operator sees the device ----

NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1
NVML_ERROR_INSUFFICIENT_SIZE = 7


class _NvmlMemory(ctypes.Structure):  # nvmlMemory_t (v1)
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _NvmlProcess(ctypes.Structure):  # nvmlProcessInfo_t (v2 and v3)
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                ("gpu_instance", ctypes.c_uint), ("compute_instance", ctypes.c_uint)]


_nvml = None


def nvml_reading(index=0):
    """Device `index`'s memory (`total`, `free`, `used`, bytes) and its compute processes
    (`procs`: {pid: bytes, or None where NVML cannot say}) as NVML reports them to this process.
    Run it without the shim: under `libgpuslice.so` NVML answers as the slice sees the device."""
    global _nvml
    if _nvml is None:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        r = lib.nvmlInit_v2()
        if r != 0:
            raise RuntimeError(f"nvmlInit_v2: NVML error {r}")
        _nvml = lib
    dev = ctypes.c_void_p()
    r = _nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(dev))
    if r != 0:
        raise RuntimeError(f"nvmlDeviceGetHandleByIndex_v2({index}): NVML error {r}")
    mem = _NvmlMemory()
    r = _nvml.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(mem))
    if r != 0:
        raise RuntimeError(f"nvmlDeviceGetMemoryInfo: NVML error {r}")
    size = 64
    while True:
        n, procs = ctypes.c_uint(size), (_NvmlProcess * size)()
        r = _nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(n), procs)
        if r == NVML_ERROR_INSUFFICIENT_SIZE and size < 65536:
            size *= 4
            continue
        if r != 0:
            raise RuntimeError(f"nvmlDeviceGetComputeRunningProcesses_v3: NVML error {r}")
        break
    return {
        "total": mem.total,
        "free": mem.free,
        "used": mem.used,
        "procs": {str(procs[i].pid): None if procs[i].used == NVML_VALUE_NOT_AVAILABLE else procs[i].used
                  for i in range(n.value)},
    }
