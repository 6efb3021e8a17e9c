"""Device memory shared between processes through the driver API (ctypes), as NCCL and CUDA-aware
MPI share it: `cuda_ipc.py ROLE SOCKET` serves one-line commands on stdin, each answered by one
JSON line (`fw_common.serve`). Handles travel over the UNIX socket SOCKET: a VMM allocation's
POSIX fd by SCM_RIGHTS, a legacy IPC handle's 64 bytes as data.

Roles and their commands:
- `vmm-export SOCKET`: `create MIB` (cuMemCreate for a POSIX fd, reserved, mapped read-write,
  filled with a pattern from the host), `send` (cuMemExportToShareableHandle, the fd sent to
  the next connection), `release` (cuMemRelease), `unmap` (cuMemUnmap, cuMemAddressFree),
  `retain` (cuMemRetainAllocationHandle of the mapped address: one more reference, to release);
- `vmm-import SOCKET`: `receive` (receive the fd and keep it, importing nothing), `import`
  (receive the fd unless one is kept, cuMemImportFromShareableHandle, map, read the bytes back
  and compare; its status and cuMemGetInfo when the import fails), `read` (compare them
  again), `unmap` (cuMemUnmap, cuMemAddressFree, cuMemRelease), `retain` and `release` as
  for `vmm-export`;
- `ipc-export SOCKET`: `alloc_shared MIB` (cuMemAlloc, filled), `send` (cuIpcGetMemHandle, sent), `own`
  (cuIpcOpenMemHandle of its own handle: the driver refuses), `free` (cuMemFree);
- `ipc-import SOCKET`: `open` (receive a handle, cuIpcOpenMemHandle, compare the bytes),
  `reopen` (the same handle again), `close` (cuIpcCloseMemHandle; its status, also when it
  fails);
- interprocess events: `event_send MS` on `ipc-export` (an event recorded after a kernel of MS
  ms, its handle sent), `event_open` on `ipc-import` (opened, queried, synchronized, waited on).
Every role: `alloc MIB` (cuMemAlloc of its own), `info` (cuMemGetInfo; NVML's device memory
and per-process figures as this process sees them), `forge OP ARG` (node mode: a hand-made
`share-*` request on the node's `monitor.sock`, as a tenant could send instead of its shim:
ARG a record index, or `devnull` to send a descriptor of /dev/null; the monitor's reply).
"""
import ctypes
import os
import socket
import sys
import time

from cuda_ctx import Location, Prop, primary_context
from fw_common import MI, emit, serve

c_u64, c_size = ctypes.c_uint64, ctypes.c_size_t


class Access(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_uint)]


class ProcInfo(ctypes.Structure):  # nvmlProcessInfo_v1_t
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong)]


class MemInfo(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


cuda, dev = primary_context()
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
nvml_dev = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(nvml_dev)) == 0
sock_path = sys.argv[2]
state = {"own": []}


def pattern(n):
    return bytes((i * 7 + 3) & 0xFF for i in range(256)) * (n // 256)


def fill(ptr, n):
    data = pattern(n)
    assert cuda.cuMemcpyHtoD_v2(c_u64(ptr), data, c_size(n)) == 0


def read_ok(ptr, n):
    buf = ctypes.create_string_buffer(n)
    r = cuda.cuMemcpyDtoH_v2(buf, c_u64(ptr), c_size(n))
    return r == 0 and buf.raw == pattern(n)


def info():
    free, total = c_size(), c_size()
    assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    mem = MemInfo()
    assert nvml.nvmlDeviceGetMemoryInfo(nvml_dev, ctypes.byref(mem)) == 0
    n, procs = ctypes.c_uint(64), (ProcInfo * 64)()
    assert nvml.nvmlDeviceGetComputeRunningProcesses(nvml_dev, ctypes.byref(n), procs) == 0
    return dict(pid=os.getpid(), free=free.value, total=total.value, nvml_used=mem.used,
                nvml_procs={str(procs[i].pid): procs[i].used for i in range(n.value)})


def alloc(mib):
    p = c_u64()
    r = cuda.cuMemAlloc_v2(ctypes.byref(p), c_size(int(mib) * MI))
    if r == 0:
        state["own"].append(p.value)
    return dict(status=r, **info())


def listen_once():
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sock_path)
    s.listen(1)
    return s


def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    return s


