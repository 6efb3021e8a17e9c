"""The Helm chart (deploy/helm/gpuslice) is the one source of what gets installed: `helm lint
--strict` passes with the default values and with the cluster's, its schema refuses bad values
before anything reaches the cluster, the plain manifests in deploy/ are its rendering
(scripts/render-manifests.sh --check), and the real API server takes what it renders
(server-side dry run: validated and admitted, nothing stored).

What the rendered objects say (types, the plugin's and the monitor's flags) is checked without a
cluster by k8s/tests/deploy.rs."""

import os
import pathlib
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]

CHART = "deploy/helm/gpuslice"
RELEASE, NAMESPACE = "gpuslice", "gpuslice-system"
FAKE_VALUES = "tests/cluster/values-fake.yaml"


def helm(cluster, *args, check=True):
    p = subprocess.run([str(cluster.bin / "helm"), *args], capture_output=True, text=True,
                       cwd=ROOT, env=cluster.env, timeout=120)
    if check:
        assert p.returncode == 0, f"helm {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p


def template(cluster, *args):
    """The chart's objects for these values, hooks included, as parsed YAML."""
    out = helm(cluster, "template", RELEASE, CHART, "--namespace", NAMESPACE, *args).stdout
    return out, [d for d in yaml.safe_load_all(out) if d]


def one(objs, kind):
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"{kind}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("values", [[], ["-f", FAKE_VALUES],
                                    ["--set", "metrics.serviceMonitor.enabled=true",
                                     "--set", "cleanupOnUninstall=false,ownNodePolicy=false",
                                     "--set", "deviceClass.create=false,metrics.enabled=true"]],
                         ids=["defaults", "values-fake", "other-switches"])
def test_helm_lint_strict(cluster, values):
    p = helm(cluster, "lint", "--strict", CHART, *values)
    assert "0 chart(s) failed" in p.stdout, p.stdout
    assert "[WARNING]" not in p.stdout and "[ERROR]" not in p.stdout, p.stdout


@pytest.mark.parametrize("value, says", [
    ("monitor.onViolation=kil", "/monitor/onViolation"),
    ("plugin.resync=0", "/plugin/resync"),
    ("nodeselector.gpu=yes", "'nodeselector' not allowed"),
    ("metrics.port=70000", "/metrics/port"),
    ("plugin.nvidiaCdiName=name", "/plugin/nvidiaCdiName"),
    ("hostRuntimeDir=dev/shm/gpuslice", "/hostRuntimeDir"),
    ("monitor.balloons=maybe", "/monitor/balloons"),
])
def test_the_schema_refuses_bad_values_by_name(cluster, value, says):
    p = helm(cluster, "template", RELEASE, CHART, "--set", value, check=False)
    assert p.returncode != 0, f"--set {value} was rendered:\n{p.stdout}"
    assert says in p.stderr, p.stderr


def test_a_service_monitor_without_the_service_is_refused(cluster):
    p = helm(cluster, "template", RELEASE, CHART, "--set",
             "metrics.serviceMonitor.enabled=true,metrics.service=false", check=False)
    assert p.returncode != 0 and "metrics.serviceMonitor.enabled needs" in p.stderr, p.stderr


def test_the_plain_manifests_are_the_charts_rendering(cluster):
    p = subprocess.run(["bash", "scripts/render-manifests.sh", "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HELM": str(cluster.bin / "helm")})
    assert p.returncode == 0, p.stderr


def test_the_api_server_takes_the_rendering(cluster):
    """`kubectl apply --dry-run=server --validate=strict`: the plain manifests (what `kubectl
    apply -f deploy/gpuslice.yaml` would send, the cleanup Job's too) and the chart rendered
    with the cluster's values, hooks included, against the installed release."""
    assert cluster.exists("namespace", NAMESPACE), \
        f"no namespace {NAMESPACE}: install the chart first (scripts/cluster.sh install)"
    for f in ["deploy/gpuslice.yaml", "deploy/cleanup.yaml"]:
        p = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", str(ROOT / f))
        assert "(server dry run)" in p.stdout, p.stdout
    out, objs = template(cluster, "-f", FAKE_VALUES)
    p = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", input=out)
    assert p.stdout.count("(server dry run)") == len(objs), p.stdout


def test_the_service_monitor_scrapes_the_monitors(cluster):
    """Rendered, not applied: the cluster has no Prometheus Operator CRDs. The ServiceMonitor
    selects the metrics Service by its port name, and the Service the DaemonSet's pods (not the
    cleanup Job's)."""
    _, objs = template(cluster, "--set", "metrics.serviceMonitor.enabled=true",
                       "--set", "metrics.serviceMonitor.labels.release=prometheus",
                       "--set", "metrics.serviceMonitor.interval=15s,metrics.port=9500")
    sm, svc, ds, job = (one(objs, k) for k in ["ServiceMonitor", "Service", "DaemonSet", "Job"])
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["namespace"] == NAMESPACE
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert selects(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    [endpoint] = sm["spec"]["endpoints"]
    [port] = svc["spec"]["ports"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "15s"
    assert port["port"] == 9500
    pod = ds["spec"]["template"]
    assert selects(svc["spec"]["selector"], pod["metadata"]["labels"])
    assert not selects(svc["spec"]["selector"], job["spec"]["template"]["metadata"]["labels"])
    assert not selects(ds["spec"]["selector"]["matchLabels"],
                       job["spec"]["template"]["metadata"]["labels"])
    monitor = next(c for c in pod["spec"]["containers"] if c["name"] == "monitor")
    assert {"name": port["targetPort"], "containerPort": 9500} in monitor["ports"]
    assert "--metrics-listen=0.0.0.0:9500" in monitor["args"]


def test_metrics_off_renders_no_listener_and_no_service(cluster):
    _, objs = template(cluster, "--set", "metrics.enabled=false")
    assert not [o for o in objs if o["kind"] in ("Service", "ServiceMonitor")]
    monitor = next(c for c in one(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "monitor")
    assert not any(a.startswith("--metrics-listen") for a in monitor["args"]), monitor["args"]
    assert "ports" not in monitor

