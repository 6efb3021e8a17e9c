"""Uninstalling the chart leaves nothing of the driver in the API: its pods, its ResourceSlice
(each plugin deletes its node's at a clean stop, the pre-delete hook every one left), its
DeviceClass. Runs last (the file name); installs the chart again after, so the cluster is left
as it was found."""

import subprocess


def test_uninstall_leaves_no_resource_slice(cluster):
    assert [s for s in cluster.resource_slices() if s["spec"]["driver"] == "gpuslice.dev"]
    cluster.helm("uninstall", "gpuslice", "--namespace", "gpuslice-system", "--wait",
                 "--timeout", "3m", timeout=300)
    cluster.wait_until("the driver's pods gone", lambda: not cluster.get(
        "pods", ns="gpuslice-system", selector="app.kubernetes.io/name=gpuslice")["items"],
        timeout=120)
    left = [s["metadata"]["name"] for s in cluster.resource_slices()
            if s["spec"]["driver"] == "gpuslice.dev"]
    assert left == [], left
    assert not cluster.exists("deviceclass", "gpuslice.dev")
    assert not cluster.exists("job", "gpuslice-cleanup", "gpuslice-system")
    # Back, for whoever uses the cluster next.
    subprocess.run(["bash", str(cluster.root / "scripts/cluster.sh"), "install"], check=True,
                   timeout=600)
    cluster.wait_until("the ResourceSlice back", lambda: [
        s for s in cluster.resource_slices() if s["spec"]["driver"] == "gpuslice.dev"], timeout=120)
