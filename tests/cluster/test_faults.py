"""Faults on the real cluster while pods hold slices: the driver's pod replaced, the kubelet
restarted, the monitor killed, a pod deleted mid-run; and the device health the kubelet shows.

Each test starts a pod that holds memory in its claim's slice and checks, after the fault, that
the pod still runs, its slice is still held to its quota (an allocation past it still fails
inside the pod), and a new claim can be prepared."""

import json
import os
import pathlib
import signal
import subprocess
import time


import workloads as w
from test_placement import allocation, slice_of

GI = 1 << 30



def start_holder(cluster, ns, name="holder", memory="4Gi", hold="2Gi"):
    cluster.apply([w.claim_template(f"{name}-claim", ns, memory, 100),
                   w.pod(name, ns, ["--alloc", hold, "--hold", 900], template=f"{name}-claim")])
    cluster.wait_running(ns, name)
    claim, _ = allocation(cluster, ns, name)
    cluster.wait_until(f"{name}'s slice holds {hold}", lambda: (
        (s := slice_of(cluster.gpuslice_status(), claim)) and s["memory_used"] >= 2 * GI and s))
    return claim


def still_held(cluster, ns, pod, claim, limit=4 * GI):
    """The pod runs, its slice keeps its quota, and the quota still binds inside the pod."""
    assert cluster.pod(ns, pod)["status"]["phase"] == "Running"
    # After a restart the kubelet takes a moment to serve exec again ("pod does not exist").
    s = cluster.wait_until("gpuslice status through kubectl exec", lambda: slice_of(
        cluster.gpuslice_status(), claim), timeout=60)
    assert s and s["memory_limit"] == limit, s
    r = cluster.wait_until("an exec in the pod", lambda: cluster.exec(
        ns, pod, ["gpuslice-burn", "--alloc", "1Gi,2Gi", "--json"]), timeout=60)
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert [a["ok"] for a in rep["allocs"]] == [True, False], rep["allocs"]


def new_pod_runs(cluster, ns, name):
    cluster.apply([w.claim_template(f"{name}-claim", ns, "1Gi", 50),
                   w.pod(name, ns, ["--alloc", "512Mi", "--hold", 600], template=f"{name}-claim",
                         user=1001)])
    cluster.wait_running(ns, name, timeout=240)


def health_of(cluster, ns, pod):
    """The device health the kubelet reports in the pod's status (ResourceHealthStatus)."""
    st = cluster.pod(ns, pod)["status"]
    out = []
    for c in st.get("containerStatuses", []):
        for r in c.get("allocatedResourcesStatus") or []:
            for res in r.get("resources") or []:
                out.append(res.get("health"))
    return out


def allocated_status(cluster, ns, pod):
    """`kubectl get pod -o jsonpath=...allocatedResourcesStatus` (kubectl describe does not
    print it in 1.37)."""
    return cluster.kubectl("get", "pod", pod, "-n", ns, "-o", "jsonpath={.status.containerStatuses"
                           "[*].allocatedResourcesStatus}").stdout


def cluster_sh(cluster, *args):
    subprocess.run(["bash", str(cluster.root / "scripts/cluster.sh"), *args], check=True,
                   timeout=300)


