"""PyTorch on the fake GPU: `fw_torch.py MODE ARGS` prints JSON (see each function).

The allocator is chosen by the environment (PYTORCH_CUDA_ALLOC_CONF), as users choose it.
"""
import sys
import time

import torch

from fw_common import MI, emit, engine_ns, failure, serve


def info():
    free, total = torch.cuda.mem_get_info()
    return dict(free=free, total=total, reserved=torch.cuda.memory_reserved(),
                allocated=torch.cuda.memory_allocated())


def fill(step_mib, limit=10_000):
    """Allocate `step_mib` MiB tensors until the allocator refuses; report what happened."""
    before = info()
    held, max_reserved, error = [], 0, None
    for _ in range(limit):
        try:
            held.append(torch.empty(step_mib * MI, dtype=torch.uint8, device="cuda"))
        except Exception as e:
            error = failure(e, torch.cuda.OutOfMemoryError, "OutOfMemoryError")
            break
        max_reserved = max(max_reserved, torch.cuda.memory_reserved())
    n = len(held)
    del held
    after_del = info()
    torch.cuda.empty_cache()
    after_empty = info()
    emit(before=before, allocated=n, step=step_mib * MI, error=error, max_reserved=max_reserved,
         after_del=after_del, after_empty=after_empty)


def hold():
    """Serve: `alloc MIB`, `free` (drop the tensors, the cache keeps them), `empty`, `info`."""
    held = []

    def alloc(mib):
        held.append(torch.empty(int(mib) * MI, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        return info()

    def free():
        held.clear()
        return info()

    def empty():
        torch.cuda.empty_cache()
        return info()

    emit(event="ready", **info())
    serve(dict(alloc=alloc, free=free, empty=empty, info=info))


def vllm():
    """vLLM's sizing: 0.9 of the total torch reports, as one tensor."""
    free, total = torch.cuda.mem_get_info()
    size = int(0.9 * total)
    t = torch.empty(size, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    emit(total=total, free=free, size=size, after=info(), ok=t.numel() == size)


def run_queue_s():
    """Seconds this thread has waited for a CPU on a run queue (/proc/thread-self/schedstat's
    second field): time it could not launch however much it wanted to."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def compute(start_at, seconds, graph=False):
    """Launch kernels in a loop from wall time `start_at` (`"stdin"`: read from stdin after
    reporting ready) for `seconds`; report the engine time the fake accounted to this process
    between 1 s in and 0.5 s before the end, and how long the launching thread waited for a
    CPU meanwhile (`starved_s`)."""
    x = torch.zeros(1024, device="cuda")
    s = torch.cuda.Stream()
    g = None
    if graph:
        with torch.cuda.stream(s):
            x.add_(1)  # warm-up outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(10):
                x.add_(1)
    torch.cuda.synchronize()
    emit(event="ready")
    if start_at == "stdin":
        # The test's go, once every tenant is ready (importing torch can take a minute on a busy
        # machine): the wall time to start at.
        start_at = float(sys.stdin.readline())
    while time.time() < start_at:
        time.sleep(0.01)
    t_from, t_to = start_at + 1.0, start_at + seconds - 0.5
    e_from = e_to = None
    launches = 0
    with torch.cuda.stream(s):
        while True:
            now = time.time()
            if e_from is None and now >= t_from:
                e_from, w_from, q_from = engine_ns(), now, run_queue_s()
            if now >= t_to:
                e_to, w_to, q_to = engine_ns(), now, run_queue_s()
                break
            for _ in range(2 if graph else 20):
                if g is not None:
                    g.replay()
                    launches += 10
                else:
                    x.add_(1)
                    launches += 1
            s.synchronize()
    emit(engine_s=(e_to - e_from) / 1e9, wall_s=w_to - w_from, launches=launches,
         graph=bool(graph), starved_s=q_to - q_from)


def probe():
    """Which libraries start: is_available, a cuDNN convolution, a cuBLAS matmul."""
    out = dict(available=torch.cuda.is_available())
    for name, f in (("conv", lambda: torch.nn.functional.conv2d(
                        torch.zeros(1, 3, 32, 32, device="cuda"), torch.zeros(8, 3, 3, 3, device="cuda"))),
                    ("matmul", lambda: torch.zeros(64, 64, device="cuda") @ torch.zeros(64, 64, device="cuda"))):
        try:
            y = f()
            torch.cuda.synchronize()
            out[name] = dict(shape=list(y.shape))
        except Exception as e:
            out[name] = dict(error=type(e).__name__, message=str(e)[:300])
    emit(**out)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "probe":
        probe()
        sys.exit(0)
    if mode == "fill":
        fill(int(sys.argv[2]))
    elif mode == "hold":
        hold()
    elif mode == "vllm":
        vllm()
    elif mode == "compute":
        start = sys.argv[2] if sys.argv[2] == "stdin" else float(sys.argv[2])
        compute(start, float(sys.argv[3]), len(sys.argv) > 4 and sys.argv[4] == "graph")
    else:
        sys.exit(f"unknown mode {mode}")
