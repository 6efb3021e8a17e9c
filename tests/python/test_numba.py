"""numba's built-in numba.cuda (ctypes binding) runs against the fake GPU."""

from helpers import Holder

GI = 1 << 30
MI = 1 << 20


def test_numba_copies_bytes_reads_memory_and_launches(gpu_env, client):
    big = 256 * MI
    r = client("numba_basic", gpu_env(memory="16Gi"), big)
    assert r["roundtrip_equal"] and r["float_roundtrip_equal"], r
    assert r["roundtrip_bytes"] == 3 * MI
    assert r["total"] == 16 * GI == r["total_with_big"]
    assert 0 < r["free_before"] <= r["total"]
    # The big array shows in get_memory_info (allocation granularity may round it up a little).
    taken = r["free_before"] - r["free_with_big"]
    assert big <= taken <= big + 64 * MI, r
    assert r["kernel_launched"] and r["ptx_has_entry"], r
    assert r["device_name"]


def test_numba_sees_memory_held_by_another_process(gpu_env, client, burn):
    env = gpu_env(memory="8Gi")
    alone = client("numba_basic", env, MI)
    with Holder(burn, env, "2Gi") as h:
        assert h.holding["allocated_bytes"] == 2 * GI
        shared = client("numba_basic", env, MI)
    assert shared["total"] == alone["total"] == 8 * GI
    assert alone["free_before"] - shared["free_before"] >= 2 * GI, (alone, shared)
