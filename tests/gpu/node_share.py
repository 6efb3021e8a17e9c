"""Device memory shared between two processes in node mode, measured for
scripts/gpu-validate.sh: is it charged once?

    node_share.py ipc|vmm --mib N --gpuslice BIN --clients DIR --python PY --sock PATH
                  --monitor-log PATH --exporter VAR=VALUE,... --importer VAR=VALUE,...
                  [--prefix "setpriv --reuid=U ... --"]

The exporter and the importer are tests/python/clients/cuda_ipc.py (the driver API through
ctypes, the client the fake-GPU tests use too), each run under `--prefix` (another user) with
its own variables (the shim, its slice). The exporter allocates N MiB, shares it (`ipc`:
cuMemAlloc + cuIpcGetMemHandle, opened with cuIpcOpenMemHandle; `vmm`: cuMemCreate exported as
a POSIX fd, passed over a unix socket, imported and mapped) and the importer reads it back.
Readings (NVML from outside, `gpuslice status --json`) are taken with both contexts made and
nothing shared, while shared (after two audits), for `vmm` after the exporter exited while the
importer still maps it, and after the last holder let go; `audit_lines` are the monitor's
`audit:` lines written meanwhile. Measures only (verdict.py `node-share` judges); one JSON
line, last.
"""

import argparse
import json
import os
import queue
import shlex
import subprocess
import sys
import threading
import time

from common import MiB, emit, nvml_reading
from node_probe import status

SETTLE = 2.5  # seconds: two of the monitor's audits (one a second) and a descriptor scan


