"""pynvml (nvidia-ml-py) reads the fake GPU through libnvidia-ml.so.1."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import CLIENTS, last_json
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


# --- Under libgpuslice.so: what a monitoring tool inside a slice sees (issue 12) -----------
#
# Every check runs pynvml in its own process, next to (never inside) the process that holds
# the memory, as nvidia-smi, nvitop or an exporter would.

MI = 1 << 20
NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND, NVML_ERROR_INSUFFICIENT_SIZE = 0, 3, 6, 7
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25


def gpuslice_cli(profile_dir):
    from conftest import artifact
    return artifact(profile_dir, "gpuslice")


def check_lists(r, expected):
    """The pynvml list and every raw entry point (v1, v2, v3) with NVML's count protocol."""
    assert r["processes"] == expected, r
    n = len(expected)
    for v in ("v1", "v2", "v3"):
        raw = r["raw"][v]
        assert raw["ask"] == ([NVML_ERROR_INSUFFICIENT_SIZE, n] if n else [NVML_SUCCESS, 0]), (v, raw)
        if n >= 2:
            assert raw["small"] == [NVML_ERROR_INSUFFICIENT_SIZE, n], (v, raw)
        assert raw["full"] == [NVML_SUCCESS, n] and raw["list"] == expected, (v, raw)
    assert r["detail"] == {"compute": expected, "graphics": [], "mps": []}, r
    assert r["graphics"] == [] and r["mps"] == [], r
    assert r["detail_v2_struct"] == NVML_ERROR_ARGUMENT_VERSION_MISMATCH, r
    # Accounting (on in the fake): the same pids, with the same count protocol.
    pids = sorted(p for p, _ in expected)
    assert r["accounting_pids"] == [pids, None], r
    raw = r["accounting_raw"]
    assert raw["ask"] == ([NVML_ERROR_INSUFFICIENT_SIZE, n] if n else [NVML_SUCCESS, 0]), raw
    assert raw["full"] == [NVML_SUCCESS, n] and raw["list"] == pids, raw


def test_nvml_only_process_sees_its_slice_and_only_its_slice(gpu_env, client, burn):
    env = gpu_env(memory="16Gi", preload=True, GPUSLICE_SLICE="x", GPUSLICE_MEMORY="1Gi")
    neighbour = gpu_env(memory="16Gi", preload=True, GPUSLICE_SLICE="y", GPUSLICE_MEMORY="2Gi")
    with Holder(burn, env, "256Mi") as a, Holder(burn, env, "128Mi") as b, \
            Holder(burn, neighbour, "512Mi") as n:
        r = client("pynvml_slice", env)
        assert r["memory"] == {"total": GI, "free": 640 * MI, "used": 384 * MI}, r
        assert r["memory_v2"] == {"total": GI, "free": 640 * MI, "used": 384 * MI, "reserved": 0}, r
        check_lists(r, sorted([[a.pid, 256 * MI], [b.pid, 128 * MI]]))

        # Accounting stats: our own processes, never the neighbour's (as if it did not exist).
        r = client("pynvml_slice", env, "--stats-pid", str(a.pid), "--stats-pid", str(n.pid))
        assert r["accounting_stats"][str(n.pid)] == [None, NVML_ERROR_NOT_FOUND], r
        if os.readlink("/proc/self/ns/pid") == "pid:[4026531836]":  # the host's pids: NVML's
            # The driver's own figure: the allocation and the process's context (512 MiB on
            # the fake's 16 GiB device, docs/fakegpu.md), which the slice's list leaves out.
            assert r["accounting_stats"][str(a.pid)] == [256 * MI + 512 * MI, None], r
        else:  # a pid NVML cannot be asked about is not found either
            assert r["accounting_stats"][str(a.pid)] == [None, NVML_ERROR_NOT_FOUND], r

        # The neighbour sees its own slice, not ours.
        r = client("pynvml_slice", neighbour)
        assert r["memory"] == {"total": 2 * GI, "free": 1536 * MI, "used": 512 * MI}, r
        check_lists(r, [[n.pid, 512 * MI]])

        # Outside any slice (the library loaded, no slice settings), with GPUSLICE_DISABLE=1,
        # and without the library: the real device and every process on it.
        for outside in (gpu_env(memory="16Gi", preload=True), dict(env, GPUSLICE_DISABLE="1"),
                        gpu_env(memory="16Gi")):
            r = client("pynvml_slice", outside)
            assert r["memory"]["total"] == 16 * GI and r["memory"]["used"] >= 896 * MI, r
            assert {a.pid, b.pid, n.pid} <= {p for p, _ in r["processes"]}, r
            assert r["detail"]["compute"] == r["processes"], r
            assert {a.pid, b.pid, n.pid} <= set(r["accounting_pids"][0]), r


