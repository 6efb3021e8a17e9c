"""What legacy CUDA IPC costs on the fake GPU (ctypes): `cuda_ipc_bench.py MIB RUNS` prints one
JSON line of medians (µs) over RUNS fresh MIB MiB allocations:

- `get_untouched`: the first cuIpcGetMemHandle of an allocation never written (its pages move
  into a memfd; nothing to copy);
- `get_filled`: the same after the allocation was filled from the host (every byte copied);
- `get_again`: a second cuIpcGetMemHandle of the same allocation;
- `open`, `close`: cuIpcOpenMemHandle and cuIpcCloseMemHandle in another process (this script
  with `import`, reading handles on stdin).
"""
import ctypes
import json
import os
import subprocess
import sys

from cuda_ctx import Timings, alloc, answer_lines, primary_context
from fw_common import MI


class IpcHandle(ctypes.Structure):  # passed by value, as cuda.h declares it
    _fields_ = [("reserved", ctypes.c_char * 64)]


def importer():
    cuda, _ = primary_context()
    t = Timings("open", "close")

    def each(line):
        h = IpcHandle.from_buffer_copy(bytes.fromhex(line))
        p = ctypes.c_uint64()
        t.call("open", cuda.cuIpcOpenMemHandle_v2, ctypes.byref(p), h, 1)
        t.call("close", cuda.cuIpcCloseMemHandle, p)

    answer_lines(t, each)


def main(mib, runs):
    cuda, _ = primary_context()
    size = mib * MI
    data = bytes(range(256)) * (size // 256)
    child = subprocess.Popen([sys.executable, __file__, "import"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=os.environ)
    t = Timings("get_untouched", "get_filled", "get_again")
    for _ in range(runs):
        for kind in ("get_untouched", "get_filled"):
            p = alloc(cuda, size)
            if kind == "get_filled":
                assert cuda.cuMemcpyHtoD_v2(ctypes.c_uint64(p), data, ctypes.c_size_t(size)) == 0
            h = IpcHandle()
            t.call(kind, cuda.cuIpcGetMemHandle, ctypes.byref(h), ctypes.c_uint64(p))
            t.call("get_again", cuda.cuIpcGetMemHandle, ctypes.byref(h), ctypes.c_uint64(p))
            child.stdin.write(bytes(h).hex() + "\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "ok"
            assert cuda.cuMemFree_v2(ctypes.c_uint64(p)) == 0
    child.stdin.close()
    out = json.loads(child.stdout.readline())
    child.wait()
    out.update(t.medians())
    print(json.dumps(dict(mib=mib, runs=runs, median_us={k: round(v, 1) for k, v in out.items()})))


if __name__ == "__main__":
    if sys.argv[1] == "import":
        importer()
    else:
        main(int(sys.argv[1]), int(sys.argv[2]))
