"""PyTorch in node mode, with the monitor holding every slice's unused reservation on the GPU
(balloons, issue #27; docs/security.md, "Reserved memory is held"). A PyTorch process fills its
1 GiB quota on the fake GPU as it does in personal mode (ten 96 MiB tensors, then
`OutOfMemoryError`, `empty_cache` gives everything back), with the balloons on (node mode's
default) and off; the time each run takes is printed for docs/benchmarks/2026-12-01.md
("Balloons").
With `backend:cudaMallocAsync` (stream-ordered pool allocations) it fills its quota the same on
a device whose free memory is all its slice's balloon (and is told its quota is free): the pool
takes the slow path.

Node mode needs root (the policy is root's); without it these tests fail saying so.
"""
import contextlib
import json
import os
import subprocess
import time

import pytest

from conftest import artifact, run_framework
from test_frameworks_torch import GI, MI, torch_env


@pytest.fixture
def node_monitor(gpu_env, profile_dir):
    """`start(*args)`: a root monitor in node mode on the test's private runtime directory and
    fake GPU (the same ones `fw_env` gives a client); stopped at the end. Its log is returned
    by `log()`."""
    procs = []
    logs = []

    def start(*args, memory="16Gi"):
        if os.geteuid() != 0:
            pytest.fail("node mode needs root (CI runs as root)")
        env = gpu_env(memory=memory)
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
    # Its context (512 MiB on the 16 GiB fake) is charged inside the quota, as on a GPU:
    # 512 MiB are free for tensors (docs/configuration.md, "Contexts").
    ctx = 512 * MI
    assert r["before"]["total"] == GI and r["before"]["free"] == GI - ctx, r
    assert r["error"] and r["error"]["type"] == "OutOfMemoryError", r
    assert 4 <= r["allocated"] <= 5, r
    assert r["max_reserved"] <= GI - ctx, r
    assert r["after_empty"]["reserved"] == 0 and r["after_empty"]["free"] == GI - ctx, r
    log = node_monitor.log()
    assert ("balloons: holding" in log) == (balloons == "on"), log
    print(f"PyTorch fills 1 GiB (its context inside) in node mode, balloons {balloons}: {r['allocated']} tensors of "
          f"96 MiB, then OutOfMemoryError; {seconds:.2f} s for the whole process")



@contextlib.contextmanager
def only_the_balloon_free(gpu_env, node_monitor, profile_dir):
    """On a 4 GiB device an operator slice `t` reserves 1 GiB and an unwrapped program holds all
    the rest but one context's room, so the only memory left is `t`'s balloon. A process of `t`
    then finds 128 MiB free in the driver (its admission hands back one context's charge of the
    balloon, 128 MiB, which its context takes); the rest of its 1 GiB, less its context, can only
    come from the balloon."""
    node_monitor(memory="4Gi")
    env = gpu_env(memory="4Gi")
    create = subprocess.run([str(artifact(profile_dir, "gpuslice")), "slice", "create", "t", "--memory", "1Gi"],
                            env=env, capture_output=True, text=True)
    assert create.returncode == 0, create.stdout + create.stderr
    burn = str(artifact(profile_dir, "gpuslice-burn"))

    def unwrapped_refused(size):
        p = subprocess.run([burn, "--alloc", size, "--json"], env=env, capture_output=True, text=True)
        return json.loads(p.stdout.splitlines()[-1])["alloc_errors"] == [2]  # out of memory

    def wait_held(size):
        t0 = time.monotonic()
        while not unwrapped_refused(size):
            assert time.monotonic() - t0 < 30, f"the balloons never held:\n{node_monitor.log()}"
            time.sleep(0.1)

    wait_held("3584Mi")
    # Contexts take memory on the fake (docs/fakegpu.md): 128 MiB each on a 4 GiB device. Of the
    # 4 GiB, the monitor's context takes one, `t`'s balloon 1 GiB (its contexts are charged
    # inside it), the hog's own context one more: 2.75 GiB are left, of which the hog (root's:
    # the node's own, never ended by the audit) leaves one context's room for the probe of
    # `wait_held`.
    ctx = 128 * MI
    hog = subprocess.Popen([burn, "--alloc", "1Gi,1Gi,512Mi,128Mi", "--hold", "300", "--json"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        held = json.loads(hog.stdout.readline())
        assert held["allocated_bytes"] == 4 * GI - 3 * ctx - GI, held
        # The probe's context fits, its 128 MiB do not.
        wait_held("128Mi")
        yield
    finally:
        hog.kill()
        hog.wait(timeout=30)


def test_torch_async_pool_gets_its_balloon_back(fw_env, gpu_env, node_monitor, profile_dir):
    """PyTorch with `PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync` in a slice whose free
    memory is all its balloon ([`only_the_balloon_free`]) fills its 1 GiB as on an empty device:
    every pool allocation the driver refuses asks the monitor for `t`'s balloon."""
    with only_the_balloon_free(gpu_env, node_monitor, profile_dir):
        t0 = time.monotonic()
        r = run_framework("torch", "fw_torch",
                          fw_env(memory="4Gi", PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync",
                                 GPUSLICE_SLICE="t"), "fill", 96)
        seconds = time.monotonic() - t0
    # Free memory is the quota's less its context (128 MiB): what the driver has free counts
    # the slice's own balloon in (the driver alone would say nothing).
    ctx = 128 * MI
    assert r["before"]["total"] == GI and r["before"]["free"] == GI - ctx, r
    assert r["error"] and r["error"]["type"] == "OutOfMemoryError", r
    assert 8 <= r["allocated"] <= 9, (r, node_monitor.log())
    assert r["max_reserved"] <= GI - ctx, r
    print(f"PyTorch (cudaMallocAsync) fills 1 GiB from its balloon: {r['allocated']} tensors of "
          f"96 MiB, then OutOfMemoryError; {seconds:.2f} s for the whole process")


def test_tf_sizes_its_pool_from_the_quota_not_the_drivers_free(fw_env, gpu_env, node_monitor, profile_dir):
    """TensorFlow's default allocator takes, once, what `cuMemGetInfo` says is free less a
    reserve, and never grows: in a slice whose free memory is all its balloon it gets most of
    its 1 GiB (less its context) because the library counts the balloon as free (told the
    driver's free memory alone, it held two 128 MiB tensors)."""
    with only_the_balloon_free(gpu_env, node_monitor, profile_dir):
        r = run_framework("tf", "fw_tf", fw_env(memory="4Gi", GPUSLICE_SLICE="t"), "fill", 128, "default")
    assert r["error"] and r["error"]["type"] == "ResourceExhaustedError", r
    assert r["allocated"] * 128 * MI <= GI, r
    print("TF in the ballooned slice:", r["allocated"], "tensors of 128 MiB")
    assert r["allocated"] >= 4, ("more than the driver's free memory alone", r, node_monitor.log())
