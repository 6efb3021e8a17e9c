"""pynvml (nvidia-ml-py) on whatever libnvidia-ml.so.1 the environment provides.

Reads driver/CUDA versions, the device count, and per device the name, UUID (and the handle by
UUID), memory info v1 and v2, and running compute processes. Prints one JSON object.
"""

import json

import pynvml


def s(v):
    return v.decode() if isinstance(v, bytes) else v


pynvml.nvmlInit()
report = {
    "driver_version": s(pynvml.nvmlSystemGetDriverVersion()),
    "cuda_driver_version": pynvml.nvmlSystemGetCudaDriverVersion_v2(),
    "devices": [],
}
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    uuid = s(pynvml.nvmlDeviceGetUUID(h))
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    report["devices"].append({
        "index": i,
        "name": s(pynvml.nvmlDeviceGetName(h)),
        "uuid": uuid,
        "uuid_handle_matches": s(pynvml.nvmlDeviceGetUUID(by_uuid)) == uuid,
        "memory": {"total": m1.total, "free": m1.free, "used": m1.used},
        "memory_v2": {"total": m2.total, "free": m2.free, "used": m2.used, "reserved": m2.reserved},
        "processes": [{"pid": p.pid, "used": p.usedGpuMemory} for p in procs],
    })
pynvml.nvmlShutdown()
print(json.dumps(report))