def test_the_drivers_pod_replaced_while_pods_run(cluster, ns):
    claim = start_holder(cluster, ns)
    old = cluster.driver_pod()
    cluster.kubectl("-n", "gpuslice-system", "delete", "pod", old, "--wait=true", timeout=300)
    cluster.wait_until("a new gpuslice pod running", lambda: (
        (p := cluster.driver_pod()) != old and p), timeout=180)
    cluster.kubectl("-n", "gpuslice-system", "rollout", "status", "ds/gpuslice", "--timeout=180s")
    still_held(cluster, ns, "holder", claim)
    # A second pod naming the same claim: the kubelet prepares it again; the new plugin answers
    # from the ledger and the CDI directory, changing nothing.
    c = cluster.pod(ns, "holder")["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    cluster.apply([w.pod("twin", ns, ["--alloc", "1Gi", "--hold", 600], claim_name=c)])
    cluster.wait_running(ns, "twin")
    s = cluster.wait_until("both in one slice", lambda: (
        (s := slice_of(cluster.gpuslice_status(), claim)) and len(s["pids"]) == 2 and s))
    assert s["memory_limit"] == 4 * GI
    assert sum(1 for x in cluster.gpuslice_status()["slices"] if x.get("claim") == claim) == 1


def test_the_kubelet_restarted(cluster, ns):
    claim = start_holder(cluster, ns)
    cluster_sh(cluster, "restart", "kubelet")
    cluster.kubectl("wait", "--for=condition=Ready", "node/gpuslice-node", "--timeout=120s")
    still_held(cluster, ns, "holder", claim)
    new_pod_runs(cluster, ns, "after")


def monitor_pid(cluster):
    """The host pid of the node's `gpuslice monitor` (the driver's pod has hostPID)."""
    out = cluster.exec("gpuslice-system", cluster.driver_pod(),
                       ["sh", "-c", "for p in /proc/[0-9]*; do "
                        "c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); "
                        "case \"$c\" in 'gpuslice monitor '*) echo ${p#/proc/};; esac; done"],
                       container="plugin").stdout.split()
    assert len(out) == 1, out
    return int(out[0])


def test_the_monitor_killed(cluster, ns):
    claim = start_holder(cluster, ns)
    cluster.wait_until("the device healthy in the pod's status",
                       lambda: health_of(cluster, ns, "holder") == ["Healthy"], timeout=90)
    # Killed, and killed again as it comes back, until the kubelet backs off (CrashLoopBackOff):
    # the monitor stays down for tens of seconds.
    down_since = time.monotonic()
    for _ in range(3):
        pid = monitor_pid(cluster)
        os.kill(pid, signal.SIGKILL)
        cluster.wait_until("the monitor restarted", lambda: (
            (p := _maybe(lambda: monitor_pid(cluster))) and p != pid), timeout=120)
    os.kill(monitor_pid(cluster), signal.SIGKILL)
    # Health turns the GPU unhealthy (the plugin's health stream; kubelet -> pod status).
    cluster.wait_until("the device unhealthy in the pod's status",
                       lambda: health_of(cluster, ns, "holder") == ["Unhealthy"], timeout=60)
    print("allocatedResourcesStatus while the monitor is down:", allocated_status(cluster, ns,
                                                                               "holder"))
    # A new claim waits (prepare refused, retried by the kubelet), the old pod keeps its quota.
    cluster.apply([w.claim_template("late-claim", ns, "1Gi", 50),
                   w.pod("late", ns, ["--alloc", "512Mi", "--hold", 600], template="late-claim")])
    time.sleep(5)
    if _maybe(lambda: monitor_pid(cluster)) is None:
        assert cluster.pod(ns, "late")["status"]["phase"] == "Pending"
        ev = cluster.events(ns, "late")
        print("events of the waiting pod:", ev)
        assert any("monitor does not answer" in e for e in ev), ev
        # A new process in a running pod is not admitted without the monitor: it fails at
        # cuInit with a message saying so, and takes nothing.
        r = cluster.exec(ns, "holder", ["gpuslice-burn", "--alloc", "1Gi", "--json"],
                         check=False)
        assert r.returncode != 0 and "monitor did not answer" in r.stderr, (r.stdout, r.stderr)
    # The running process kept its memory (and its slice its quota) through the outage.
    assert cluster.pod(ns, "holder")["status"]["phase"] == "Running"
    # All back when it returns.
    cluster.wait_running(ns, "late", timeout=300)
    cluster.wait_until("the device healthy again",
                       lambda: health_of(cluster, ns, "holder") == ["Healthy"], timeout=120)
    print(f"monitor down to all back: {time.monotonic() - down_since:.0f} s")
    still_held(cluster, ns, "holder", claim)


def _maybe(f):
    try:
        return f()
    except Exception:
        return None


def test_a_pod_deleted_mid_run_leaves_nothing(cluster, ns):
    before = cluster.gpuslice_status()
    claim = start_holder(cluster, ns)
    uid = cluster.get("resourceclaim", claim.split("/")[1], ns)["metadata"]["uid"]
    spec = f"/var/run/cdi/gpuslice.dev-slice_k8s-{uid}.json"
    assert os.path.exists(spec)
    cluster.delete("pod", "holder", ns)
    cluster.wait_until("the claim's slice gone", lambda: slice_of(cluster.gpuslice_status(), claim)
                       is None, timeout=120)
    assert not os.path.exists(spec)
    after = cluster.gpuslice_status()
    used = {d["uuid"]: d["memory_used"] for d in after["devices"]}
    assert used == {d["uuid"]: d["memory_used"] for d in before["devices"]}, (before, after)
    assert not [p for p in after["processes"] if p.get("slice", "").startswith("k8s-")
                and not any(s["name"] == p["slice"] for s in before["slices"])]


def fake_client(cluster, *args):
    """`fakegpu-client` on the host, against the node's fake driver (its state in /run/fakegpu):
    what an XID 79 is to a real node."""
    libs = subprocess.run(["bash", str(cluster.root / "scripts/fakegpu.sh")], capture_output=True,
                          text=True, check=True).stdout.strip().splitlines()[-1]
    client = pathlib.Path(libs).parent / "fakegpu-client"
    env = {"FAKEGPU_STATE_DIR": "/run/fakegpu", "LD_LIBRARY_PATH": libs, "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(client), *args], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout


def test_a_gpu_that_is_gone_is_tainted_and_unhealthy(cluster, ns):
    # A pod on GPU 1; then GPU 1 falls off the bus.
    cluster.apply([w.claim_template("one", ns, "2Gi", 100, gpu_index=1),
                   w.pod("on-one", ns, ["--alloc", "512Mi", "--hold", 900], template="one")])
    cluster.wait_running(ns, "on-one")
    cluster.wait_until("GPU 1 healthy in the pod's status",
                       lambda: health_of(cluster, ns, "on-one") == ["Healthy"], timeout=90)
    fake_client(cluster, "lose", "1")
    try:
        def tainted():
            for s in cluster.resource_slices():
                for d in s["spec"]["devices"]:
                    if d["attributes"]["index"]["int"] == 1 and d.get("taints"):
                        return d
            return None

        d = cluster.wait_until("GPU 1 tainted in the ResourceSlice", tainted, timeout=60)
        print("the gone GPU as published:", json.dumps(d["taints"]))
        assert d["taints"][0]["key"] == "gpuslice.dev/gone", d
        assert d["taints"][0]["effect"] == "NoSchedule", d
        cluster.wait_until("GPU 1 unhealthy in the pod's status",
                           lambda: health_of(cluster, ns, "on-one") == ["Unhealthy"], timeout=90)
        print("allocatedResourcesStatus, the GPU gone:", allocated_status(cluster, ns, "on-one"))
        # kube-scheduler places no new claim on it: pinned there, a claim waits.
        cluster.apply([w.claim_template("pinned", ns, "1Gi", 50, gpu_index=1),
                       w.pod("wants-one", ns, ["--alloc", "256Mi", "--hold", 600],
                             template="pinned", user=1001)])

        def unschedulable():
            conds = {c["type"]: c for c in cluster.pod(ns, "wants-one")["status"].get(
                "conditions", [])}
            c = conds.get("PodScheduled")
            return c if c and c["status"] == "False" else None

        c = cluster.wait_until("the pod for the gone GPU unschedulable", unschedulable, timeout=60)
        print("scheduler:", c.get("message"))
    finally:
        fake_client(cluster, "restore", "1")
    cluster.wait_until("the taint gone", lambda: tainted() is None, timeout=60)
    cluster.wait_running(ns, "wants-one", timeout=180)
