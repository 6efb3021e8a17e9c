"""Readings for the node-mode checks of scripts/gpu-validate.sh, taken from outside every slice
(unwrapped, as root, as the node's operator sees it): the device's memory and compute processes
as NVML reports them, and the node's ledger as `gpuslice status --json` shows it.

    node_probe.py read [--gpuslice BIN]
        one reading: {"nvml": {total, free, used, procs: {pid: bytes}}, "status": {...}}
    node_probe.py wait (--free-at-most B | --free-at-least B) --timeout S [--gpuslice BIN]
        polls every 0.1 s until NVML's free memory is at most (at least) B bytes, then waits
        `--settle` seconds (default 1) and reads again; the reading, with `reached` (whether the
        condition held) and `waited_seconds`

Measures only, never judges (verdict.py does). Prints one JSON line, last.
"""

import argparse
import json
import subprocess
import sys
import time

from common import emit, nvml_reading


def status(gpuslice):
    """`gpuslice status --json` as root (the environment names the runtime directory)."""
    p = subprocess.run([gpuslice, "status", "--json"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        return {"error": f"gpuslice status exit {p.returncode}: {p.stderr.strip()[-300:]}"}
    return json.loads(p.stdout)


def read(gpuslice):
    out = {"nvml": nvml_reading(), "time": time.time()}
    if gpuslice:
        out["status"] = status(gpuslice)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("read")
    r.add_argument("--gpuslice")
    w = sub.add_parser("wait")
    w.add_argument("--gpuslice")
    cond = w.add_mutually_exclusive_group(required=True)
    cond.add_argument("--free-at-most", type=int)
    cond.add_argument("--free-at-least", type=int)
    w.add_argument("--timeout", type=float, required=True)
    w.add_argument("--settle", type=float, default=1.0)
    a = p.parse_args()
    if a.cmd == "read":
        emit(read(a.gpuslice))
        return
    t0 = time.monotonic()
    while True:
        free = nvml_reading()["free"]
        reached = free <= a.free_at_most if a.free_at_most is not None else free >= a.free_at_least
        if reached or time.monotonic() - t0 >= a.timeout:
            break
        time.sleep(0.1)
    waited = time.monotonic() - t0
    if reached:
        time.sleep(a.settle)
    emit({**read(a.gpuslice), "reached": reached, "waited_seconds": round(waited, 2)})


if __name__ == "__main__":
    sys.exit(main())
