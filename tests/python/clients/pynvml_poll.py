"""A monitoring loop: argv[1] polls (default 1000) of device 0, each one
nvmlDeviceGetMemoryInfo + nvmlDeviceGetComputeRunningProcesses + nvmlDeviceGetUtilizationRates,
every call timed on its own. Prints one JSON line: the median and 90th percentile per call, in
ns, per function, and the last answers (so a caller can check what was measured)."""

import json
import statistics
import sys
import time

import pynvml

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
calls = {
    "memory_info": lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
    "compute_processes": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
    "utilization": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
}
times = {k: [] for k in calls}
last = {}
clock = time.perf_counter_ns
for _ in range(n):
    for k, f in calls.items():
        t0 = clock()
        last[k] = f()
        times[k].append(clock() - t0)
pynvml.nvmlShutdown()


def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))]


m = last["memory_info"]
print(json.dumps({
    "polls": n,
    "ns": {k: {"median": statistics.median(v), "p90": q(v, 0.9)} for k, v in times.items()},
    "memory": {"total": m.total, "free": m.free, "used": m.used},
    "processes": sorted([p.pid, p.usedGpuMemory] for p in last["compute_processes"]),
}))
