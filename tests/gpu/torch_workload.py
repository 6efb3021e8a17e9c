"""A small PyTorch process that touches every kind of driver entry point a real client uses:
it allocates, launches a cuBLAS matmul, captures a CUDA graph and replays it. Run under the
shim with GPUSLICE_LOG=debug, its stderr is the record of which symbols PyTorch resolves
through dlsym and cuGetProcAddress and which wrapper answered."""

from common import emit, skip

try:
    import torch
except ImportError as e:
    skip(f"torch not importable: {e}")

if not torch.cuda.is_available():
    emit({"ok": False, "error": "torch.cuda.is_available() is False"})
    raise SystemExit(0)

dev = torch.device("cuda", 0)
a = torch.randn(1024, 1024, device=dev)
b = torch.randn(1024, 1024, device=dev)
c = a @ b
torch.cuda.synchronize()
expected = float(c.sum())

# Graph capture on a side stream, as the PyTorch docs show, then replay.
static_a = a.clone()
static_out = torch.empty_like(c)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        static_out.copy_(static_a @ b)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_out.copy_(static_a @ b)
for _ in range(5):
    g.replay()
torch.cuda.synchronize()
replayed = float(static_out.sum())

emit(
    {
        "ok": abs(replayed - expected) <= 1e-3 * max(1.0, abs(expected)),
        "matmul_sum": expected,
        "graph_sum": replayed,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
    }
)
