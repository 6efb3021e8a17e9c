"""PyTorch in node mode, with the monitor holding every slice's unused reservation on the GPU
(balloons, issue #27; docs/security.md, "Reserved memory is held"). A PyTorch process fills its
1 GiB quota on the fake GPU as it does in personal mode (ten 96 MiB tensors, then
`OutOfMemoryError`, `empty_cache` gives everything back), with the balloons on (node mode's
default) and off; the time each run takes is printed for docs/benchmarks.md ("Balloons").

Node mode needs root (the policy is root's); without it these tests fail saying so.
"""
import os
import subprocess
import time

import pytest

from conftest import artifact, run_framework
from test_frameworks_torch import GI, torch_env


@pytest.fixture
def node_monitor(gpu_env, profile_dir):
    """`start(*args)`: a root monitor in node mode on the test's private runtime directory and
    fake GPU (the same ones `fw_env` gives a client); stopped at the end. Its log is returned
    by `log()`."""
    procs = []
    logs = []

    def start(*args):
        if os.geteuid() != 0:
            pytest.fail("node mode needs root (CI runs as root)")
        env = gpu_env()
        rt = env["GPUSLICE_RUNTIME_DIR"]
        os.chmod(rt, 0o755)
        log = open(os.path.join(os.path.dirname(rt), "monitor.out"), "w+")
        logs.append(log)
        p = subprocess.Popen(
            [str(artifact(profile_dir, "gpuslice")), "monitor", "--mode", "node", "--interval", "50", *args],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(p)
        sock = os.path.join(rt, "monitor.sock")
        t0 = time.monotonic()
        while not os.path.exists(sock):
            if p.poll() is not None or time.monotonic() - t0 > 30:
                log.seek(0)
                pytest.fail(f"the monitor did not come up:\n{log.read()}")
            time.sleep(0.05)
        return p

    def read_log():
        logs[-1].flush()
        logs[-1].seek(0)
        return logs[-1].read()

    start.log = read_log
    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=30)


@pytest.mark.parametrize("balloons", ["on", "off"])
def test_torch_fills_its_quota_in_node_mode(fw_env, node_monitor, balloons):
    node_monitor("--balloons", balloons)
    t0 = time.monotonic()
    r = run_framework("torch", "fw_torch", torch_env(fw_env, "caching", GPUSLICE_MEMORY="1Gi"), "fill", 96)
    seconds = time.monotonic() - t0
    assert r["before"]["total"] == GI and r["before"]["free"] == GI, r
    assert r["error"] and r["error"]["type"] == "OutOfMemoryError", r
    assert 9 <= r["allocated"] <= 10, r
    assert r["max_reserved"] <= GI, r
    assert r["after_empty"]["reserved"] == 0 and r["after_empty"]["free"] == GI, r
    log = node_monitor.log()
    assert ("balloons: holding" in log) == (balloons == "on"), log
    print(f"PyTorch fills 1 GiB in node mode, balloons {balloons}: {r['allocated']} tensors of "
          f"96 MiB, then OutOfMemoryError; {seconds:.2f} s for the whole process")
