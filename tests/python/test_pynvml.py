"""pynvml (nvidia-ml-py) reads the fake GPU through libnvidia-ml.so.1."""

import json
import re
import subprocess

from helpers import Holder

GI = 1 << 30
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def test_pynvml_reads_name_uuid_and_memory(gpu_env, client):
    r = client("pynvml_basic", gpu_env(devices=2, memory="24Gi"))
    assert r["driver_version"] and r["cuda_driver_version"] >= 11000, r
    assert len(r["devices"]) == 2
    for d in r["devices"]:
        assert d["name"], d
        assert UUID.match(d["uuid"]), d["uuid"]
        assert d["uuid_handle_matches"]
        m = d["memory"]
        assert m["total"] == 24 * GI and m["free"] + m["used"] == m["total"], m
        assert d["memory_v2"]["total"] == 24 * GI, d
    assert r["devices"][0]["uuid"] != r["devices"][1]["uuid"]


def test_pynvml_agrees_with_the_driver_api(gpu_env, client, burn):
    """NVML and the driver API describe the same device (as gpuslice-burn reads it)."""
    env = gpu_env(memory="12Gi")
    nv = client("pynvml_basic", env)["devices"][0]
    out = subprocess.run([str(burn), "--json"], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    cu = json.loads(out.strip().splitlines()[-1])
    assert cu["device"]["uuid"] == nv["uuid"]
    assert cu["device"]["name"] == nv["name"]
    assert cu["mem_total"] == nv["memory"]["total"] == 12 * GI


def test_pynvml_sees_another_process_and_its_memory(gpu_env, client, burn):
    env = gpu_env(memory="16Gi")
    with Holder(burn, env, "3Gi") as h:
        d = client("pynvml_basic", env)["devices"][0]
        assert d["memory"]["used"] >= 3 * GI, d
        procs = {p["pid"]: p["used"] for p in d["processes"]}
        assert h.pid in procs, (h.pid, d["processes"])
        assert procs[h.pid] >= 3 * GI