def map_handle(h, size):
    va = c_u64()
    assert cuda.cuMemAddressReserve(ctypes.byref(va), c_size(size), c_size(0), c_u64(0), c_u64(0)) == 0
    assert cuda.cuMemMap(va, c_size(size), c_size(0), c_u64(h), c_u64(0)) == 0
    acc = Access(Location(1, dev.value), 3)
    assert cuda.cuMemSetAccess(va, c_size(size), ctypes.byref(acc), c_size(1)) == 0
    return va.value


def unmap(va, size):
    return dict(unmap=cuda.cuMemUnmap(c_u64(va), c_size(size)),
                free_va=cuda.cuMemAddressFree(c_u64(va), c_size(size)))


# --- VMM ---------------------------------------------------------------------------------------

def vmm_create(mib):
    size = int(mib) * MI
    prop = Prop(1, 1, Location(1, dev.value), None)
    h = c_u64()
    r = cuda.cuMemCreate(ctypes.byref(h), c_size(size), ctypes.byref(prop), c_u64(0))
    if r != 0:
        return dict(status=r)
    state.update(h=h.value, size=size, va=map_handle(h.value, size))
    fill(state["va"], size)
    return dict(status=0, **info())


def vmm_send():
    fd = ctypes.c_int()
    r = cuda.cuMemExportToShareableHandle(ctypes.byref(fd), c_u64(state["h"]), 1, c_u64(0))
    assert r == 0, r
    srv = listen_once()
    emit(event="listening")
    conn, _ = srv.accept()
    socket.send_fds(conn, [state["size"].to_bytes(8, "little")], [fd.value])
    conn.close()
    os.close(fd.value)
    return info()


def vmm_receive():
    s = connect()
    msg, fds, _, _ = socket.recv_fds(s, 8, 1)
    s.close()
    state.update(fd=fds[0], size=int.from_bytes(msg, "little"))
    return dict(received=True)


def vmm_import():
    if "fd" not in state:
        vmm_receive()
    fd, size = state.pop("fd"), state["size"]
    h = c_u64()
    r = cuda.cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fd), 1)
    os.close(fd)
    if r != 0:
        return dict(status=r, **info())
    state.update(h=h.value, size=size, va=map_handle(h.value, size))
    return dict(status=0, read_ok=read_ok(state["va"], size), **info())


def vmm_read():
    return dict(read_ok=read_ok(state["va"], state["size"]), **info())


def vmm_retain():
    h = c_u64()
    r = cuda.cuMemRetainAllocationHandle(ctypes.byref(h), ctypes.c_void_p(state["va"]))
    return dict(status=r, same=h.value == state["h"], **info())


def vmm_release():
    return dict(status=cuda.cuMemRelease(c_u64(state["h"])), **info())


def vmm_unmap():
    out = unmap(state["va"], state["size"])
    return dict(out, **info())


def vmm_import_unmap():
    out = unmap(state["va"], state["size"])
    out["release"] = cuda.cuMemRelease(c_u64(state["h"]))
    return dict(out, **info())


# --- legacy IPC ---------------------------------------------------------------------------------

