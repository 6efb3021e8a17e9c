"""Helpers shared by the client tests: background gpuslice-burn processes."""

import json
import subprocess
import time


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
