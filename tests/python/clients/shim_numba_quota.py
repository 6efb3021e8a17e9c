"""numba.cuda under the shim: what get_memory_info reports, and how many arrays fit.

argv: array size in bytes, number of arrays to try. Prints one JSON line.
"""

import json
import sys

import numpy as np
from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError

size, count = int(sys.argv[1]), int(sys.argv[2])
free0, total0 = cuda.current_context().get_memory_info()
arrays, results = [], []
for _ in range(count):
    try:
        arrays.append(cuda.device_array(size, dtype=np.uint8))
        results.append({"ok": True})
    except CudaAPIError as e:
        results.append({"ok": False, "error": type(e).__name__, "code": e.code, "message": str(e)})
free1, total1 = cuda.current_context().get_memory_info()
# The memory is usable: write and read back through the first array.
ok_rw = False
if arrays:
    host = np.arange(1024, dtype=np.uint8)
    arrays[0][:1024].copy_to_device(host)
    ok_rw = bool((arrays[0][:1024].copy_to_host() == host).all())
del arrays
print(json.dumps({"total": total0, "free": free0, "total_after": total1, "free_after": free1,
                  "results": results, "readback": ok_rw}))