class IpcHandle(ctypes.Structure):
    """`CUipcMemHandle` and `CUipcEventHandle`: 64 bytes passed by value."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


def ipc_alloc(mib):
    size = int(mib) * MI
    p = c_u64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(p), c_size(size)) == 0
    fill(p.value, size)
    state.update(ptr=p.value, size=size)
    return info()


def ipc_handle():
    h = IpcHandle()
    r = cuda.cuIpcGetMemHandle(ctypes.byref(h), c_u64(state["ptr"]))
    assert r == 0, r
    return h


def ipc_send():
    h = ipc_handle()
    srv = listen_once()
    emit(event="listening")
    conn, _ = srv.accept()
    conn.sendall(state["size"].to_bytes(8, "little") + bytes(h))
    conn.close()
    return info()


def ipc_own():
    h = ipc_handle()
    p = c_u64()
    return dict(status=cuda.cuIpcOpenMemHandle_v2(ctypes.byref(p), h, 1))


def ipc_free():
    return dict(status=cuda.cuMemFree_v2(c_u64(state["ptr"])), **info())


def receive(n):
    """`n` bytes from the exporter, over a fresh connection."""
    s = connect()
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, "the exporter closed the socket"
        data += chunk
    s.close()
    return data


def ipc_open():
    data = receive(72)
    state.update(size=int.from_bytes(data[:8], "little"),
                 handle=IpcHandle.from_buffer_copy(data[8:]))
    return ipc_reopen()


def ipc_reopen():
    p = c_u64()
    r = cuda.cuIpcOpenMemHandle_v2(ctypes.byref(p), state["handle"], 1)
    if r != 0:
        return dict(status=r)
    state["ptr"] = p.value
    return dict(status=0, ptr=p.value, read_ok=read_ok(p.value, state["size"]), **info())


def ipc_close():
    return dict(status=cuda.cuIpcCloseMemHandle(c_u64(state["ptr"])), **info())


# --- interprocess events ------------------------------------------------------------------------

PTX = b""".version 8.0
.target sm_90
.address_size 64
.visible .entry gpuslice_spin(.param .u64 ns) { ret; }
"""


def event_send(spin_ms):
    """An interprocess event recorded after a kernel of SPIN_MS ms, its handle sent; also what
    the driver says to an event made without the flag, and to opening the handle here."""
    plain, ev = ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuEventCreate(ctypes.byref(plain), 2) == 0
    h = IpcHandle()
    without_flag = cuda.cuIpcGetEventHandle(ctypes.byref(h), plain)
    assert cuda.cuEventCreate(ctypes.byref(ev), 2 | 4) == 0  # DISABLE_TIMING | INTERPROCESS
    assert cuda.cuIpcGetEventHandle(ctypes.byref(h), ev) == 0
    mine = ctypes.c_void_p()
    own = cuda.cuIpcOpenEventHandle(ctypes.byref(mine), h)
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuModuleLoadData(ctypes.byref(mod), PTX + b"\0") == 0
    assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"gpuslice_spin") == 0
    ns = ctypes.c_uint64(int(spin_ms) * 1_000_000)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(ns), ctypes.c_void_p))
    assert cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None) == 0
    assert cuda.cuEventRecord(ev, None) == 0
    srv = listen_once()
    emit(event="listening")
    conn, _ = srv.accept()
    conn.sendall(bytes(h))
    conn.close()
    state["event"] = ev
    return dict(without_flag=without_flag, own=own)


def event_open():
    """Open the exporter's event: query at once, synchronize (timed), query again, and wait on
    it from a stream."""
    data = receive(64)
    ev = ctypes.c_void_p()
    r = cuda.cuIpcOpenEventHandle(ctypes.byref(ev), IpcHandle.from_buffer_copy(data))
    if r != 0:
        return dict(status=r)
    first = cuda.cuEventQuery(ev)
    t0 = time.monotonic()
    sync = cuda.cuEventSynchronize(ev)
    waited = time.monotonic() - t0
    return dict(status=0, first_query=first, sync=sync, waited_s=waited,
                after_query=cuda.cuEventQuery(ev), stream_wait=cuda.cuStreamWaitEvent(None, ev, 0),
                destroy=cuda.cuEventDestroy_v2(ev))


def forge(op, arg):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(os.path.join(os.environ["GPUSLICE_RUNTIME_DIR"], "monitor.sock"))
    msg, fds = f"op={op}\n", []
    if arg == "devnull":
        fds.append(os.open("/dev/null", os.O_RDONLY))
    else:
        msg += f"rec={arg}\n"
    socket.send_fds(sock, [msg.encode()], fds)
    for fd in fds:
        os.close(fd)
    reply = sock.recv(65536).decode()
    sock.close()
    return dict(reply=dict(line.split("=", 1) for line in reply.splitlines() if "=" in line))


ROLES = {
    "vmm-export": dict(create=vmm_create, send=vmm_send, release=vmm_release, unmap=vmm_unmap,
                       retain=vmm_retain),
    "vmm-import": dict(receive=vmm_receive, import_=vmm_import, retain=vmm_retain,
                       release=vmm_release, read=vmm_read, unmap=vmm_import_unmap),
    "ipc-export": dict(alloc_shared=ipc_alloc, send=ipc_send, own=ipc_own, free=ipc_free,
                       event_send=event_send),
    "ipc-import": dict(open=ipc_open, reopen=ipc_reopen, close=ipc_close, event_open=event_open),
}

if __name__ == "__main__":
    handlers = {k.rstrip("_"): v for k, v in ROLES[sys.argv[1]].items()}
    handlers.setdefault("alloc", alloc)
    handlers["info"] = info
    handlers["forge"] = forge
    emit(event="ready", **info())
    serve(handlers)
