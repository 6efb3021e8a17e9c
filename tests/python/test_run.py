"""`gpuslice run` holds a real third-party CUDA client (numba's built-in `numba.cuda`) to its
quota: the wrapper alone sets everything up (no LD_PRELOAD or GPUSLICE_* from the test)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import artifact, last_json

# Allocates 256 MiB device arrays until numba raises, and reports what it saw as one JSON line.
NUMBA_CLIENT = r"""
import json, sys
import numpy as np
from numba import cuda

free, total = cuda.current_context().get_memory_info()
arrays, error = [], None
for _ in range(16):
    try:
        arrays.append(cuda.device_array(256 << 20, dtype=np.uint8))
    except Exception as e:  # numba's CudaAPIError / out-of-memory error
        error = f"{type(e).__name__}: {e}"
        break
print(json.dumps({"total": total, "free": free, "arrays": len(arrays), "error": error}))
"""


def stop_monitor(runtime_dir):
    """Stop the monitor `gpuslice run` started for this test's private ledger."""
    import fcntl

    lock = runtime_dir / "monitor.lock"
    try:
        f = open(lock)
    except FileNotFoundError:
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return  # nobody holds it
        except BlockingIOError:
            pass
        pid = int(lock.read_text().strip() or 0)
    if pid > 0:
        os.kill(pid, signal.SIGTERM)
        for _ in range(500):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)


@pytest.fixture
def gpuslice_run(gpu_env, profile_dir, tmp_path):
    """Run `gpuslice run ARGS` on a private fake GPU; stops the monitor it starts."""
    exe = artifact(profile_dir, "gpuslice")
    env = gpu_env(memory="16Gi")  # no preload: `gpuslice run` must add it
    assert "LD_PRELOAD" not in env

    def call(*args, timeout=300):
        return subprocess.run([str(exe), "run", *map(str, args)], env=env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    yield call
    stop_monitor(tmp_path / "ledger")


def test_numba_is_held_to_the_quota(gpuslice_run, tmp_path):
    client = tmp_path / "numba_quota.py"
    client.write_text(NUMBA_CLIENT)
    p = gpuslice_run("--memory", "1Gi", "--", sys.executable, client)
    out = last_json(p.stdout)
    assert p.returncode == 0 and out, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert out["total"] == 1 << 30, out
    # Four 256 MiB arrays fit in 1 GiB, the fifth is refused with numba's out-of-memory error.
    assert out["arrays"] == 4, out
    assert out["error"] and "OUT_OF_MEMORY" in out["error"].upper().replace(" ", "_"), out


def test_numba_without_a_quota_sees_the_device(gpuslice_run, tmp_path):
    client = tmp_path / "numba_quota.py"
    client.write_text(NUMBA_CLIENT)
    p = gpuslice_run("--", sys.executable, client)
    out = last_json(p.stdout)
    assert p.returncode == 0 and out, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert out["total"] == 16 << 30, out
    assert out["arrays"] == 16 and out["error"] is None, out