class Client:
    """cuda_ipc.py ROLE SOCK in serve mode: one command a line, one JSON answer a line."""

    def __init__(self, a, role, variables):
        env = dict(os.environ)
        env.update(variables)
        cmd = [*shlex.split(a.prefix), a.python, os.path.join(a.clients, "cuda_ipc.py"), role, a.sock]
        self.role = role
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd="/")
        self.lines = queue.Queue()
        self.err = []
        threading.Thread(target=self._pump_out, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()
        self.pid = self.proc.pid
        self.ready = self.read()

    def _pump_out(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # end of output: the client exited

    def read(self, timeout=60):
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError(f"{self.role}: no answer in {timeout} s; stderr: {self.stderr()}")
            if line is None:
                raise RuntimeError(f"{self.role} exited ({self.proc.wait()}); stderr: {self.stderr()}")
            if line.startswith("{"):
                got = json.loads(line)
                if "error" in got and got.get("event") != "ready":
                    raise RuntimeError(f"{self.role}: {got}")
                return got

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def stderr(self):
        return "".join(self.err)[-400:].strip() or "(empty)"

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def variables(spec):
    return dict(kv.split("=", 1) for kv in spec.split(",") if kv)


def slice_of(st, pid=None, name=None):
    """The slice `name` (or holding `pid`) in a status: {name, memory_used, memory_contexts (of
    memory_used, its processes' contexts), held, pids}."""
    for s in st.get("slices", []):
        if (name is not None and s["name"] == name) or (pid is not None and pid in s.get("pids", [])):
            return {"name": s["name"], "memory_used": s["memory_used"],
                    "memory_contexts": s.get("memory_contexts"), "memory_limit": s["memory_limit"],
                    "held_for_importers": s.get("memory_held_for_importers"), "pids": s.get("pids")}
    return None


def snapshot(a, who):
    """NVML from outside and the ledger, the two processes' figures picked out."""
    st = status(a.gpuslice)
    nv = nvml_reading()
    ex, im = who
    return {
        "nvml_used": nv["used"],
        "nvml_free": nv["free"],
        "nvml_procs": nv["procs"],
        "exporter_nvml": nv["procs"].get(str(ex.pid)) if ex else None,
        "importer_nvml": nv["procs"].get(str(im.pid)) if im else None,
        "exporter_slice": slice_of(st, name=a.exporter_slice),
        "importer_slice": slice_of(st, pid=im.pid) if im else None,
    }


def monitor_log_offset(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def audit_lines(path, offset, about):
    """The monitor's `audit:` lines since `offset` that name one of `about` (the two slices, the
    two pids): another process's audit (a bypass that just ended) is not this check's."""
    try:
        with open(path, errors="replace") as f:
            f.seek(offset)
            return [ln.strip() for ln in f if "audit:" in ln and any(w in ln for w in about)]
    except OSError as e:
        return [f"(monitor log unreadable: {e})"]


def handed(exporter, importer, command):
    """`send` on the exporter (it listens), `command` on the importer (it connects)."""
    listening = exporter.ask("send")
    assert listening.get("event") == "listening", listening
    got = importer.ask(command)
    exporter.read()
    return got


def wait_for(predicate, seconds):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        v = predicate()
        if v:
            return v
        time.sleep(0.2)
    return predicate()


def share(a, r):
    exp_vars, imp_vars = variables(a.exporter), variables(a.importer)
    a.exporter_slice = exp_vars.get("GPUSLICE_SLICE")
    r["exporter_slice_name"] = a.exporter_slice
    offset = monitor_log_offset(a.monitor_log)
    r["before"] = snapshot(a, (None, None))
    ex = im = None
    try:
        ex = Client(a, f"{a.kind}-export", exp_vars)
        im = Client(a, f"{a.kind}-import", imp_vars)
        r["pids"] = {"exporter": ex.pid, "importer": im.pid}
        r["contexts"] = snapshot(a, (ex, im))
        made = ex.ask(f"alloc_shared {a.mib}" if a.kind == "ipc" else f"create {a.mib}")
        r["made_status"] = made.get("status", 0)
        got = handed(ex, im, "open" if a.kind == "ipc" else "import")
        r["import_status"], r["read_ok"] = got.get("status"), got.get("read_ok")
        time.sleep(SETTLE)
        r["shared"] = snapshot(a, (ex, im))
        if a.kind == "vmm":
            # The exporter exits while the importer maps the memory: the driver keeps it, the
            # exporter's slice stays charged; NVML's process list says whose it is now.
            exited = ex.ask("exit")
            r["exporter_exit"] = {"event": exited.get("event"), "status": ex.proc.wait(timeout=30)}
            gone = wait_for(lambda: ex.pid not in (slice_of(status(a.gpuslice), name=a.exporter_slice) or {})
                            .get("pids", [ex.pid]), 20)
            r["exporter_reaped"] = bool(gone)
            time.sleep(SETTLE)
            r["exporter_gone"] = snapshot(a, (ex, im))
            r["read_ok_after_exit"] = im.ask("read").get("read_ok")
            r["unmap"] = im.ask("unmap")
            # Unmapped, the importer may still hold a descriptor where no scan of /proc sees
            # it (in flight, an io_uring): node mode keeps the record charged while a process
            # of the exporter's uid lives in its PID namespace (docs/security.md), and the
            # importer is one. What the slice shows then is recorded; its exit lets it go.
            time.sleep(SETTLE)
            r["after_unmap"] = snapshot(a, (None, im))
            im.ask("exit")
            r["importer_exit"] = im.proc.wait(timeout=30)
        else:
            r["close"] = im.ask("close").get("status")
            r["free"] = ex.ask("free").get("status")
        # The last holder let go: the charge goes (at the monitor's next look for `vmm`).
        wait_for(lambda: ((slice_of(status(a.gpuslice), name=a.exporter_slice) or {}).get("memory_used", 0)
                          < a.mib * MiB), 40)
        r["after"] = snapshot(a, tuple(c if c.proc.poll() is None else None for c in (ex, im)))
    finally:
        for c in (ex, im):
            if c is not None:
                r.setdefault("stderr", {})[c.role] = c.stderr()
                c.close()
        about = [f'"{a.exporter_slice}"'] + [f"pid {c.pid} " for c in (ex, im) if c is not None]
        imported = (r.get("contexts") or {}).get("importer_slice") or {}
        if imported.get("name"):
            about.append(f'"{imported["name"]}"')
        r["audit_lines"] = audit_lines(a.monitor_log, offset, about)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=["ipc", "vmm"])
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--gpuslice", required=True)
    p.add_argument("--clients", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--sock", required=True)
    p.add_argument("--monitor-log", required=True)
    p.add_argument("--exporter", required=True, help="VAR=VALUE,... of the exporter")
    p.add_argument("--importer", required=True, help="VAR=VALUE,... of the importer")
    p.add_argument("--prefix", default="", help="command words both run under (another user)")
    a = p.parse_args()
    r = {"kind": a.kind, "mib": a.mib}
    try:
        share(a, r)
    except Exception as e:  # a measurement that broke: recorded, judged as a failure
        r["error"] = f"{type(e).__name__}: {e}"
    emit(r)


if __name__ == "__main__":
    sys.exit(main())
