"""Fixtures of the cluster tests: a one-node Kubernetes cluster built from Kubernetes' own
components (scripts/cluster.sh up), gpuslice installed on it by its Helm chart
(scripts/cluster.sh install), driven with kubectl and real pods.

scripts/test.sh brings the cluster up and installs the chart before these tests run and takes
it down after; to run them by hand (as root):

    scripts/cluster.sh up && scripts/cluster.sh install
    .venv/bin/python -m pytest tests/cluster
    scripts/cluster.sh down
"""

import os
import pathlib
import subprocess

import pytest

from kube import Cluster

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cluster():
    if os.geteuid() != 0:
        pytest.fail("the cluster tests need root (scripts/cluster.sh runs a kubelet)")
    env = subprocess.run(
        ["bash", str(ROOT / "scripts/cluster.sh"), "env"], capture_output=True, text=True, check=True
    ).stdout
    c = Cluster.from_env_line(env, ROOT)
    c.check_up()
    return c


@pytest.fixture
def ns(cluster, request):
    """A namespace of the test's own (named after it), removed with all in it at the end."""
    name = "t-" + request.node.name.replace("_", "-")[:50].rstrip("-")
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.delete("namespace", name, timeout="180s")
