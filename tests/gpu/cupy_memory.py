"""CuPy under a VRAM quota (run under the shim with GPUSLICE_MEMORY): the runtime's memGetInfo
shows the quota, 1 GiB arrays stop with CuPy's OutOfMemoryError at the quota, and after the
pool is freed the same amount fits again."""

from common import GiB, emit, skip

try:
    import cupy
except ImportError as e:
    skip(f"cupy not importable: {e}")

LIMIT = 16


def fill(held):
    while len(held) < LIMIT:
        try:
            held.append(cupy.empty(GiB, dtype=cupy.uint8))
        except Exception as e:
            return {
                "type": f"{type(e).__module__}.{type(e).__qualname__}",
                "is_cupy_oom": isinstance(e, cupy.cuda.memory.OutOfMemoryError),
                "message": str(e).splitlines()[0][:300] if str(e) else "",
            }
    return None


r = {"cupy": cupy.__version__}
free, total = cupy.cuda.runtime.memGetInfo()
r["mem_get_info"] = {"free": free, "total": total}
held = []
r["oom"] = fill(held)
r["tensors"] = len(held)
del held[:]
cupy.get_default_memory_pool().free_all_blocks()
held2 = []
r["oom_again"] = fill(held2)
r["tensors_again"] = len(held2)
emit(r)
