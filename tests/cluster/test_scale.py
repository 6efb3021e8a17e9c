"""tests/cluster/scale_bench.py at a small scale on the real cluster: simulated nodes publish
the plugin's ResourceSlices, kube-scheduler places the claims within each device's capacity,
what does not fit stays Pending with the scheduler's reason, and nothing is left after."""

import json
import os
import subprocess
import sys

LABEL = "gpuslice.dev/scale-bench"


def test_scale_bench_small(cluster, tmp_path):
    out = tmp_path / "scale.json"
    # 3 nodes x 2 GPUs of 16 GiB, 12 pods asking 1-16 GiB and 0.1-1.0 each: more compute than
    # the 6 GPUs have, so some shared pods and exactly 6 whole-GPU pods stay Pending. A driver
    # name of its own keeps the real node's gpuslice.dev slice the only one of that driver.
    p = subprocess.run(
        [sys.executable, str(cluster.root / "tests/cluster/scale_bench.py"), "--nodes", "3",
         "--gpus", "2", "--gpu-memory", "16Gi", "--pods", "12", "--driver", "sim.gpuslice.dev",
         "--settle", "5", "--timeout", "300", "--json", str(out)],
        # CARGO_TARGET_DIR (CI's is outside the checkout) says where the release binaries are.
        capture_output=True, text=True, timeout=600, env={**os.environ, **cluster.env})
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert "| shared |" in p.stdout and "| whole |" in p.stdout, p.stdout
    res = {r["mode"]: r for r in json.loads(out.read_text())["results"]}

    shared = res["shared"]
    assert shared["bound"] >= 6 and shared["bound"] + shared["pending"] == 12, shared
    assert shared["overcommitted"] == [], shared
    # kube-scheduler writes consumedCapacity keys as the bare capacity names (the plugin reads
    # them so; docs/kubernetes.md).
    assert shared["consumed_keys"] == ["compute", "memory"], shared
    assert 0 < shared["compute_fill"] <= 1 and 0 < shared["memory_fill"] <= 1, shared

    whole = res["whole"]
    assert (whole["bound"], whole["pending"], whole["devices_used"]) == (6, 6, 6), whole
    assert whole["overcommitted"] == [], whole
    for r in (shared, whole):
        for msg, _count in r["reasons"]:
            assert "cannot allocate all claims" in msg, r["reasons"]

    for kind in ("nodes", "resourceslices", "deviceclasses"):
        assert cluster.get(kind, selector=LABEL)["items"] == [], kind
    assert not cluster.exists("namespace", "gpuslice-scale")
