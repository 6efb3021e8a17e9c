"""pynvml on one device (NVML index 0 unless --index), as a monitoring tool inside (or outside) a slice sees it.

Never touches CUDA. Reports memory (v1 and v2 structs), the compute and graphics process lists
through pynvml and through the raw v1/v2/v3 entry points (with NVML's count protocol: ask with
0, then with too small a buffer, then with enough), the MPS list, the detail list
(nvmlDeviceGetRunningProcessDetailList, per mode), the accounting pids (pynvml and raw),
utilization rates and process utilization.

Options (all optional):
  --wait-used BYTES   poll (up to --timeout s) until memory `used` reaches BYTES
  --wait-util PCT     poll until utilization `gpu` reaches PCT
  --wait-procs N      poll until the compute process list has N entries
  --announce          print {"event": "polling"} after the first poll (flushed), then keep polling
Prints one JSON object as its last line.
"""

import argparse
import ctypes
import json
import time

import pynvml

ap = argparse.ArgumentParser()
ap.add_argument("--wait-used", type=int)
ap.add_argument("--wait-util", type=int)
ap.add_argument("--wait-procs", type=int)
ap.add_argument("--announce", action="store_true")
ap.add_argument("--timeout", type=float, default=20.0)
ap.add_argument("--index", type=int, default=0, help="NVML device index")
ap.add_argument("--stats-pid", type=int, action="append", default=[],
                help="also report nvmlDeviceGetAccountingStats for PID (repeatable)")
args = ap.parse_args()


class ProcV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def raw_processes(handle, name, struct):
    """The count protocol of one raw entry point, step by step."""
    fn = pynvml._nvmlGetFunctionPointer(name)
    out = {}
    count = ctypes.c_uint(0)
    out["ask"] = [fn(handle, ctypes.byref(count), None), count.value]
    n = count.value
    if n >= 2:
        small = ctypes.c_uint(1)
        arr = (struct * 1)()
        out["small"] = [fn(handle, ctypes.byref(small), arr), small.value]
    count = ctypes.c_uint(n + 3)
    arr = (struct * (n + 3))()
    r = fn(handle, ctypes.byref(count), arr)
    out["full"] = [r, count.value]
    if struct is ctypes.c_uint:  # a bare pid per entry (the accounting list)
        out["list"] = sorted(arr[i] for i in range(count.value)) if r == 0 else []
    else:
        out["list"] = sorted([arr[i].pid, arr[i].usedGpuMemory] for i in range(count.value)) if r == 0 else []
    return out


def detail_list_version(handle, version):
    """What nvmlDeviceGetRunningProcessDetailList answers for a struct of another version."""
    lst = pynvml.c_nvmlProcessDetailList_t()
    lst.version = version
    lst.mode = pynvml.NVML_PROCESS_MODE_COMPUTE
    return pynvml._nvmlGetFunctionPointer("nvmlDeviceGetRunningProcessDetailList")(handle, ctypes.byref(lst))


def nvml_error(f):
    try:
        return f(), None
    except pynvml.NVMLError as e:
        return None, e.value


def report(h):
    m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    u = pynvml.nvmlDeviceGetUtilizationRates(h)
    samples, samples_err = nvml_error(lambda: pynvml.nvmlDeviceGetProcessUtilization(h, 0))
    infos, infos_err = nvml_error(lambda: pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, 0))
    return {
        "memory": {"total": m1.total, "free": m1.free, "used": m1.used},
        "memory_v2": {"total": m2.total, "free": m2.free, "used": m2.used, "reserved": m2.reserved},
        "processes": sorted([p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)),
        "graphics": sorted([p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)),
        "mps": sorted([p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h)),
        "detail": {
            mode: sorted([p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetRunningProcessDetailList(
                h, pynvml.nvmlProcessDetailList_v1, m))
            for mode, m in (("compute", pynvml.NVML_PROCESS_MODE_COMPUTE),
                            ("graphics", pynvml.NVML_PROCESS_MODE_GRAPHICS),
                            ("mps", pynvml.NVML_PROCESS_MODE_MPS))
        },
        "raw": {
            "v1": raw_processes(h, "nvmlDeviceGetComputeRunningProcesses", ProcV1),
            "v2": raw_processes(h, "nvmlDeviceGetComputeRunningProcesses_v2", pynvml.c_nvmlProcessInfo_v2_t),
            "v3": raw_processes(h, "nvmlDeviceGetComputeRunningProcesses_v3", pynvml.c_nvmlProcessInfo_v3_t),
        },
        "detail_v2_struct": detail_list_version(h, pynvml.nvmlProcessDetailList_v1 + (1 << 24)),
        "utilization": {"gpu": u.gpu, "memory": u.memory},
        "accounting_pids": nvml_error(lambda: sorted(pynvml.nvmlDeviceGetAccountingPids(h))),
        "accounting_raw": raw_processes(h, "nvmlDeviceGetAccountingPids", ctypes.c_uint),
        "accounting_stats": {str(pid): nvml_error(
            lambda: pynvml.nvmlDeviceGetAccountingStats(h, pid).maxMemoryUsage)
            for pid in args.stats_pid},
        "process_utilization": None if samples is None else sorted([s.pid, s.smUtil] for s in samples),
        "process_utilization_error": samples_err,
        "processes_utilization_info": None if infos is None else sorted([s.pid, s.smUtil] for s in infos),
        "processes_utilization_info_error": infos_err,
    }


pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(args.index)
deadline = time.monotonic() + args.timeout
polls = 0
while True:
    r = report(h)
    polls += 1
    if polls == 1 and args.announce:
        print(json.dumps({"event": "polling", **r}), flush=True)
    done = (
        (args.wait_used is None or r["memory"]["used"] >= args.wait_used)
        and (args.wait_util is None or r["utilization"]["gpu"] >= args.wait_util)
        and (args.wait_procs is None or len(r["processes"]) >= args.wait_procs)
    )
    if done or time.monotonic() >= deadline:
        break
    time.sleep(0.1)
pynvml.nvmlShutdown()
r["polls"] = polls
print(json.dumps(r))
