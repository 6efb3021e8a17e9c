"""The fake GPU where real programs meet the driver (docs/fakegpu.md): cuBLAS answers the same in
every process, events are destroyed without waiting, one driver version everywhere, a context
costs device memory, and the NVML calls monitoring tools make at start are answered.

Every test here runs the fake WITHOUT the shim (what the fake itself must get right), except
`test_torch_a_context_is_not_charged_to_the_quota`, which pins down what the shim decides.
"""
import concurrent.futures
import subprocess
import sys

import pytest

from conftest import framework_venv, last_json, run_client, run_framework, CLIENTS

GI = 1 << 30
MI = 1 << 20
FRESH = 20
# NVIDIA's driver branches and the CUDA version each ships (the release notes' table).
BRANCH_CUDA = {520: 11080, 525: 12000, 535: 12020, 550: 12040, 560: 12060, 570: 12080,
               575: 12090, 580: 13000}


def fresh_processes(group, name, env, *args, n=FRESH, parallel=4):
    """Run client `name` in `n` fresh processes, `parallel` at a time; their JSON reports (or
    the failure of those that printed none)."""
    cmd = [str(framework_venv(group)), str(CLIENTS / f"{name}.py"), *map(str, args)]

    def one(_):
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                           stdin=subprocess.DEVNULL)
        return last_json(p.stdout) or dict(exit=p.returncode, stderr=p.stderr[-2000:])

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(one, range(n)))


def test_torch_cublas_gemm_succeeds_in_every_fresh_process(fw_env):
    """cuBLASLt reads CU_LIMIT_CIG_ENABLED when it creates a handle and ignores a failure; a fake
    that did not answer it left the variable as the stack had it, and 2 of 6 processes failed
    with CUBLAS_STATUS_ARCH_MISMATCH. Twenty fresh processes, a 7x7 matmul and a batched one."""
    env = fw_env(preload=False)
    reports = fresh_processes("torch", "fw_torch", env, "gemm")
    bad = [r for r in reports if r.get("matmul") != {"shape": [7, 7]}
           or r.get("bmm") != {"shape": [3, 7, 7]}]
    assert not bad, f"{len(bad)} of {FRESH} processes failed: {bad[:3]}"


def test_cupy_cublas_gemm_succeeds_in_every_fresh_process(fw_env):
    env = fw_env(preload=False)
    reports = fresh_processes("cuda12", "fw_cupy", env, "gemm")
    bad = [r for r in reports if r.get("gemm") != {"shape": [7, 7]}]
    assert not bad, f"{len(bad)} of {FRESH} processes failed: {bad[:3]}"


def test_event_destroy_returns_at_once_and_frees_after_the_work(gpu_env):
    r = run_client("fake_driver", gpu_env(), "events", timeout=120)
    assert r["destroy"] == 0, r
    # The record sits behind a 3 s kernel: the destroy did not wait for it.
    assert r["busy_after_destroy"] == 600, r
    assert r["query_destroyed"] == 400, r
    # A wait queued before the destroy still waited for the record, i.e. for the kernel.
    assert r["waiter_sync"] == 0 and r["busy_after_waiter"] == 0, r
    # A host function destroying an event recorded behind it: a waiting destroy deadlocks.
    assert r["host_fn_stream_sync"] == 0 and r["host_fn_destroy"] == [0], r
    assert r["cycles"] == [0], r


def test_torch_multi_stream_backward_with_callbacks_completes(fw_env):
    """PyTorch's autograd destroys events while work is queued; with a destroy that waited, a
    backward over several streams with callbacks hung in cuEventDestroy_v2."""
    r = run_framework("torch", "fw_torch", fw_env(preload=False), "backward", timeout=300)
    assert r["steps"] == 5 and r["hooks"] == 5 and r["callbacks"] == 5, r
    assert r["grad"] == [64, 64], r


def test_torch_cuda_graph_raw_executable_and_debug_dump(fw_env, tmp_path):
    """PyTorch 2.15's CUDA-graph calls beyond capture and replay reach the 13.0 driver's entry
    points: a kept graph's raw executable, and a debug dump (DOT) of the captured kernel."""
    dot = tmp_path / "graph.dot"
    r = run_framework("torch", "fw_torch", fw_env(preload=False), "graphs", dot)
    assert r["raw_exec"] is True, r
    assert isinstance(r["dump"], str) and r["dump"].startswith("digraph"), r
    assert "KERNEL" in r["dump"], r


