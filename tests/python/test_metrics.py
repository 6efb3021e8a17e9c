"""`gpuslice metrics` and the monitor's `/metrics` parse with a real Prometheus text parser
(`prometheus_client`) and agree with `gpuslice status --json`, with wrapped processes holding
memory in two slices on the fake GPU."""

import json
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import artifact
from helpers import Holder, wait_until

GI = 1 << 30
MI = 1 << 20


@pytest.fixture
def gpuslice(profile_dir):
    return artifact(profile_dir, "gpuslice")


def run(gpuslice, env, *args):
    p = subprocess.run([str(gpuslice), *args], env=env, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60)
    assert p.returncode == 0, f"gpuslice {args} exited {p.returncode}: {p.stderr}"
    return p.stdout


def families(text):
    """{family name: family} from Prometheus text; fails on anything the parser rejects."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams, family, labels, sample_name=None):
    """The one sample of `family` (named `sample_name`, default the family's) with `labels`."""
    f = fams[family]
    hits = [s for s in f.samples
            if s.name == (sample_name or family) and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, f"{family} {labels}: {hits}"
    return hits[0].value


def check_against_status(fams, st):
    assert sample(fams, "gpuslice_build_info", {}) == 1
    for d in st["devices"]:
        labels = dict(uuid=d["uuid"], index=str(d["index"]), name=d["name"])
        assert sample(fams, "gpuslice_device_memory_total_bytes", labels) == d["memory_total"]
        assert sample(fams, "gpuslice_device_memory_reserved_bytes", labels) == d["memory_reserved"]
        assert sample(fams, "gpuslice_device_memory_used_bytes", labels) == d["memory_used"]
        assert sample(fams, "gpuslice_device_compute_reserved_ratio", labels) == pytest.approx(d["compute_reserved"])
    for s in st["slices"]:
        labels = dict(slice=s["name"], device_uuid=s["device_uuid"])
        if s["memory_limit"] is None:  # best effort: no quota, no limit sample
            assert not [x for x in fams["gpuslice_slice_memory_limit_bytes"].samples
                        if x.labels["slice"] == s["name"]]
        else:
            assert sample(fams, "gpuslice_slice_memory_limit_bytes", labels) == s["memory_limit"]
        assert sample(fams, "gpuslice_slice_memory_used_bytes", labels) == s["memory_used"]
        assert sample(fams, "gpuslice_slice_compute_share_ratio", labels) == pytest.approx(s["compute_share"])
        assert sample(fams, "gpuslice_slice_compute_cap_ratio", labels) == pytest.approx(s["compute_cap"])
        assert 0 <= sample(fams, "gpuslice_slice_compute_used_ratio", labels) <= 1
        assert sample(fams, "gpuslice_slice_processes", labels) == len(s["pids"])
        # Counters: the parser names the family without `_total`, the sample with it.
        for c in ("allocations_denied", "launches", "throttled_seconds"):
            assert fams[f"gpuslice_slice_{c}"].type == "counter"
            assert sample(fams, f"gpuslice_slice_{c}", labels, f"gpuslice_slice_{c}_total") >= 0


def check_conventions(text, fams):
    for name, f in fams.items():
        assert name.startswith("gpuslice_"), name
        assert f.documentation, f"{name} has no HELP"
        assert f.type in ("gauge", "counter"), (name, f.type)
        if f.type == "gauge":
            assert name.endswith(("_bytes", "_ratio", "_info", "_processes", "_over_quota")), name
        for s in f.samples:
            if name.endswith("_ratio"):
                assert 0 <= s.value <= 1, s
    for line in text.splitlines():
        assert line.startswith(("# HELP gpuslice_", "# TYPE gpuslice_", "gpuslice_")), line


def test_metrics_parse_and_match_status(gpuslice, gpu_env, burn):
    env = gpu_env(memory="16Gi")
    wrapped = gpu_env(memory="16Gi", preload=True)
    run(gpuslice, env, "slice", "create", "op", "--memory", "2Gi", "--compute", "0.25", "--compute-cap", "0.5")
    monitor = subprocess.Popen([str(gpuslice), "monitor", "--metrics-listen", "127.0.0.1:0", "--interval", "100"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL)
    try:
        url = None
        while url is None:
            line = monitor.stderr.readline()
            assert line, "the monitor exited before serving metrics"
            url = next((w for w in line.split() if w.startswith("http://")), None)
        with Holder(burn, dict(wrapped, GPUSLICE_SLICE="op", GPUSLICE_MEMORY="8Gi"), "1Gi") as a, \
             Holder(burn, dict(wrapped, GPUSLICE_SLICE="b", GPUSLICE_MEMORY="1Gi"), "256Mi,128Mi") as b, \
             Holder(burn, dict(wrapped, GPUSLICE_SLICE="c"), "64Mi") as c:
            st = json.loads(run(gpuslice, env, "status", "--json"))
            names = {s["name"]: s for s in st["slices"]}
            assert names["op"]["memory_used"] == GI and names["op"]["memory_limit"] == 2 * GI, st
            assert names["b"]["memory_used"] == 384 * MI and names["b"]["pids"] == [b.pid], st
            assert names["op"]["pids"] == [a.pid], st
            assert names["c"]["memory_limit"] is None and names["c"]["memory_used"] == 64 * MI, st
            assert names["c"]["pids"] == [c.pid], st

            text = run(gpuslice, env, "metrics")
            fams = families(text)
            check_conventions(text, fams)
            check_against_status(fams, st)

            # The monitor serves the same numbers (plus its own facts) over HTTP.
            def scrape():
                with urllib.request.urlopen(url, timeout=10) as r:
                    assert r.status == 200
                    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                    return r.read().decode()
            served = wait_until(lambda: (lambda t: t if "gpuslice_monitor_reaped_processes_total" in t else None)(scrape()))
            fams = families(served)
            check_conventions(served, fams)
            check_against_status(fams, st)
            assert fams["gpuslice_monitor_reaped_processes"].type == "counter"
    finally:
        monitor.terminate()
        assert monitor.wait(timeout=30) == 0, "the monitor stops cleanly on SIGTERM"
