"""NVIDIA's CUDA runtime (libcudart 12.9 and 13.2 from the framework wheels) on the fake GPU,
through ctypes: it starts only with the fake's cuGetExportTable tables and a right integrity
answer, and fails as the reference (shared/reference/cudart-export-tables.md) says without them:
a withheld table gives the driver's error, a wrong integrity answer 103
(cudaErrorSoftwareValidityNotEstablished), a too-old driver version 35."""
import pytest

from conftest import run_framework

RUNTIMES = {"cudart12": "cuda12", "cudart13": "torch"}

# Tables cudart asks for at start-up, by the UUID prefix the fake's FAKEGPU_WITHHOLD_TABLE takes.
ALWAYS = ["6bd5fb6c", "a094798c", "42d85a81", "c693336e", "d4082055"]


def start(fw_env, runtime, **extra):
    return run_framework(RUNTIMES[runtime], "fw_cudart", fw_env(preload=False, **extra))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_cudart_starts_on_the_fake(fw_env, runtime):
    r = start(fw_env, runtime)
    assert r["count"] == [0, 1], r
    assert r["malloc"] == 0 and r["free"] == 0, r
    assert r["oom"] == 2, r  # cudaErrorMemoryAllocation


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("table", ALWAYS)
def test_a_withheld_table_stops_the_runtime(fw_env, runtime, table):
    r = start(fw_env, runtime, FAKEGPU_WITHHOLD_TABLE=table)
    # The fake answers an unknown table with CUDA_ERROR_NOT_SUPPORTED, which cudart passes on.
    assert r["count"][0] == 801, r


def test_cudart13_also_needs_its_own_table(fw_env):
    assert start(fw_env, "cudart13", FAKEGPU_WITHHOLD_TABLE="263e8860")["count"][0] == 801
    assert start(fw_env, "cudart12", FAKEGPU_WITHHOLD_TABLE="263e8860")["count"][0] == 0


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_wrong_integrity_answer_is_refused(fw_env, runtime):
    assert start(fw_env, runtime, FAKEGPU_BAD_INTEGRITY="1")["count"][0] == 103


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_old_driver_version_is_refused(fw_env, runtime):
    assert start(fw_env, runtime, FAKEGPU_DRIVER_VERSION="11080")["count"][0] == 35
    r = start(fw_env, runtime, FAKEGPU_DRIVER_VERSION="12090")
    assert r["count"][0] == (35 if runtime == "cudart13" else 0), r
