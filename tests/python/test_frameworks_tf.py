"""TensorFlow 2.21 (tensorflow[and-cuda]) on the fake GPU under libgpuslice.so: memory growth,
its default preallocation, a memory_limit larger than the quota, and cuda_malloc_async; each ends
in ResourceExhaustedError within the quota, and get_memory_info agrees with `gpuslice status`."""
import json
import subprocess

import pytest

from conftest import Served, artifact, run_framework

GI = 1 << 30
MI = 1 << 20
QUOTA = 4 * GI


@pytest.mark.parametrize("how,allocator", [
    ("growth", None), ("default", None), (f"limit={8 * 1024}", None), ("growth", "cuda_malloc_async"),
], ids=["growth", "prealloc", "limit-over-quota", "malloc-async"])
def test_tf_ends_in_resource_exhausted_within_the_quota(fw_env, how, allocator):
    extra = dict(TF_GPU_ALLOCATOR=allocator) if allocator else {}
    r = run_framework("tf", "fw_tf", fw_env(GPUSLICE_MEMORY="4Gi", **extra), "fill", 256, how)
    assert r["error"] and r["error"]["type"] == "ResourceExhaustedError", r
    assert r["allocated"] >= 4, ("it got a real part of its quota", r)
    assert r["allocated"] * 256 * MI <= QUOTA and r["info"]["peak"] <= QUOTA, r


def test_tf_without_the_shim_sizes_from_the_device(fw_env):
    r = run_framework("tf", "fw_tf", fw_env(preload=False, memory="4Gi"), "fill", 256, "growth")
    assert r["error"]["type"] == "ResourceExhaustedError", r
    # TF keeps 1536 MiB of a device with 2 GiB or more free for the system: 2.5 GiB for tensors.
    assert r["allocated"] * 256 * MI <= 4 * GI - 1536 * MI, r
    assert r["allocated"] >= 8, r


def test_tf_memory_info_agrees_with_gpuslice_status(fw_env, profile_dir):
    env = fw_env(GPUSLICE_MEMORY="4Gi", GPUSLICE_SLICE="tf", TF_GPU_ALLOCATOR="cuda_malloc_async")
    with Served("tf", "fw_tf", env, "hold", 512) as t:
        info = t.ask("info")
        st = json.loads(subprocess.run([str(artifact(profile_dir, "gpuslice")), "status", "--json"], env=env,
                                       check=True, capture_output=True, text=True, timeout=60).stdout)
        sl = {s["name"]: s for s in st["slices"]}["tf"]
        assert sl["pids"] == [t.pid] and sl["memory_limit"] == QUOTA, st
        # TF's bytes in use are what the slice holds for it: its pool allocates what it uses.
        assert info["current"] >= 512 * MI, info
        assert info["current"] <= sl["memory_used"] <= info["current"] + 64 * MI, (info, st)
