"""The node's ResourceSlice as the plugin publishes it, taken by the real API server at every
reservation level an operator can leave on a GPU (docs/kubernetes.md, "When operator slices
reserve most of a GPU"), and what kube-scheduler then does with it."""

import pytest

import workloads as w
from kube import quantity

GI = 1 << 30


def node_slice(cluster):
    slices = [s for s in cluster.resource_slices() if s["spec"]["driver"] == "gpuslice.dev"]
    assert len(slices) == 1, [s["metadata"]["name"] for s in slices]
    return slices[0]


def devices_by_index(s):
    return {d["attributes"]["index"]["int"]: d for d in s["spec"]["devices"]}




def operator(cluster, *args):
    """`gpuslice slice ...` as root in the monitor's container, as an operator on the node."""
    return cluster.exec("gpuslice-system", cluster.driver_pod(), ["gpuslice", "slice", *args],
                        container="monitor")


def wait_slice(cluster, what, check, timeout=60):
    return cluster.wait_until(what, lambda: check(devices_by_index(node_slice(cluster))), timeout)


def plugin_refusals(cluster):
    log = cluster.logs("gpuslice-system", cluster.driver_pod(), "plugin")
    return [ln for ln in log.splitlines() if "refused" in ln and "ResourceSlice" in ln]


@pytest.fixture
def reservation(cluster):
    yield
    if "ops-hold" in [s["name"] for s in cluster.gpuslice_status()["slices"]]:
        operator(cluster, "rm", "ops-hold")


def test_the_resource_slice_at_every_reservation_level(cluster, reservation):
    s = node_slice(cluster)
    print("published:", s["metadata"]["name"], "generation", s["spec"]["pool"]["generation"])
    devs = devices_by_index(s)
    assert len(devs) == 2, devs
    for d in devs.values():
        assert d["allowMultipleAllocations"] is True
        cap = d["capacity"]
        assert quantity(cap["memory"]["value"]) == 16 * GI, cap
        assert quantity(cap["compute"]["value"]) == 1000, cap
        # The request policies as the API server kept them (a refusal would have dropped the
        # whole slice).
        assert quantity(cap["memory"]["requestPolicy"]["validRange"]["min"]) == 256 << 20, cap
        assert quantity(cap["compute"]["requestPolicy"]["default"]) == 0, cap

    # An operator slice holding all of GPU 0's compute: GPU 0 takes best-effort claims only.
    operator(cluster, "create", "ops-hold", "--memory", "1Gi", "--compute", "1.0", "--device", "0")
    devs = wait_slice(cluster, "GPU 0's compute reserved", lambda d: (
        d.get(0) and quantity(d[0]["capacity"]["compute"]["value"]) == 0 and d))
    assert "requestPolicy" not in devs[0]["capacity"]["compute"], devs[0]
    assert quantity(devs[0]["capacity"]["memory"]["value"]) == 15 * GI
    assert quantity(devs[1]["capacity"]["compute"]["value"]) == 1000

    # 15.75 of its 16 GiB (16128Mi), then all of it: GPU 0 is left out, GPU 1 stays whole.
    for memory in ("16128Mi", "16Gi"):
        operator(cluster, "rm", "ops-hold")
        operator(cluster, "create", "ops-hold", "--memory", memory, "--device", "0")
        devs = wait_slice(cluster, f"GPU 0 left out at {memory} reserved",
                          lambda d: 0 not in d and 1 in d and d)
        assert quantity(devs[1]["capacity"]["memory"]["value"]) == 16 * GI
        assert quantity(devs[1]["capacity"]["compute"]["value"]) == 1000
    assert plugin_refusals(cluster) == []

    # The reservation gone, GPU 0 is back whole.
    operator(cluster, "rm", "ops-hold")
    devs = wait_slice(cluster, "GPU 0 back", lambda d: (
        0 in d and quantity(d[0]["capacity"]["compute"]["value"]) == 1000 and d))
    assert quantity(devs[0]["capacity"]["memory"]["value"]) == 16 * GI
    assert plugin_refusals(cluster) == []


def test_a_claim_goes_to_the_gpu_that_has_room(cluster, reservation, tmp_path):
    ns = "t-room"
    cluster.kubectl("create", "namespace", ns)
    try:
        operator(cluster, "create", "ops-hold", "--memory", "16128Mi", "--compute", "0.5",
                 "--device", "0")
        wait_slice(cluster, "GPU 0 left out", lambda d: 0 not in d and d)
        cluster.apply([w.claim_template("q", ns, "4Gi", 250),
                       w.pod("p", ns, ["--alloc", "1Gi", "--hold", 600], template="q")])
        cluster.wait_running(ns, "p")
        c = cluster.pod(ns, "p")["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        res = cluster.get("resourceclaim", c, ns)["status"]["allocation"]["devices"]["results"][0]
        gpu1 = devices_by_index(node_slice(cluster))[1]["name"]
        assert res["device"] == gpu1, res
    finally:
        cluster.delete("namespace", ns, timeout="180s")
