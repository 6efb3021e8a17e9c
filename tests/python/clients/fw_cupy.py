"""CuPy on the fake GPU: `fw_cupy.py fill STEP_MIB` fills its memory pool until
OutOfMemoryError, then frees the blocks back; `fw_cupy.py hold` serves alloc/free/info."""
import sys

import cupy as cp

from fw_common import MI, emit, failure, serve

pool = cp.get_default_memory_pool()


def info():
    free, total = cp.cuda.Device(0).mem_info
    return dict(free=free, total=total, pool_total=pool.total_bytes(), pool_used=pool.used_bytes())


def fill(step_mib):
    # A kernel first: CuPy compiles it with NVRTC and launches it on the fake.
    small = cp.arange(1024, dtype=cp.float32)
    float((small * 2).sum())
    del small
    pool.free_all_blocks()
    before = info()
    held, error = [], None
    while len(held) < 10_000:
        try:
            held.append(cp.empty(step_mib * MI, dtype=cp.uint8))
        except Exception as e:
            error = failure(e, cp.cuda.memory.OutOfMemoryError, "OutOfMemoryError")
            break
    n = len(held)
    del held
    after_del = info()
    pool.free_all_blocks()
    after_free = info()
    emit(before=before, allocated=n, error=error, after_del=after_del, after_free=after_free)


def hold():
    held = []

    def alloc(mib):
        held.append(cp.empty(int(mib) * MI, dtype=cp.uint8))
        return info()

    def free():
        held.clear()
        return info()

    def free_all():
        pool.free_all_blocks()
        return info()

    emit(event="ready", **info())
    serve(dict(alloc=alloc, free=free, free_all=free_all, info=info))


def gemm():
    """A cuBLAS GEMM as a fresh process makes it (cupy.matmul of two 7x7 float32 matrices)."""
    try:
        a = cp.ones((7, 7), dtype=cp.float32)
        y = cp.matmul(a, a)
        cp.cuda.Device().synchronize()
        emit(gemm=dict(shape=list(y.shape)))
    except Exception as e:
        emit(gemm=dict(error=type(e).__name__, message=str(e)[:300]))


if __name__ == "__main__":
    {"fill": lambda: fill(int(sys.argv[2])), "hold": hold, "gemm": gemm}[sys.argv[1]]()
