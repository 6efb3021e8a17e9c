"""CUDA memory shared between PyTorch processes (`torch.multiprocessing`, CUDA IPC memory and
event handles, or VMM fds for expandable segments) on the fake GPU, without and under
libgpuslice.so (issue 23).

A producer passes a 256 MiB CUDA tensor to a consumer process, which reads every value back.
Under the shim the tensor is charged once, to the producer's slice: a consumer with its own
1 GiB quota sees all of it free after importing the tensor and allocates 960 MiB of its own
(which would not fit if the tensor were charged to it too); two processes of one slice see the
tensor in their shared account once. Meanwhile `gpuslice monitor --on-violation kill` audits
NVML's per-process figures: it sees each slice hold exactly its own allocations, reports no
violation and kills no one.
"""
import subprocess
import time

import pytest

from conftest import framework_venv, CLIENTS, last_json, run_framework
from helpers import Monitor

GI = 1 << 30
MI = 1 << 20

# The allocator modes that can share: the caching allocator's segments go by legacy IPC handles
# (cuIpcGetMemHandle), expandable segments' by VMM handles exported as POSIX fds that the
# consumer takes with pidfd_getfd. (`backend:cudaMallocAsync` refuses to share: PyTorch's own
# "cudaMallocAsync does not yet support shareIpcHandle".)
MODES = {"caching": "", "expandable": "expandable_segments:True"}


@pytest.mark.parametrize("mode", MODES)
def test_torch_ipc_without_the_shim(fw_env, mode):
    env = fw_env(preload=False, PYTORCH_CUDA_ALLOC_CONF=MODES[mode])
    r = run_framework("torch", "fw_torch_ipc", env, 256, 512, 0, 0)
    c, prod = r["consumer"], r["producer"]
    assert r["consumer_exit"] == 0 and c["read_ok"] and c["numel"] == 64 * MI, r
    # The fake counts the tensor once, to the producer: what the consumer sees used before its
    # own allocation is the producer's segment.
    assert 256 * MI <= prod["reserved"] < 300 * MI, r
    # Both processes' contexts take their 512 MiB each (docs/fakegpu.md).
    assert c["before"]["free"] == c["before"]["total"] - prod["reserved"] - 2 * 512 * MI, r
    assert c["after_own"]["free"] == c["before"]["free"] - c["reserved"], r


# What NVML counts for each process's context on fw_env's 16 GiB device (docs/fakegpu.md).
CTX = 512 * MI


def shared_under_audit(gpuslice, env, more_mib):
    """Run the producer/consumer under a killing monitor; return (report, the most the audit
    saw per slice, the monitor's log). NVML's figures count each process's context (the fake
    models it, CTX) and quotas do not: the audit allows each process its context
    (`--context-allowance`, docs/operations.md), so a consumer filling its quota is no
    violation."""
    mon = Monitor(gpuslice, env)
    try:
        cmd = [str(framework_venv("torch")), str(CLIENTS / "fw_torch_ipc.py"), "256", "512",
               str(more_mib), "8"]
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, stdin=subprocess.DEVNULL)
        seen = {}
        while p.poll() is None:
            for k, v in mon.observed().items():
                seen[k] = max(seen.get(k, 0), v)
            time.sleep(0.2)
        out, err = p.communicate(timeout=60)
        report = last_json(out)
        assert p.returncode == 0 and report, f"exit {p.returncode}\n{out}\n{err[-6000:]}\n{mon.log()}"
        return report, seen, mon.log()
    finally:
        mon.stop()


@pytest.mark.parametrize("mode", MODES)
def test_torch_ipc_each_process_its_own_quota(fw_env, gpuslice_bin, mode):
    env = fw_env(GPUSLICE_MEMORY="1Gi", PYTORCH_CUDA_ALLOC_CONF=MODES[mode])
    r, seen, log = shared_under_audit(gpuslice_bin, env, 448)
    c, prod = r["consumer"], r["producer"]
    assert r["consumer_exit"] == 0 and c["read_ok"], r
    # The imported tensor is not the consumer's: its whole quota is free before its own
    # allocations, and 512 + 448 MiB of its own fit (they would not if 256 MiB were charged).
    assert c["before"] == {"free": GI, "total": GI}, r
    assert GI - 532 * MI <= c["after_own"]["free"] <= GI - 512 * MI, r
    assert c["more_error"] is None and c["reserved"] >= 960 * MI, r
    assert c["after_more"]["free"] == GI - c["reserved"], r
    assert 256 * MI <= prod["reserved"] < 300 * MI, r
    assert prod["shared"] == {"free": GI - prod["reserved"], "total": GI}, r
    # The audit looked while the memory was shared, and saw each slice hold its own.
    assert sorted(v for v in seen.values() if v) == sorted(
        [prod["reserved"] + CTX, c["reserved"] + CTX]), (seen, log)
    assert "audit:" not in log, log


@pytest.mark.parametrize("mode", MODES)
def test_torch_ipc_both_in_one_slice(fw_env, gpuslice_bin, mode):
    env = fw_env(GPUSLICE_MEMORY="1Gi", GPUSLICE_SLICE="pair", PYTORCH_CUDA_ALLOC_CONF=MODES[mode])
    r, seen, log = shared_under_audit(gpuslice_bin, env, 0)
    c, prod = r["consumer"], r["producer"]
    assert r["consumer_exit"] == 0 and c["read_ok"], r
    # One account: the tensor is in it once (the producer's), then the consumer's own 512 MiB.
    assert c["before"] == {"free": GI - prod["reserved"], "total": GI}, r
    assert c["after_own"]["free"] == GI - prod["reserved"] - c["reserved"], r
    assert seen.get("pair") == prod["reserved"] + c["reserved"] + 2 * CTX, (seen, log)
    assert "audit:" not in log, log