def test_operator_slice_quota_without_a_memory_variable(gpu_env, client, burn, profile_dir):
    env = gpu_env(memory="16Gi")
    p = subprocess.run([str(gpuslice_cli(profile_dir)), "slice", "create", "op", "--memory", "3Gi"],
                       env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    wrapped = gpu_env(memory="16Gi", preload=True, GPUSLICE_SLICE="op")
    # No CUDA process in the slice yet: the operator's quota, nothing used, nobody listed.
    r = client("pynvml_slice", wrapped)
    assert r["memory"] == {"total": 3 * GI, "free": 3 * GI, "used": 0}, r
    check_lists(r, [])
    # A process asking for more than the operator gave is held to the operator's quota, and
    # NVML says so too (as cuInit would).
    asks_more = dict(wrapped, GPUSLICE_MEMORY="8Gi")
    with Holder(burn, wrapped, "1Gi") as h:
        for e in (wrapped, asks_more):
            r = client("pynvml_slice", e)
            assert r["memory"] == {"total": 3 * GI, "free": 2 * GI, "used": GI}, r
            check_lists(r, [[h.pid, GI]])


def test_hami_shared_cache_is_one_slice(gpu_env, client, burn, tmp_path):
    cache = tmp_path / "vgpu" / "cache"
    env = gpu_env(memory="16Gi", preload=True, CUDA_DEVICE_MEMORY_LIMIT="1g",
                  CUDA_DEVICE_MEMORY_SHARED_CACHE=str(cache))
    with Holder(burn, env, "300Mi") as h:
        r = client("pynvml_slice", env)
        assert r["memory"] == {"total": GI, "free": 724 * MI, "used": 300 * MI}, r
        check_lists(r, [[h.pid, 300 * MI]])
        # Another container (another cache path) is another slice: its own quota, nothing of ours.
        r = client("pynvml_slice", dict(env, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "other")))
        assert r["memory"] == {"total": GI, "free": GI, "used": 0}, r
        check_lists(r, [])


def test_quotas_by_percent_and_per_cuda_ordinal(gpu_env, client, burn):
    """`25%` of the device, and per-device values by CUDA ordinal under CUDA_VISIBLE_DEVICES,
    before any CUDA process and after one made the slice."""
    env = gpu_env(devices=2, memory="16Gi", preload=True, GPUSLICE_SLICE="p", GPUSLICE_MEMORY="25%")
    r = client("pynvml_slice", env, "--index", "1")
    assert r["memory"] == {"total": 4 * GI, "free": 4 * GI, "used": 0}, r
    # CUDA sees NVML's device 1 as its device 0 (2 GiB); NVML's device 0 is not the
    # process's: the real device.
    env = gpu_env(devices=2, memory="16Gi", preload=True, GPUSLICE_SLICE="q",
                  GPUSLICE_MEMORY="0=2Gi,1=5Gi", CUDA_VISIBLE_DEVICES="1")
    r = client("pynvml_slice", env, "--index", "1")
    assert r["memory"] == {"total": 2 * GI, "free": 2 * GI, "used": 0}, r
    with Holder(burn, env, "1Gi") as h:
        r = client("pynvml_slice", env, "--index", "1")
        assert r["memory"] == {"total": 2 * GI, "free": GI, "used": GI}, r
        check_lists(r, [[h.pid, GI]])
        r = client("pynvml_slice", env, "--index", "0")
        assert r["memory"] == {"total": 16 * GI, "free": 16 * GI, "used": 0}, r


