"""Real third-party clients under libgpuslice.so: numba's built-in numba.cuda and pynvml see
the quota, and numba is refused past it with its own out-of-memory error."""

GI = 1 << 30
MI = 1 << 20


def test_numba_sees_the_quota_and_is_refused_past_it(gpu_env, client):
    env = gpu_env(memory="16Gi", preload=True, GPUSLICE_MEMORY="1Gi")
    r = client("shim_numba_quota", env, 256 * MI, 5)
    assert r["total"] == GI, r
    assert r["free"] == GI, r
    assert [x["ok"] for x in r["results"]] == [True, True, True, True, False], r
    refused = r["results"][4]
    assert refused["error"] == "CudaAPIError" and refused["code"] == 2, refused  # CUDA_ERROR_OUT_OF_MEMORY
    assert r["free_after"] == 0 and r["total_after"] == GI, r
    assert r["readback"], r


def test_numba_without_the_shim_sees_the_device(gpu_env, client):
    r = client("shim_numba_quota", gpu_env(memory="16Gi"), 256 * MI, 5)
    assert r["total"] == 16 * GI
    assert all(x["ok"] for x in r["results"])


def test_pynvml_reports_the_quota(gpu_env, client):
    env = gpu_env(memory="16Gi", preload=True, GPUSLICE_MEMORY="2Gi")
    # NVML alone (no CUDA in the process): the configured quota, nothing used.
    r = client("shim_pynvml_quota", env)
    assert r["total"] == 2 * GI and r["free"] == 2 * GI, r
    # With CUDA in the process: the slice's usage too, in both NVML structs.
    r = client("shim_pynvml_quota", env, 512 * MI)
    assert r["total"] == 2 * GI and r["free"] == 1536 * MI and r["used"] == 512 * MI, r
    if r["v2"] is not None:
        assert r["v2"]["total"] == 2 * GI and r["v2"]["free"] == 1536 * MI, r


def test_pynvml_without_the_shim_sees_the_device(gpu_env, client):
    r = client("shim_pynvml_quota", gpu_env(memory="16Gi"))
    assert r["total"] == 16 * GI


def test_lookups_get_wrappers_that_keep_the_drivers_choice(gpu_env, client):
    """dlsym and cuGetProcAddress_v2 hand out the shim's wrappers for hooked functions, the
    variant the driver picked (per-thread-stream _ptsz, _v2), and the real function for the
    rest; with GPUSLICE_DISABLE=1 everything is the driver's own."""
    r = client("shim_procaddr", gpu_env(preload=True))
    for name in ("cuMemAlloc_v2", "cuMemAllocAsync_ptsz", "cuLaunchKernel"):
        assert r["dlsym"][name] == ["libgpuslice.so", name], r
    assert r["dlsym"]["cuDeviceGetCount"][0] == "libcuda.so.1", r
    pa = r["proc_address"]
    assert pa["cuMemAlloc/0"] == [0, 0, "libgpuslice.so", "cuMemAlloc_v2"], pa
    assert pa["cuMemAllocAsync/0"][2:] == ["libgpuslice.so", "cuMemAllocAsync"], pa
    assert pa["cuMemAllocAsync/2"][2:] == ["libgpuslice.so", "cuMemAllocAsync_ptsz"], pa
    assert pa["cuLaunchKernel/2"][2:] == ["libgpuslice.so", "cuLaunchKernel_ptsz"], pa
    assert pa["cuGraphLaunch/2"][2:] == ["libgpuslice.so", "cuGraphLaunch_ptsz"], pa
    assert pa["cuGetProcAddress/0"][2:] == ["libgpuslice.so", "cuGetProcAddress_v2"], pa
    assert pa["cuDeviceGetCount/0"][2] == "libcuda.so.1", pa

    r = client("shim_procaddr", gpu_env(preload=True, GPUSLICE_DISABLE="1"))
    assert all(v[0] == "libcuda.so.1" for v in r["dlsym"].values()), r
    assert all(v[2] == "libcuda.so.1" for v in r["proc_address"].values()), r
