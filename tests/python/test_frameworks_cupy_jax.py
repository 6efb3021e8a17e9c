"""CuPy 14 and JAX (jax[cuda12]) on the fake GPU under libgpuslice.so, each compared with a run
without the shim."""
import pytest

from conftest import Served, run_framework

GI = 1 << 30
MI = 1 << 20


def test_cupy_pool_fills_the_quota_and_frees_back_to_the_slice(fw_env):
    r = run_framework("cuda12", "fw_cupy", fw_env(GPUSLICE_MEMORY="1Gi"), "fill", 96)
    assert r["before"]["total"] == GI and r["before"]["free"] == GI, r
    assert r["error"] and r["error"]["type"] == "OutOfMemoryError", r
    assert r["allocated"] == 10, r  # 10 x 96 MiB fit in 1 GiB, the 11th does not
    # Deleted arrays stay in CuPy's pool (the slice still counts them) until free_all_blocks.
    assert r["after_del"]["pool_total"] == 10 * 96 * MI and r["after_del"]["free"] == GI - 10 * 96 * MI, r
    assert r["after_free"]["pool_total"] == 0 and r["after_free"]["free"] == GI, r


def test_cupy_without_the_shim_sees_the_whole_device(fw_env):
    """The whole device less its context (64 MiB of 2 GiB on the fake, docs/fakegpu.md): seven
    256 MiB arrays fit, the eighth does not."""
    r = run_framework("cuda12", "fw_cupy", fw_env(preload=False, memory="2Gi"), "fill", 256)
    assert r["before"]["total"] == 2 * GI and r["before"]["free"] == 2 * GI - 64 * MI, r
    assert r["allocated"] == 7, r
    assert r["error"]["type"] == "OutOfMemoryError", r


def test_cupy_free_all_blocks_lets_a_neighbour_in(fw_env):
    env = fw_env(GPUSLICE_MEMORY="1Gi", GPUSLICE_SLICE="pair")
    with Served("cuda12", "fw_cupy", env, "hold") as a, Served("cuda12", "fw_cupy", env, "hold") as b:
        assert "error" not in a.ask("alloc 768")
        assert b.ask("info")["free"] == GI - 768 * MI
        a.ask("free")
        assert b.ask("alloc 512").get("error") == "OutOfMemoryError"
        assert a.ask("free_all")["pool_total"] == 0
        got = b.ask("alloc 512")
        assert "error" not in got and got["free"] == GI - 512 * MI, got


@pytest.mark.parametrize("prealloc", ["true", "false"])
def test_jax_bytes_limit_follows_the_quota(fw_env, prealloc):
    r = run_framework("cuda12", "fw_jax", fw_env(GPUSLICE_MEMORY="2Gi", XLA_PYTHON_CLIENT_PREALLOCATE=prealloc),
                      "fill", 256)
    assert r["platform"] == "gpu", r
    # XLA's default: 75% of the memory the device reports, here the quota.
    assert r["before"]["bytes_limit"] == int(0.75 * 2 * GI), r
    if prealloc == "true":
        assert r["first"]["pool_bytes"] == r["before"]["bytes_limit"], ("preallocated", r)
    else:
        assert r["first"]["pool_bytes"] < 64 * MI, ("grows on demand", r)
    assert r["error"] and r["error"]["resource_exhausted"], r
    assert r["allocated"] == 5, r  # 6 x 256 MiB would pass the 1.5 GiB limit
    assert r["after"]["pool_bytes"] <= 2 * GI, r


def test_jax_without_the_shim_sees_the_whole_device(fw_env):
    r = run_framework("cuda12", "fw_jax", fw_env(preload=False, memory="4Gi"), "fill", 512)
    assert r["before"]["bytes_limit"] == 3 * GI, r
    assert r["error"]["resource_exhausted"] and r["allocated"] == 5, r


def test_jax_preallocation_past_the_quota_is_refused(fw_env):
    """Told to preallocate 90% of a 16 GiB device in a 2 GiB slice (XLA_PYTHON_CLIENT_MEM_FRACTION
    against the quota it sees: it sizes from the quota), JAX stays within the quota."""
    r = run_framework("cuda12", "fw_jax", fw_env(GPUSLICE_MEMORY="2Gi", XLA_PYTHON_CLIENT_MEM_FRACTION="0.9"),
                      "fill", 256)
    assert r["before"]["bytes_limit"] <= 2 * GI, r
    assert r["after"]["pool_bytes"] <= 2 * GI and r["error"]["resource_exhausted"], r