def test_one_process_sees_the_same_totals_from_nvml_and_cuda(gpu_env, client, burn, profile_dir):
    env = gpu_env(memory="16Gi")
    p = subprocess.run([str(gpuslice_cli(profile_dir)), "slice", "create", "op", "--memory", "3Gi"],
                       env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    wrapped = gpu_env(memory="16Gi", preload=True, GPUSLICE_SLICE="op", GPUSLICE_MEMORY="8Gi")
    with Holder(burn, wrapped, "1Gi") as h:
        r = client("pynvml_with_cuda", wrapped, 512 * MI)
    assert r["nvml_before"] == {"total": 3 * GI, "free": 2 * GI, "used": GI}, r
    assert r["cuda"] == {"total": 3 * GI, "free": 2 * GI, "device_total": 3 * GI}, r
    assert r["nvml_attached"] == r["nvml_before"], r
    assert r["cuda_after"] == {"total": 3 * GI, "free": 1536 * MI, "device_total": 3 * GI}, r
    assert r["nvml_after"] == {"total": 3 * GI, "free": 1536 * MI, "used": 1536 * MI}, r
    assert r["processes"] == sorted([[h.pid, GI], [r["pid"], 512 * MI]]), r

    # Outside any slice (the library, no slice settings): best effort, so the driver API and
    # NVML both cap free by what no slice reserved (16 - 3 GiB), while NVML's process list is
    # the real one (the neighbour included).
    plain = gpu_env(memory="16Gi", preload=True)
    with Holder(burn, wrapped, "1Gi") as h:
        r = client("pynvml_with_cuda", plain, 512 * MI)
    assert r["cuda"]["total"] == r["nvml_attached"]["total"] == 16 * GI, r
    assert r["cuda"]["free"] == r["nvml_attached"]["free"] == 13 * GI, r
    assert r["cuda_after"]["free"] == r["nvml_after"]["free"] == 13 * GI - 512 * MI, r
    assert {h.pid, r["pid"]} <= {p for p, _ in r["processes"]}, r


def test_nvml_only_creates_nothing_and_sees_a_ledger_made_later(gpu_env, burn):
    import pathlib

    env = gpu_env(memory="16Gi", preload=True, GPUSLICE_SLICE="late", GPUSLICE_MEMORY="1Gi")
    runtime = pathlib.Path(env["GPUSLICE_RUNTIME_DIR"])
    shutil.rmtree(runtime)
    c = subprocess.Popen([sys.executable, str(CLIENTS / "pynvml_slice.py"), "--announce",
                          "--wait-used", str(256 * MI), "--wait-procs", "1", "--timeout", "60"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    try:
        first = json.loads(c.stdout.readline())
        assert first["event"] == "polling", first
        assert first["memory"] == {"total": GI, "free": GI, "used": 0}, first
        assert first["processes"] == [], first
        time.sleep(0.5)  # a few more polls
        assert not runtime.exists(), list(runtime.iterdir())
        with Holder(burn, env, "256Mi") as h:
            out, err = c.communicate(timeout=90)
            r = last_json(out)
            assert c.returncode == 0 and r is not None, err
            assert r["memory"] == {"total": GI, "free": 768 * MI, "used": 256 * MI}, r
            assert r["processes"] == [[h.pid, 256 * MI]], r
    finally:
        if c.poll() is None:
            c.kill()
            c.communicate()


def outer_pid_of_child(pid):
    """The pid (in our namespace) of the one child of `pid`."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = f.read().split()
    assert len(kids) == 1, kids
    return int(kids[0])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"),
                    reason="needs root, unshare and nsenter")
def test_process_lists_under_a_pid_namespace(gpu_env, client, burn):
    env = gpu_env(memory="16Gi", preload=True, GPUSLICE_SLICE="ns", GPUSLICE_MEMORY="1Gi")
    py = [sys.executable, str(CLIENTS / "pynvml_slice.py")]
    # The holder in a PID namespace of its own, with its own /proc (as in a container).
    holder = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", str(burn), "--json",
                               "--alloc", "200Mi", "--hold", "120"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    outer = None
    try:
        line = holder.stdout.readline()
        assert line.startswith("{"), (line, holder.stderr.read())
        held = json.loads(line)
        assert held["event"] == "holding" and held["pid"] == 1, held
        outer = outer_pid_of_child(holder.pid)
        with Holder(burn, env, "100Mi") as host:
            # On the host: the holder under its host pid, and the host process.
            r = client("pynvml_slice", env)
            assert r["memory"]["used"] == 300 * MI, r
            check_lists(r, sorted([[outer, 200 * MI], [host.pid, 100 * MI]]))
            # Inside the holder's namespace: pid 1 is the holder; the host process cannot be
            # named there, so it is not listed (its memory still counts).
            inside = subprocess.run(["nsenter", "--target", str(outer), "--pid", "--mount", *py],
                                    env=env, capture_output=True, text=True, timeout=120,
                                    stdin=subprocess.DEVNULL)
            r = last_json(inside.stdout)
            assert inside.returncode == 0 and r, inside.stderr
            assert r["memory"]["used"] == 300 * MI, r
            check_lists(r, [[1, 200 * MI]])
            # A sibling namespace (another container) sees neither.
            sib = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *py], env=env,
                                 capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            r = last_json(sib.stdout)
            assert sib.returncode == 0 and r, sib.stderr
            assert r["memory"]["used"] == 300 * MI, r
            check_lists(r, [])
    finally:
        if outer is not None:
            os.kill(outer, 9)  # the namespace's init: the namespace goes with it
        holder.kill()
        holder.communicate(timeout=60)


def test_utilization_of_a_busy_slice_and_an_idle_one(gpu_env, client, burn):
    busy = gpu_env(memory="16Gi", preload=True, GPUSLICE_SLICE="busy", GPUSLICE_MEMORY="1Gi")
    idle = gpu_env(memory="16Gi", preload=True, GPUSLICE_SLICE="idle", GPUSLICE_MEMORY="1Gi")
    with Holder(burn, idle, "64Mi") as quiet:
        p = subprocess.Popen([str(burn), "--json", "--seconds", "30", "--kernel-us", "2000"], env=busy,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL)
        try:
            r = client("pynvml_slice", busy, "--wait-util", "60", "--wait-procs", "1")
            assert r["utilization"]["gpu"] >= 60, r
            assert r["processes"] == [[p.pid, 0]], r
            # The one process of the slice carries the slice's use (sampled a moment later:
            # loose bound, the CPUs may be busy).
            [[pid, sm]] = r["process_utilization"]
            assert pid == p.pid and sm >= 25, r
            [[pid, sm]] = r["processes_utilization_info"]  # the versioned form
            assert pid == p.pid and sm >= 25, r
            r = client("pynvml_slice", idle)
            assert r["utilization"]["gpu"] == 0 and r["utilization"]["memory"] == 0, r
            assert r["process_utilization"] is None, r
            assert r["process_utilization_error"] == NVML_ERROR_NOT_FOUND, r  # no samples
            assert r["processes_utilization_info_error"] == NVML_ERROR_NOT_FOUND, r
            assert r["processes"] == [[quiet.pid, 64 * MI]], r
            # Outside any slice: the device's own figures (the busy neighbour shows), and the
            # fake's answer to per-process utilisation (it does not measure it).
            r = client("pynvml_slice", gpu_env(memory="16Gi"))
            assert r["utilization"]["gpu"] >= 25, r
            assert r["process_utilization_error"] == NVML_ERROR_NOT_SUPPORTED, r
            assert r["processes_utilization_info_error"] == NVML_ERROR_NOT_SUPPORTED, r
        finally:
            p.kill()
            p.communicate()


def test_a_polling_loop_is_cheap_and_sees_the_slice(gpu_env, client, burn):
    """The loop docs/benchmarks.md times (here for its answers, never for its speed)."""
    env = gpu_env(memory="16Gi", preload=True, GPUSLICE_SLICE="poll", GPUSLICE_MEMORY="1Gi")
    with Holder(burn, env, "256Mi") as h:
        r = client("pynvml_poll", env, 1000)
        assert r["polls"] == 1000
        assert r["memory"] == {"total": GI, "free": 768 * MI, "used": 256 * MI}, r
        assert r["processes"] == [[h.pid, 256 * MI]], r
