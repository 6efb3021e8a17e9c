"""Pods that claim slices on the real cluster: placed by kube-scheduler's own allocator, prepared
by the plugin through the kubelet, held by gpuslice inside the pods.

Shares are read from the fake GPU's own books: gpuslice-burn's per-second kernel count times
the kernel length is exactly the simulated engine time the fake gave the process
(tests/burn/src/load.rs). The window compared is one both pods were launching in throughout,
found from the CLOCK_MONOTONIC stamps of their lines (one clock for the whole node).
"""

import json


import workloads as w
from kube import quantities



def slice_of(status, claim):
    """The gpuslice slice of a claim ("namespace/name") in `gpuslice status --json`."""
    for s in status["slices"]:
        if s.get("claim") == claim:
            return s
    return None


def allocation(cluster, ns, pod):
    """The claim (namespace/name) and its allocation result of a pod's one claim."""
    p = cluster.pod(ns, pod)
    names = p["status"].get("resourceClaimStatuses") or []
    assert names, f"pod {ns}/{pod} has no claim status: {json.dumps(p['status'])}"
    claim_name = names[0]["resourceClaimName"]
    c = cluster.get("resourceclaim", claim_name, ns)
    results = c["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1, results
    return f"{ns}/{claim_name}", results[0]


def window_fraction(lines, start, end):
    """GPU fraction over [start, end] (monotonic seconds) from burn's interval lines."""
    got = 0.0
    for ln in lines:
        if ln.get("event") == "interval" and start < ln["mono"] <= end:
            got += ln["gpu_seconds"]
    return got / (end - start)


def test_example_pods_are_held_to_their_memory_and_share(cluster, ns):
    cluster.apply(w.example_templates(ns))
    # deploy/example.yaml's two pods, for 30 s instead of 600, with a second allocation that
    # passes each one's quota.
    a = w.from_example("gpuslice-example-quarter", ns=ns, args=[
        "--alloc", "3Gi,2Gi", "--seconds", 30, "--kernel-us", 1000, "--report-interval", 1,
        "--json"])
    b = w.from_example("gpuslice-example-three-quarters", ns=ns, args=[
        "--alloc", "6Gi,3Gi", "--seconds", 30, "--kernel-us", 1000, "--report-interval", 1,
        "--json"])
    cluster.apply([a, b])
    for p in (a, b):
        cluster.wait_running(ns, p["metadata"]["name"])

    # Placed on one GPU by the scheduler, with what each claimed.
    ca, ra = allocation(cluster, ns, "gpuslice-example-quarter")
    cb, rb = allocation(cluster, ns, "gpuslice-example-three-quarters")
    assert ra["device"] == rb["device"], (ra, rb)
    # consumedCapacity as kube-scheduler writes it: the capacity names, bare (the plugin's
    # reading, k8s/src/claims.rs).
    assert quantities(ra["consumedCapacity"]) == {"memory": 4 << 30, "compute": 250}, ra
    assert quantities(rb["consumedCapacity"]) == {"memory": 8 << 30, "compute": 750}, rb

    # gpuslice on the node names each slice by its claim, with the claimed quota and share.
    st = cluster.wait_until("both claims' slices in gpuslice status", lambda: (
        (s := cluster.gpuslice_status()) and slice_of(s, ca) and slice_of(s, cb) and s))
    sa, sb = slice_of(st, ca), slice_of(st, cb)
    assert sa["memory_limit"] == 4 << 30 and sb["memory_limit"] == 8 << 30, (sa, sb)
    assert abs(sa["compute_share"] - 0.25) < 1e-9 and abs(sb["compute_share"] - 0.75) < 1e-9

    for p in (a, b):
        cluster.wait_pod_phase(ns, p["metadata"]["name"], ("Succeeded", "Failed"), timeout=120)
    la = cluster.json_lines(ns, "gpuslice-example-quarter")
    lb = cluster.json_lines(ns, "gpuslice-example-three-quarters")
    for name, lines in (("quarter", la), ("three-quarters", lb)):
        assert lines, f"no JSON from gpuslice-example-{name}:\n" + cluster.logs(
            ns, f"gpuslice-example-{name}") + cluster.describe("pod", f"gpuslice-example-{name}", ns)
    ra_, rb_ = la[-1], lb[-1]
    assert ra_["error"] is None and rb_["error"] is None, (ra_, rb_)
    # Memory: the allocation past the quota is CUDA_ERROR_OUT_OF_MEMORY inside the pod.
    assert [x["ok"] for x in ra_["allocs"]] == [True, False], ra_["allocs"]
    assert ra_["alloc_error_names"] == ["CUDA_ERROR_OUT_OF_MEMORY"], ra_
    assert [x["ok"] for x in rb_["allocs"]] == [True, False], rb_["allocs"]
    assert ra_["mem_total"] <= 4 << 30 and rb_["mem_total"] <= 8 << 30

    # Shares over a 10 s window both were launching in.
    ia = [x for x in la if x.get("event") == "interval"]
    ib = [x for x in lb if x.get("event") == "interval"]
    start = max(ia[0]["mono"], ib[0]["mono"]) + 2
    end = min(ia[-1]["mono"], ib[-1]["mono"]) - 1
    assert end - start >= 10, f"the two pods overlapped only {end - start:.1f} s"
    end = start + 10
    fa, fb = window_fraction(la, start, end), window_fraction(lb, start, end)
    print(f"shares over 10 s: quarter {fa:.3f}, three-quarters {fb:.3f}")
    assert 0.24 <= fa <= 0.26, fa
    assert 0.74 <= fb <= 0.76, fb


def test_a_claim_that_does_not_fit_waits_for_the_scheduler(cluster, ns):
    # Pin to GPU 0 so the third claim cannot go to another GPU.
    cluster.apply([
        w.claim_template("big", ns, "12Gi", 500, gpu_index=0),
        w.claim_template("more", ns, "8Gi", 250, gpu_index=0),
    ])
    hold = ["--alloc", "1Gi", "--hold", 600]
    cluster.apply([w.pod("first", ns, hold, template="big")])
    cluster.wait_running(ns, "first")
    cluster.apply([w.pod("second", ns, hold, template="more", user=1001)])

    def pending_reason():
        p = cluster.pod(ns, "second")
        conds = {c["type"]: c for c in p["status"].get("conditions", [])}
        c = conds.get("PodScheduled")
        return c if c and c["status"] == "False" and c.get("reason") == "Unschedulable" else None

    c = cluster.wait_until("the second pod unschedulable", pending_reason, timeout=60)
    print("scheduler:", c["message"])
    # The scheduler's own words: the devices of the claim's class cannot satisfy it.
    assert "cannot allocate all claims" in c["message"] or "resourceclaim" in c["message"].lower(), c
    # Nothing was prepared for it: no slice of its claim on the node.
    assert cluster.pod(ns, "second")["status"]["phase"] == "Pending"

    cluster.delete("pod", "first", ns)
    cluster.wait_running(ns, "second", timeout=120)
    claim, res = allocation(cluster, ns, "second")
    assert quantities(res["consumedCapacity"]) == {"memory": 8 << 30, "compute": 250}, res


def test_two_containers_of_one_pod_are_one_slice_and_exec_is_held(cluster, ns):
    cluster.apply([w.claim_template("shared", ns, "4Gi", 100)])
    # Each container holds 1 GiB and its context (512 MiB on the 16 GiB fake, charged inside
    # the quota): together 3 of the claim's 4 GiB.
    p = w.pod("pair", ns, ["--alloc", "1Gi", "--hold", 600], template="shared", containers=2)
    cluster.apply([p])
    cluster.wait_running(ns, "pair")
    claim, _ = allocation(cluster, ns, "pair")

    def both_held():
        s = slice_of(cluster.gpuslice_status(), claim)
        return s if s and len(s["pids"]) == 2 and s["memory_used"] >= 3 << 30 else None

    s = cluster.wait_until("both containers in the claim's slice", both_held, timeout=60)
    assert s["memory_limit"] == 4 << 30
    assert sum(1 for x in cluster.gpuslice_status()["slices"] if x.get("claim") == claim) == 1

    # A kubectl exec shell in one container: the slice's quota less what the two hold (its own
    # context takes 512 MiB of the last GiB).
    r = cluster.exec(ns, "pair", ["gpuslice-burn", "--alloc", "256Mi,1Gi", "--json"],
                     container="burn-0")
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert [a["ok"] for a in rep["allocs"]] == [True, False], rep["allocs"]
    assert rep["alloc_error_names"] == ["CUDA_ERROR_OUT_OF_MEMORY"]
    # ... and one that clears its environment (env -i) is held the same way (/etc/ld.so.preload
    # and the claim's settings file, put there by the claim's CDI spec).
    r = cluster.exec(ns, "pair", ["env", "-i", "/usr/bin/gpuslice-burn", "--alloc", "256Mi,1Gi",
                                  "--json"], container="burn-1")
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert [a["ok"] for a in rep["allocs"]] == [True, False], rep["allocs"]
