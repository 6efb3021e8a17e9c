"""Helpers shared by the client tests: background gpuslice-burn processes, a monitor that
kills slices over quota."""

import json
import re
import subprocess
import threading
import time
import urllib.request


class Holder:
    """A `gpuslice-burn --alloc SIZE --hold S` process that has finished allocating."""

    def __init__(self, burn, env, size, seconds=120, extra=()):
        self.proc = subprocess.Popen(
            [str(burn), "--json", "--alloc", size, "--hold", str(seconds), *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("{"):
            self.stop()
            raise AssertionError(f"burn did not start holding: {line!r} {self.proc.stderr.read()}")
        self.holding = json.loads(line)
        assert self.holding["event"] == "holding", self.holding

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def wait_until(predicate, timeout=10.0, interval=0.05):
    """Poll `predicate` until it returns a true value or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


class Monitor:
    """`gpuslice monitor --on-violation kill` serving metrics; `observed()` scrapes what its NVML
    audit saw per slice; `log()` is what it printed."""

    def __init__(self, gpuslice, env):
        env = {k: v for k, v in env.items()
               if k not in ("LD_PRELOAD", "GPUSLICE_MEMORY", "GPUSLICE_SLICE")}
        self.proc = subprocess.Popen(
            [str(gpuslice), "monitor", "--interval", "50", "--on-violation", "kill",
             "--metrics-listen", "127.0.0.1:0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL)
        self.lines = []
        self.url = None
        while self.url is None:
            line = self.proc.stderr.readline()
            assert line, "the monitor exited: " + "".join(self.lines)
            self.lines.append(line)
            self.url = next((w for w in line.split() if w.startswith("http://")), None)
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()

    def observed(self):
        """{slice: bytes} from one scrape, {} when the scrape timed out (a busy machine): the
        callers poll."""
        try:
            text = urllib.request.urlopen(self.url, timeout=5).read().decode()
        except (OSError, TimeoutError):
            return {}
        return {m.group(1): float(m.group(2)) for m in re.finditer(
            r'^gpuslice_slice_memory_observed_bytes\{slice="([^"]*)"[^}]*\} (\S+)$', text, re.M)}

    def log(self):
        return "".join(self.lines)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
