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


def attempt(**calls):
    """Run each call and synchronize: {name: {shape} or {error, message}}."""
    out = {}
    for name, f in calls.items():
        try:
            y = f()
            torch.cuda.synchronize()
            out[name] = dict(shape=list(y.shape))
        except Exception as e:
            out[name] = dict(error=type(e).__name__, message=str(e)[:300])
    return out


def probe():
    """Which libraries start: is_available, a cuDNN convolution, a cuBLAS matmul."""
    emit(available=torch.cuda.is_available(), **attempt(
        conv=lambda: torch.nn.functional.conv2d(
            torch.zeros(1, 3, 32, 32, device="cuda"), torch.zeros(8, 3, 3, 3, device="cuda")),
        matmul=lambda: torch.zeros(64, 64, device="cuda") @ torch.zeros(64, 64, device="cuda")))


def gemm():
    """cuBLAS GEMMs as a fresh process makes them: a 7x7 matmul (cublasGemmEx) and a batched
    one (cublasGemmStridedBatchedEx)."""
    emit(**attempt(matmul=lambda: torch.matmul(*[torch.randn(7, 7, device="cuda")] * 2),
                   bmm=lambda: torch.bmm(*[torch.randn(3, 7, 7, device="cuda")] * 2)))


def graphs(dot_path):
    """The CUDA-graph calls PyTorch makes beyond capture and replay: a graph kept for its raw
    executable (`keep_graph=True`, `instantiate`, `raw_cuda_graph_exec`) and a debug dump
    (`cudaGraphDebugDotPrint`), which cudart refuses with cudaErrorCallRequiresNewerDriver when
    the driver lacks the entry point."""
    x = torch.zeros(8, device="cuda")
    out = {}
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(g):
            x.add_(1)
        g.instantiate()
        out["raw_exec"] = bool(g.raw_cuda_graph_exec())
        g.replay()
        torch.cuda.synchronize()
    except Exception as e:
        out["raw_exec"] = failure(e)
    try:
        g = torch.cuda.CUDAGraph()
        g.enable_debug_mode()
        with torch.cuda.graph(g):
            x.add_(1)
        g.debug_dump(dot_path)
        out["dump"] = open(dot_path).read()[:2000]
    except Exception as e:
        out["dump"] = failure(e)
    emit(**out)


def backward(steps=5):
    """A backward pass over two streams with autograd callbacks, as training loops with
    side streams run it: the autograd thread records, waits on and destroys events while work
    is still queued, and a tensor hook queues an engine callback. Events created and dropped
    while their stream is busy are destroyed with work pending."""
    from torch.autograd import Variable
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    w1 = torch.randn(64, 64, device="cuda", requires_grad=True)
    w2 = torch.randn(64, 64, device="cuda", requires_grad=True)
    x = torch.randn(64, 64, device="cuda")
    hooks, callbacks, dropped = 0, 0, 0

    def on_done():
        nonlocal callbacks
        callbacks += 1

    def hook(g):
        nonlocal hooks
        hooks += 1
        Variable._execution_engine.queue_callback(on_done)
        return g

    for _ in range(steps):
        with torch.cuda.stream(s1):
            a = (x @ w1).relu()
            busy = torch.cuda.Event()
            busy.record(s1)
        with torch.cuda.stream(s2):
            s2.wait_stream(s1)
            loss = (a @ w2).sum()
        a.register_hook(hook)
        with torch.cuda.stream(s2):
            loss.backward()
        del busy  # cudaEventDestroy while s1/s2 may still have queued work
        dropped += 1
        torch.cuda.synchronize()
    emit(steps=steps, hooks=hooks, callbacks=callbacks, dropped_events=dropped,
         grad=list(w1.grad.shape))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode in ("probe", "gemm", "backward"):
        {"probe": probe, "gemm": gemm, "backward": backward}[mode]()
        sys.exit(0)
    if mode == "graphs":
        graphs(sys.argv[2])
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