@pytest.mark.parametrize("cuda", [None, "12020"], ids=["default", "12.2"])
def test_driver_version_nvml_and_proc_address_describe_one_driver(gpu_env, cuda):
    env = gpu_env() if cuda is None else gpu_env(FAKEGPU_DRIVER_VERSION=cuda)
    r = run_client("fake_driver", env, "versions")
    v = r["driver_version"]
    assert v == (13000 if cuda is None else int(cuda)), r
    # NVML: the same CUDA version, a driver of the branch that ships it, NVML's own version
    # made of both.
    nvml = r["nvml"]
    assert nvml["cuda"] == v, r
    branch = int(nvml["driver"].split(".")[0])
    assert BRANCH_CUDA[branch] == v, r
    assert nvml["nvml"] == f"{v // 1000}.{nvml['driver']}", r
    # The proc-address table: the forms of that driver, whatever the runtime asks for.
    res = r["resolved"]
    sync = "cuCtxSynchronize_v2" if v >= 13000 else "cuCtxSynchronize"
    elapsed = "cuEventElapsedTime_v2" if v >= 12080 else "cuEventElapsedTime"
    for asked in (v, 13020):
        assert res[f"cuCtxSynchronize@{asked}"]["symbol"] == sync, res
        assert res[f"cuMemAlloc@{asked}"]["symbol"] == "cuMemAlloc_v2", res
        assert res[f"cuEventElapsedTime@{asked}"]["symbol"] == elapsed, res
        # An entry point of CUDA 13.1 is unknown to this driver (status 1: not found).
        assert res[f"cuGraphGetId@{asked}"] == dict(rc=0, status=1, symbol=None), res
    # CUDA 13.0's own additions exist exactly when the driver is 13.0.
    pool = res[f"cuMemGetDefaultMemPool@{v}"]
    assert (pool["symbol"] is not None) == (v >= 13000), res


def test_a_context_costs_device_memory(gpu_env):
    """16 GiB device: the primary context takes 512 MiB (1/32 of the device, at most 512 MiB),
    counted to the process in NVML; the rest can be allocated, the whole total cannot."""
    r = run_client("fake_driver", gpu_env(memory="16Gi"), "headroom")
    ctx = 512 * MI
    assert r["nvml_used_before"] == 0, r
    assert r["total"] == 16 * GI and r["free"] == 16 * GI - ctx, r
    assert r["alloc_total"] == 2, r  # CUDA_ERROR_OUT_OF_MEMORY
    assert r["alloc_free"] == 0 and r["alloc_one_more"] == 2, r
    assert r["nvml_process_used"] == [16 * GI] and r["nvml_used"] == 16 * GI, r


def test_a_small_device_charges_a_proportional_context(gpu_env):
    r = run_client("fake_driver", gpu_env(memory="1Gi"), "headroom")
    assert r["total"] == GI and r["free"] == GI - 32 * MI, r
    r = run_client("fake_driver", gpu_env(memory="1Gi", FAKEGPU_CONTEXT_MEMORY="0"), "headroom")
    assert r["free"] == GI and r["alloc_total"] == 0, r


def test_torch_second_half_of_the_device_is_out_of_memory(fw_env):
    """Two tensors of half the device each: the context leaves less than the second needs, so
    PyTorch's allocator frees its cache, retries, and raises torch.OutOfMemoryError."""
    r = run_framework("torch", "fw_torch", fw_env(preload=False, memory="4Gi"), "fill", 2048)
    assert r["before"]["total"] == 4 * GI and r["before"]["free"] == 4 * GI - 128 * MI, r
    assert r["allocated"] == 1, r
    assert r["error"] and r["error"]["type"] == "OutOfMemoryError", r


def test_torch_a_context_is_not_charged_to_the_quota(fw_env):
    """Under the shim the quota counts what the program allocates (design.md's list of paths),
    not the driver's context: a 2 GiB slice holds two tensors of half its quota, and the next
    allocation is torch.OutOfMemoryError. The context still takes device memory outside the
    quota (docs/fakegpu.md, docs/operations.md)."""
    r = run_framework("torch", "fw_torch", fw_env(GPUSLICE_MEMORY="2Gi"), "fill", 1024)
    assert r["before"]["total"] == 2 * GI and r["before"]["free"] == 2 * GI, r
    assert r["allocated"] == 2, r
    assert r["error"] and r["error"]["type"] == "OutOfMemoryError", r


def test_nvitop_starts_on_the_fake_without_errors(gpu_env, client):
    """`nvitop -1` (one snapshot) queries what monitoring tools ask at start: clocks, power,
    fans, encoder and decoder load, PCIe, MIG and compute mode. None may be an error."""
    env = gpu_env(devices=2)
    # A process holding memory, so nvitop lists one.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import ctypes, sys, time\n"
        f"sys.path.insert(0, {str(CLIENTS)!r})\n"
        "from cuda_ctx import primary_context, alloc\n"
        "cuda, _ = primary_context(); alloc(cuda, 256 << 20)\n"
        "print('ready', flush=True); time.sleep(60)\n")],
        env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        p = subprocess.run([sys.executable, "-m", "nvitop", "-1"], env=env, capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
    finally:
        holder.kill()
        holder.wait()
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    assert "ERROR" not in text.upper(), text
    assert "Fake GPU H200" in text and "580.95.05" in text, text
    assert str(holder.pid) in text, text


def test_gpustat_reads_the_fake(gpu_env):
    p = subprocess.run([sys.executable, "-m", "gpustat", "--json"], env=gpu_env(devices=2),
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    import json
    g = json.loads(p.stdout)
    assert g["driver_version"] == "580.95.05" and len(g["gpus"]) == 2, g
    for d in g["gpus"]:
        assert d["temperature.gpu"] == 40 and d["power.draw"] == 100, d
        assert d["enforced.power.limit"] == 700 and d["utilization.enc"] == 0, d
