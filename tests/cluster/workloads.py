"""The objects the cluster tests create: claims and pods built from deploy/example.yaml, so the
tests run what the docs tell users to apply."""

import copy
import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGE = "localhost/gpuslice:dev"


def example_objects():
    return list(yaml.safe_load_all((ROOT / "deploy/example.yaml").read_text()))


def claim_template(name, ns, memory, compute=None, gpu_index=None):
    """A ResourceClaimTemplate of class gpuslice.dev consuming `memory` (and `compute`)."""
    requests = {"memory": memory}
    if compute is not None:
        requests["compute"] = str(compute)
    exactly = {"deviceClassName": "gpuslice.dev", "capacity": {"requests": requests}}
    if gpu_index is not None:
        exactly["selectors"] = [
            {"cel": {"expression": f'device.attributes["gpuslice.dev"].index == {gpu_index}'}}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def claim(name, ns, memory, compute=None, gpu_index=None):
    """A ResourceClaim (shared by whoever names it) with the same request."""
    t = claim_template(name, ns, memory, compute, gpu_index)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": t["metadata"], "spec": t["spec"]["spec"]}


def pod(name, ns, args, template=None, claim_name=None, user=1000, command=("gpuslice-burn",),
        containers=1):
    """A pod of `containers` containers running `command args` in gpuslice's image, each using
    the pod's one claim (from `template`, or the existing claim `claim_name`)."""
    ref = {"name": "gpu"}
    if template:
        ref["resourceClaimTemplateName"] = template
    else:
        ref["resourceClaimName"] = claim_name
    cs = []
    for i in range(containers):
        cs.append({
            "name": "burn" if containers == 1 else f"burn-{i}",
            "image": IMAGE,
            "imagePullPolicy": "Never",
            "command": list(command),
            "args": [str(a) for a in args],
            "resources": {"claims": [{"name": "gpu"}]},
        })
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsUser": user, "runAsNonRoot": True},
            "resourceClaims": [ref],
            "containers": cs,
        },
    }


def from_example(name, args=None, ns="default"):
    """One of deploy/example.yaml's pods with the cluster's image (and other `args`)."""
    for o in example_objects():
        if o["kind"] == "Pod" and o["metadata"]["name"] == name:
            o = copy.deepcopy(o)
            o["metadata"]["namespace"] = ns
            c = o["spec"]["containers"][0]
            c["image"] = IMAGE
            c["imagePullPolicy"] = "Never"
            if args is not None:
                c["args"] = [str(a) for a in args]
            return o
    raise KeyError(name)


def example_templates(ns="default"):
    out = []
    for o in example_objects():
        if o["kind"] == "ResourceClaimTemplate":
            o = copy.deepcopy(o)
            o["metadata"]["namespace"] = ns
            out.append(o)
    return out
