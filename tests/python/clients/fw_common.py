"""Shared by the framework clients (fw_*.py), which run in the framework venvs on the fake GPU.

- `emit(**kv)`: print one JSON line (the tests read the last one, or each in `serve` mode).
- `failure(e, oom, name)`: an exception as the tests read it, `{type, message}`.
- `engine_ns()`: engine time the fake GPU has accounted to this process on device 0, from the
  fake's own books (`fakegpu_engine_ns`, exported by libfakegpu), not from gpuslice.
- `serve(handlers)`: a line protocol on stdin for clients that hold memory while the test looks
  at them: each line is `COMMAND [ARG]`, answered by one JSON line; `exit` ends.
"""
import ctypes
import json
import sys

MI = 1 << 20


def emit(**kv):
    print(json.dumps(kv), flush=True)


def failure(e, oom=(), oom_name=None):
    """An exception as the tests read it: the name of its type (`oom_name` for any instance of
    the framework's out-of-memory exception `oom`) and the start of its message."""
    name = oom_name if oom and isinstance(e, oom) else type(e).__name__
    return dict(type=name, message=str(e)[:300])


def engine_ns():
    lib = ctypes.CDLL("libcuda.so.1")
    f = lib.fakegpu_engine_ns
    f.restype = ctypes.c_uint64
    f.argtypes = [ctypes.c_uint32, ctypes.c_uint32]
    v = f(0, 0)
    if v == (1 << 64) - 1:
        raise RuntimeError("fakegpu_engine_ns: this process is not attached to the fake GPU")
    return v


def serve(handlers):
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "exit":
            emit(event="exit")
            return
        try:
            out = handlers[words[0]](*words[1:])
            emit(event=words[0], **(out or {}))
        except Exception as e:  # report, keep serving: the test decides
            emit(event=words[0], error=type(e).__name__, message=str(e)[:400])
