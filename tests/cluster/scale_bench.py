#!/usr/bin/env python3
"""Kubernetes scale by simulation: the cluster's real kube-apiserver and kube-scheduler place
pods with gpuslice claims on N simulated GPU nodes, and this measures how fast and how full.

A simulated node has no kubelet: it is a Node object (Ready, its Lease in kube-node-lease
renewed every 10 s by one thread here, as kwok does, so the node lifecycle controller keeps it
Ready), tainted `gpuslice.dev/sim=true:NoSchedule` and labelled `gpuslice.dev/sim=true` so
that nothing but this benchmark's pods lands there, plus the ResourceSlice that the real
`gpuslice-dra slice` prints for it (the fake GPU configured with --gpus devices of
--gpu-memory). Pods are bound by the scheduler and never run.

Two workloads of the same pods (one claim each, sizes drawn with a fixed seed):
- shared: class gpuslice.dev, `memory` uniform in 1..16 Gi (whole Gi), `compute` uniform in
  100..1000 (steps of 100): placed by the scheduler's consumable-capacity allocator on the
  shareable devices the plugin publishes;
- whole: the same pods, each claiming one whole device of the same GPUs, published by a
  second driver (`whole.<driver>`) as plain, non-shareable devices.

Measured per workload: pods created per second, pods scheduled per second (bindings seen on
a watch), scheduling latency, the pods left Pending and the scheduler's reason, and how full
the GPUs get (memory and compute placed / capacity; for shared from the claims' allocations,
`consumedCapacity`, checked per device against capacity). Everything created is labelled
`gpuslice.dev/scale-bench` and removed at the end, also on failure or Ctrl-C;
`--cleanup` removes what a killed run left.

    eval "$(scripts/cluster.sh env)"
    python3 tests/cluster/scale_bench.py --nodes 100 --gpus 8 --pods 2000

It needs `target/release/gpuslice-dra` and `target/release/libfakegpu.so`
(`cargo build --release -p gpuslice-dra -p fakegpu`). docs/cluster.md says more.
"""

import argparse
import concurrent.futures
import datetime
import fractions
import http.client
import json
import os
import pathlib
import random
import shlex
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
LABEL = "gpuslice.dev/scale-bench"
SIM = "gpuslice.dev/sim"
NAMESPACE = "gpuslice-scale"
RESOURCE = "/apis/resource.k8s.io/v1"
GI = 1 << 30
# scripts/cluster.sh's state: the components' pid files and logs (read only).
STATE = pathlib.Path(os.environ.get("GPUSLICE_CLUSTER_STATE", "/var/lib/gpuslice-cluster"))


def log(msg):
    print(f"scale_bench: {msg}", file=sys.stderr, flush=True)


# --- quantities ---------------------------------------------------------------------------

SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
            "n": fractions.Fraction(1, 10**9), "u": fractions.Fraction(1, 10**6),
            "m": fractions.Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9,
            "T": 10**12, "P": 10**15, "E": 10**18}


def quantity(q):
    """A Kubernetes resource.Quantity string as a Fraction ("4Gi", "250", "1.5", "1e3")."""
    q = str(q).strip()
    for s in sorted(SUFFIXES, key=len, reverse=True):
        if q.endswith(s):
            return fractions.Fraction(q[: -len(s)]) * SUFFIXES[s]
    if "e" in q:
        m, e = q.split("e", 1)
        return fractions.Fraction(m) * fractions.Fraction(10) ** int(e)
    return fractions.Fraction(q)


# --- the API, directly --------------------------------------------------------------------

class ApiError(Exception):
    def __init__(self, method, path, status, body):
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


class Api:
    """The API server with the kubeconfig's client certificate; one keep-alive connection per
    thread."""

    def __init__(self, kubeconfig):
        cfg = yaml.safe_load(pathlib.Path(kubeconfig).read_text())
        ctx_name = cfg.get("current-context")
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self._tmp = tempfile.TemporaryDirectory(prefix="scale-bench-pki-")

        def path_of(d, key):
            if d.get(key):
                return d[key]
            if d.get(key + "-data"):
                import base64

                p = pathlib.Path(self._tmp.name) / key
                p.write_bytes(base64.b64decode(d[key + "-data"]))
                return str(p)
            raise SystemExit(f"scale_bench: {kubeconfig}: no {key} (a client certificate is "
                             "needed: the admin kubeconfig of scripts/cluster.sh has one)")

        u = urllib.parse.urlparse(cluster["server"])
        self.host, self.port = u.hostname, u.port or 443
        self.ssl = ssl.create_default_context(cafile=path_of(cluster, "certificate-authority"))
        self.cert = (path_of(user, "client-certificate"), path_of(user, "client-key"))
        self.ssl.load_cert_chain(*self.cert)
        self._local = threading.local()

    def connect(self, timeout=60):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ssl, timeout=timeout)

    def request(self, method, path, body=None, content_type="application/json", ok=(),
                retries=5):
        """Returns the decoded answer; None for a status in `ok` (e.g. 404 on delete)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in range(retries + 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self.connect()
            try:
                conn.request(method, path, body=data, headers=headers)
                r = conn.getresponse()
                raw = r.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == retries:
                    raise
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status == 429 or (r.status >= 500 and attempt < retries):
                time.sleep(float(r.getheader("Retry-After") or 0.5))
                continue
            if r.status in ok:
                return None
            if r.status >= 300:
                raise ApiError(method, path, r.status, raw.decode(errors="replace"))
            return json.loads(raw) if raw else None
        raise ApiError(method, path, r.status, raw.decode(errors="replace"))

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def create(self, path, obj):
        return self.request("POST", path, obj)

    def patch(self, path, obj, kind="merge"):
        return self.request("PATCH", path, obj, content_type=f"application/{kind}-patch+json")

    def delete(self, path, grace=None):
        body = None if grace is None else {"kind": "DeleteOptions", "apiVersion": "v1",
                                          "gracePeriodSeconds": grace}
        return self.request("DELETE", path, body, ok=(404,))

    def list(self, path, selector=None):
        q = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        return self.get(path + q)


class RateLimit:
    """At most `qps` requests a second across the threads that share it (a token bucket of
    one second's worth): the benchmark must not starve the control plane it measures (an API
    server that answers kube-scheduler's leader-lease renewal after its 5 s timeout makes the
    scheduler exit)."""

    def __init__(self, qps):
        self.qps = qps
        self.lock = threading.Lock()
        self.next = time.monotonic()

    def wait(self):
        if self.qps <= 0:
            return
        with self.lock:
            now = time.monotonic()
            self.next = max(self.next, now - 1.0) + 1.0 / self.qps
            delay = self.next - now
        if delay > 0:
            time.sleep(delay)


def scheduler_alive(api, max_age=30):
    """Whether kube-scheduler renewed its leader lease in the last `max_age` seconds (a
    scheduler that lost it exits, and nothing is placed until one is started again)."""
    lease = api.get("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler",
                    ok=(404,))
    if not lease or not lease["spec"].get("renewTime"):
        return None  # leader election off, or another name: cannot tell
    t = datetime.datetime.strptime(lease["spec"]["renewTime"][:19], "%Y-%m-%dT%H:%M:%S")
    age = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - t
    return age.total_seconds() < max_age


def now_micro():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_sec():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- simulated nodes ----------------------------------------------------------------------

class Nodes:
    """N Node objects without a kubelet, kept Ready by renewing their Leases (one thread)."""

    LEASE_SECONDS = 40
    RENEW_EVERY = 10

    def __init__(self, api, names):
        self.api = api
        self.names = names
        self.stop = threading.Event()
        self.renewer = None
        self.renew_errors = 0

    def create(self):
        for name in self.names:
            node = self.api.create("/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    LABEL: "true", SIM: "true", "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
                "spec": {"taints": [{"key": SIM, "value": "true", "effect": "NoSchedule"}]},
            })
            t = now_sec()
            cond = lambda typ, status, reason: {  # noqa: E731
                "type": typ, "status": status, "reason": reason, "message": "simulated",
                "lastHeartbeatTime": t, "lastTransitionTime": t}
            self.api.patch(f"/api/v1/nodes/{name}/status", {"status": {
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                "conditions": [cond("Ready", "True", "KubeletReady"),
                               cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                               cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                               cond("PIDPressure", "False", "KubeletHasSufficientPID")],
                "nodeInfo": {"kubeletVersion": "simulated", "operatingSystem": "linux",
                             "architecture": "amd64"},
            }}, kind="strategic-merge")
            self.api.create("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": "kube-node-lease",
                             "labels": {LABEL: "true"},
                             "ownerReferences": [owner(node)]},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": self.LEASE_SECONDS,
                         "renewTime": now_micro()},
            })
        self.renewer = threading.Thread(target=self._renew, name="lease-renewer", daemon=True)
        self.renewer.start()

    def _renew(self):
        while not self.stop.wait(self.RENEW_EVERY):
            for name in self.names:
                if self.stop.is_set():
                    return
                try:
                    self.api.patch(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/"
                                   f"leases/{name}", {"spec": {"renewTime": now_micro()}})
                except Exception as e:  # keep renewing the others; reported at the end
                    self.renew_errors += 1
                    if self.renew_errors <= 3:
                        log(f"renewing lease {name}: {e}")

    def wait_ready(self, timeout=120):
        """Until every node is Ready with no taint but ours (the node lifecycle controller
        takes its not-ready taint off a node it has seen Ready)."""
        end = time.monotonic() + timeout
        while True:
            items = self.api.list("/api/v1/nodes", f"{LABEL}")["items"]
            bad = []
            for n in items:
                taints = [t["key"] for t in n["spec"].get("taints", []) if t["key"] != SIM]
                ready = any(c["type"] == "Ready" and c["status"] == "True"
                            for c in n["status"].get("conditions", []))
                if taints or not ready:
                    bad.append(f"{n['metadata']['name']} (ready={ready}, taints={taints})")
            if len(items) == len(self.names) and not bad:
                return
            if time.monotonic() > end:
                raise SystemExit(f"scale_bench: simulated nodes not Ready after {timeout} s: "
                                 f"{bad[:5]}")
            time.sleep(1)

    def check_still_ready(self):
        """The nodes that lost Ready or got a taint during the run (lease renewals late)."""
        out = []
        for n in self.api.list("/api/v1/nodes", LABEL)["items"]:
            taints = [t["key"] for t in n["spec"].get("taints", []) if t["key"] != SIM]
            if taints:
                out.append(f"{n['metadata']['name']}: {taints}")
        return out

    def close(self):
        self.stop.set()
        if self.renewer:
            self.renewer.join(timeout=30)


def owner(obj):
    return {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Node"),
            "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"]}


# --- ResourceSlices from the real plugin --------------------------------------------------

def plugin_slice(args, node, driver, workdir):
    """What `gpuslice-dra slice` prints for `node`, on a fake GPU of args.gpus devices of
    args.gpu_memory, with a ledger and fake-GPU state of its own (nothing of the real node's
    /dev/shm/gpuslice or /run/fakegpu is read)."""
    libs = workdir / "fakegpu-libs"
    if not libs.exists():
        libs.mkdir()
        for name in ("libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so"):
            (libs / name).symlink_to(args.fakegpu)
    (workdir / "fakegpu-state").mkdir(exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": str(libs),
           "FAKEGPU_DEVICES": str(args.gpus), "FAKEGPU_MEMORY": args.gpu_memory,
           "FAKEGPU_STATE_DIR": str(workdir / "fakegpu-state"),
           "GPUSLICE_RUNTIME_DIR": str(workdir / "ledger")}
    p = subprocess.run([str(args.gpuslice_dra), "slice", "--node-name", node, "--driver", driver,
                        "--runtime-dir", str(workdir / "ledger")],
                       env=env, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise SystemExit(f"scale_bench: gpuslice-dra slice failed ({p.returncode}): {p.stderr}")
    s = json.loads(p.stdout)
    if len(s["spec"].get("devices", [])) != args.gpus:
        raise SystemExit(f"scale_bench: gpuslice-dra slice published "
                         f"{len(s['spec'].get('devices', []))} of {args.gpus} GPUs: {p.stderr}")
    return s


def whole_devices(s):
    """The same GPUs as plain devices: one claim takes a device whole."""
    for d in s["spec"]["devices"]:
        d.pop("allowMultipleAllocations", None)
        for c in d.get("capacity", {}).values():
            c.pop("requestPolicy", None)
    return s


# --- the workload -------------------------------------------------------------------------

def workload(args):
    """(memory GiB, compute thousandths) of each pod: uniform, with a fixed seed."""
    rng = random.Random(args.seed)
    lo, hi = args.memory
    return [(rng.randint(lo, hi), rng.randint(args.compute[0] // 100, args.compute[1] // 100) * 100)
            for _ in range(args.pods)]


def claim_spec(mode, cls, mem, compute):
    exactly = {"deviceClassName": cls}
    if mode == "shared":
        exactly["capacity"] = {"requests": {"memory": f"{mem}Gi", "compute": str(compute)}}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def pod_obj(i, ref):
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p-{i:05d}", "namespace": NAMESPACE, "labels": {LABEL: "true"}},
        "spec": {
            "nodeSelector": {SIM: "true"},
            "tolerations": [{"key": SIM, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "resourceClaims": [dict(name="gpu", **ref)],
            "containers": [{"name": "c", "image": "localhost/gpuslice-cluster/pause:1",
                            "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


class Watch:
    """Pods of the namespace as a watch sees them: when each was bound (monotonic clock, here)
    and the scheduler's last word on each one not bound."""

    def __init__(self, api):
        self.api = api
        self.bound = {}       # pod -> (t, node)
        self.pending = {}     # pod -> PodScheduled=False message
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.error = None
        rv = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")["metadata"]["resourceVersion"]
        self.rv = rv
        self.conn = None
        self.thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            # No read timeout: close() shuts the socket down to end a blocked read.
            self.conn = conn = self.api.connect(timeout=None)
            try:
                q = urllib.parse.urlencode({"watch": "1", "resourceVersion": self.rv,
                                            "allowWatchBookmarks": "true",
                                            "timeoutSeconds": "1800"})
                conn.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?{q}",
                             headers={"Accept": "application/json"})
                r = conn.getresponse()
                if r.status != 200:
                    raise ApiError("WATCH", "pods", r.status, r.read().decode(errors="replace"))
                while not self.stop.is_set():
                    line = r.readline()
                    if not line:
                        break
                    self._event(json.loads(line))
            except (OSError, ValueError, http.client.HTTPException, ApiError) as e:
                if self.stop.is_set():
                    return
                if isinstance(e, ApiError) and e.status == 410:
                    # Too old: start again from now (bindings in between are in the list).
                    lst = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")
                    for p in lst["items"]:
                        self._event({"type": "MODIFIED", "object": p})
                    self.rv = lst["metadata"]["resourceVersion"]
                else:
                    self.error = str(e)
                time.sleep(0.2)
            finally:
                conn.close()

    def _event(self, ev):
        t = time.monotonic()
        obj = ev.get("object", {})
        if ev.get("type") == "ERROR":
            if obj.get("code") == 410:
                raise ApiError("WATCH", "pods", 410, obj.get("message", ""))
            return
        self.rv = obj.get("metadata", {}).get("resourceVersion", self.rv)
        if ev.get("type") not in ("ADDED", "MODIFIED"):
            return
        name = obj["metadata"]["name"]
        node = obj["spec"].get("nodeName")
        with self.lock:
            if node:
                self.bound.setdefault(name, (t, node))
                self.pending.pop(name, None)
                return
            for c in obj.get("status", {}).get("conditions", []):
                if c["type"] == "PodScheduled" and c["status"] == "False":
                    self.pending[name] = f"{c.get('reason')}: {c.get('message')}"

    def counts(self):
        with self.lock:
            return len(self.bound), len(self.pending)

    def close(self):
        self.stop.set()
        try:
            self.conn.sock.shutdown(2)
        except (AttributeError, OSError):
            pass
        self.thread.join(timeout=10)


COMPONENTS = ("kube-scheduler", "kube-apiserver", "etcd", "kube-controller-manager")


def cpu_seconds():
    """CPU seconds (user + system) each control-plane process of scripts/cluster.sh has used,
    from its pid file and /proc; {} when the cluster runs elsewhere."""
    run = STATE / "run"
    out = {}
    for c in COMPONENTS:
        try:
            pid = (run / f"{c}.pid").read_text().strip()
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[c] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    return out


def scheduler_metrics(api, url):
    """From kube-scheduler's /metrics (its serving certificate is its own, self-signed; the
    client certificate is the admin's): API requests by verb, the seconds they waited in the
    client-side rate limiter, and scheduling attempts by result. {} if it does not answer."""
    u = urllib.parse.urlparse(url)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(*api.cert)
    try:
        conn = http.client.HTTPSConnection(u.hostname, u.port or 443, context=ctx, timeout=10)
        conn.request("GET", u.path or "/metrics")
        r = conn.getresponse()
        text = r.read().decode(errors="replace")
        conn.close()
        if r.status != 200:
            return {}
    except (OSError, http.client.HTTPException):
        return {}
    out = {}
    for ln in text.splitlines():
        name, _, value = ln.rpartition(" ")
        for prefix, key in (("rest_client_requests_total{", "requests"),
                            ("rest_client_rate_limiter_duration_seconds_sum{", "limiter_wait_s"),
                            ("scheduler_schedule_attempts_total{", "attempts")):
            if name.startswith(prefix):
                label = "result" if key == "attempts" else ("method" if key == "requests"
                                                             else "verb")
                k = name.split(f'{label}="', 1)[1].split('"', 1)[0] if f'{label}="' in name else "?"
                d = out.setdefault(key, {})
                d[k] = d.get(k, 0) + float(value)
    return out


def delta(after, before):
    return {k: {kk: v - before.get(k, {}).get(kk, 0) for kk, v in d.items()}
            for k, d in after.items()}


def throttled_waits():
    """How many client-side throttling waits (>= 1 s: the ones logged at the default
    verbosity) kube-scheduler's log holds; None when it is not readable here."""
    log_file = STATE / "logs/kube-scheduler.log"
    try:
        with open(log_file, errors="replace") as f:
            return sum(1 for ln in f if "client-side throttling" in ln)
    except OSError:
        return None


def run_workload(api, args, mode, cls, sizes, slices):
    """Create the pods (and their claims) of one workload, wait for the scheduler to be done
    with them, and measure."""
    n = len(sizes)
    watch = Watch(api)
    created = [None] * n
    claims_ns = f"{RESOURCE}/namespaces/{NAMESPACE}"
    if args.claims == "template":
        kinds = sorted(set(sizes)) if mode == "shared" else [(0, 0)]
        for mem, compute in kinds:
            api.create(f"{claims_ns}/resourceclaimtemplates", {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": f"t-{mem}gi-{compute}", "labels": {LABEL: "true"}},
                "spec": {"metadata": {"labels": {LABEL: "true"}},
                         "spec": claim_spec(mode, cls, mem, compute)}})

    def claim(i):
        mem, compute = sizes[i]
        api.create(f"{claims_ns}/resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"c-{i:05d}", "labels": {LABEL: "true"}},
            "spec": claim_spec(mode, cls, mem, compute)})

    def make(i):
        mem, compute = sizes[i]
        if args.claims == "template":
            t = f"t-{mem}gi-{compute}" if mode == "shared" else "t-0gi-0"
            ref = {"resourceClaimTemplateName": t}
        else:
            ref = {"resourceClaimName": f"c-{i:05d}"}
        created[i] = time.monotonic()
        api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod_obj(i, ref))

    limit = RateLimit(args.qps)

    def parallel(f):
        def limited(i):
            limit.wait()
            f(i)

        with concurrent.futures.ThreadPoolExecutor(args.creators) as ex:
            for fut in concurrent.futures.as_completed([ex.submit(limited, i) for i in range(n)]):
                fut.result()

    if args.claims == "direct":
        # The claims first, untimed: the pods' creation is what the scheduler sees arrive.
        log(f"{mode}: creating {n} ResourceClaims")
        parallel(claim)
    log(f"{mode}: creating {n} pods ({args.claims} claims) with {args.creators} clients, "
        f"at most {args.qps:g} /s")
    cpu0, waits0 = cpu_seconds(), throttled_waits()
    m0 = scheduler_metrics(api, args.scheduler_metrics)
    t0 = time.monotonic()
    parallel(make)
    t_created = time.monotonic()
    log(f"{mode}: {n} pods created in {t_created - t0:.1f} s")

    # Done when every pod is bound, or when nothing was bound for --settle seconds and the
    # scheduler has marked every other pod unschedulable.
    last_change, last_bound = time.monotonic(), -1
    last_alive = time.monotonic()
    end = t0 + args.timeout
    while True:
        bound, pending = watch.counts()
        now = time.monotonic()
        if bound != last_bound:
            last_change, last_bound = now, bound
            log(f"{mode}: {bound} bound, {pending} unschedulable, {now - t0:.0f} s")
        if bound == n:
            break
        if now - last_alive >= 10:
            last_alive = now
            if scheduler_alive(api) is False:
                watch.close()
                raise SystemExit("scale_bench: kube-scheduler has not renewed its leader lease "
                                 "(kube-system/kube-scheduler) for 30 s: it is gone (a "
                                 "scheduler that loses its lease exits; see its log); "
                                 f"{bound} of {n} pods were bound")
        if bound + pending >= n and now - last_change >= args.settle:
            break
        if now > end:
            log(f"{mode}: stopped waiting after --timeout {args.timeout} s")
            break
        time.sleep(1)
    watch.close()
    cpu1, waits1 = cpu_seconds(), throttled_waits()
    m1 = scheduler_metrics(api, args.scheduler_metrics)

    with watch.lock:
        bound = dict(watch.bound)
        pending = dict(watch.pending)
    times = sorted(t for t, _ in bound.values())
    lat = sorted(bound[p][0] - created[int(p[2:])] for p in bound)
    r = {"mode": mode, "pods": n, "bound": len(bound), "pending": n - len(bound),
         "create_s": t_created - t0, "created_per_s": n / (t_created - t0)}
    if times:
        r["last_bind_s"] = times[-1] - t0
        r["scheduled_per_s"] = len(times) / (times[-1] - t0)
        a, b = int(0.1 * len(times)), max(int(0.9 * len(times)) - 1, 0)
        r["steady_per_s"] = (b - a) / (times[b] - times[a]) if times[b] > times[a] else None
        r["latency_p50_s"] = statistics.median(lat)
        r["latency_p99_s"] = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    r["cpu_s"] = {c: cpu1[c] - cpu0[c] for c in cpu1 if c in cpu0}
    r["scheduler"] = delta(m1, m0) if m0 and m1 else {}
    r["throttled_waits"] = None if waits0 is None or waits1 is None else waits1 - waits0
    reasons = {}
    for p in range(n):
        name = f"p-{p:05d}"
        if name not in bound:
            m = pending.get(name, "(no PodScheduled condition seen)")
            reasons[m] = reasons.get(m, 0) + 1
    r["reasons"] = sorted(reasons.items(), key=lambda kv: -kv[1])
    r.update(fill(api, mode, sizes, bound, slices))
    return r


def fill(api, mode, sizes, bound, slices):
    """How full the GPUs are: memory and compute placed / capacity. For shared, from the
    claims' allocations (consumedCapacity), checked per device against its capacity."""
    cap_mem = cap_cmp = 0
    caps = {}
    for s in slices:
        for d in s["spec"]["devices"]:
            m = quantity(d["capacity"]["memory"]["value"])
            c = quantity(d["capacity"]["compute"]["value"])
            caps[(s["spec"]["pool"]["name"], d["name"])] = (m, c)
            cap_mem += m
            cap_cmp += c
    asked_mem = sum(sizes[int(p[2:])][0] for p in bound) * GI
    asked_cmp = sum(sizes[int(p[2:])][1] for p in bound)
    used = {}
    keys = set()
    claims = api.list(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims", LABEL)["items"]
    for cl in claims:
        for res in (cl.get("status", {}).get("allocation") or {}).get("devices", {}).get(
                "results", []):
            dev = (res["pool"], res["device"])
            u = used.setdefault(dev, [0, 0, 0])
            u[2] += 1
            for k, v in (res.get("consumedCapacity") or {}).items():
                keys.add(k)
                if k.rsplit("/", 1)[-1] == "memory":
                    u[0] += quantity(v)
                elif k.rsplit("/", 1)[-1] == "compute":
                    u[1] += quantity(v)
    over = [f"{d}: {u[0] / GI} GiB, {u[1]} compute" for d, u in used.items()
            if d in caps and (u[0] > caps[d][0] or u[1] > caps[d][1])]
    if mode == "whole":
        over += [f"{d}: {u[2]} claims" for d, u in used.items() if u[2] > 1]
    out = {"devices": len(caps), "devices_used": len(used), "allocated_claims": sum(
        u[2] for u in used.values()), "consumed_keys": sorted(keys), "overcommitted": over,
        "asked_memory_fill": float(asked_mem / cap_mem) if cap_mem else 0.0,
        "asked_compute_fill": float(asked_cmp / cap_cmp) if cap_cmp else 0.0}
    if mode == "shared":
        out["memory_fill"] = float(sum(u[0] for u in used.values()) / cap_mem)
        out["compute_fill"] = float(sum(u[1] for u in used.values()) / cap_cmp)
        full = sum(1 for d, u in used.items() if d in caps and caps[d][1] - u[1] < 100)
        out["devices_compute_full"] = full
    return out


# --- cleaning up --------------------------------------------------------------------------

def delete_workload(api, wait=300):
    """Pods (forced: no kubelet will confirm), claims and templates of the namespace."""
    sel = urllib.parse.quote(LABEL)
    api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={sel}",
                {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
                ok=(404,))
    for kind in ("resourceclaims", "resourceclaimtemplates"):
        api.request("DELETE", f"{RESOURCE}/namespaces/{NAMESPACE}/{kind}?labelSelector={sel}",
                    ok=(404,))
    end = time.monotonic() + wait
    while time.monotonic() < end:
        left = [len((api.get(p, ok=(404,)) or {"items": []})["items"]) for p in (
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims")]
        if not any(left):
            return True
        time.sleep(2)
    log(f"pods/claims still there after {wait} s: {left}")
    return False


def cleanup(api, created_classes=()):
    """Everything labelled gpuslice.dev/scale-bench: namespace content, ResourceSlices,
    leases, nodes, the DeviceClasses this run made."""
    sel = urllib.parse.quote(LABEL)
    if api.get(f"/api/v1/namespaces/{NAMESPACE}", ok=(404,)):
        delete_workload(api)
        api.delete(f"/api/v1/namespaces/{NAMESPACE}")
    api.request("DELETE", f"{RESOURCE}/resourceslices?labelSelector={sel}", ok=(404,))
    api.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
                f"?labelSelector={sel}", ok=(404,))
    api.request("DELETE", f"/api/v1/nodes?labelSelector={sel}", ok=(404,))
    for c in api.list(f"{RESOURCE}/deviceclasses", LABEL)["items"]:
        api.delete(f"{RESOURCE}/deviceclasses/{c['metadata']['name']}")
    for name in created_classes:
        api.delete(f"{RESOURCE}/deviceclasses/{name}")
    end = time.monotonic() + 120
    while time.monotonic() < end:
        left = {
            "nodes": len(api.list("/api/v1/nodes", LABEL)["items"]),
            "resourceslices": len(api.list(f"{RESOURCE}/resourceslices", LABEL)["items"]),
            "namespace": 1 if api.get(f"/api/v1/namespaces/{NAMESPACE}", ok=(404,)) else 0,
        }
        if not any(left.values()):
            log("cleaned up: no node, ResourceSlice, lease, pod, claim or namespace of the "
                "benchmark left")
            return True
        time.sleep(2)
    log(f"still there after 120 s: {left}")
    return False


def ensure_class(api, name, driver, made):
    """The DeviceClass `name` (the chart's gpuslice.dev when installed); made here if it is
    missing, as the chart's rendering (deploy/gpuslice.yaml) defines it, and removed at the
    end."""
    if api.get(f"{RESOURCE}/deviceclasses/{name}", ok=(404,)):
        return f"{name} (existing)"
    obj = next(o for o in yaml.safe_load_all((ROOT / "deploy/gpuslice.yaml").read_text())
               if o and o.get("kind") == "DeviceClass")
    obj["metadata"] = {"name": name, "labels": {LABEL: "true"}}
    obj["spec"]["selectors"] = [{"cel": {"expression": f'device.driver == "{driver}"'}}]
    api.create(f"{RESOURCE}/deviceclasses", obj)
    made.append(name)
    return f"{name} (made for the run)"


# --- report -------------------------------------------------------------------------------

def fmt(v, spec="{:.1f}"):
    return "–" if v is None else spec.format(v)


def report(args, version, results, started, load_start, nodes_lost, renew_errors):
    load = os.getloadavg()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "?")
    lines = [
        f"Kubernetes scale by simulation, {started:%Y-%m-%d %H:%M} UTC",
        "",
        "| | |", "|---|---|",
        f"| machine | {os.cpu_count()} CPUs ({cpu}); load average (1, 5, 15 min) "
        f"{' '.join(f'{x:.1f}' for x in load_start)} at the start, "
        f"{' '.join(f'{x:.1f}' for x in load)} at the end |",
        f"| Kubernetes | {version} (the cluster's kube-apiserver, kube-scheduler, "
        f"kube-controller-manager) |",
        f"| command | `{shlex.join(['python3', 'tests/cluster/scale_bench.py'] + sys.argv[1:])}` |",
        f"| simulated | {args.nodes} nodes × {args.gpus} GPUs of {args.gpu_memory}; {args.pods} "
        f"pods, one {args.claims} claim each; memory uniform {args.memory[0]}–{args.memory[1]} "
        f"Gi, compute uniform {args.compute[0]}–{args.compute[1]} (steps of 100), seed "
        f"{args.seed} |",
        "",
        "| workload | pods placed | Pending | created /s | scheduled /s (overall) | "
        "scheduled /s (10–90 %) | latency p50 / p99 | GPUs used | memory placed ÷ capacity "
        "| compute placed ÷ capacity |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        mem = r.get("memory_fill", r["asked_memory_fill"])
        cmp_ = r.get("compute_fill", r["asked_compute_fill"])
        whole = r["mode"] == "whole"
        lines.append(
            f"| {r['mode']} | {r['bound']} / {r['pods']} | {r['pending']} | "
            f"{r['created_per_s']:.0f} | {fmt(r.get('scheduled_per_s'))} | "
            f"{fmt(r.get('steady_per_s'))} | {fmt(r.get('latency_p50_s'), '{:.2f}')} / "
            f"{fmt(r.get('latency_p99_s'), '{:.2f}')} s | {r['devices_used']} / {r['devices']} | "
            f"{mem:.1%}{' (asked; each pod holds a whole GPU)' if whole else ''} | "
            f"{cmp_:.1%}{' (asked)' if whole else ''} |")
    lines.append("")
    for r in results:
        if r["reasons"]:
            for msg, count in r["reasons"][:3]:
                lines.append(f"- {r['mode']}: {count} pod(s) Pending: `{msg}`")
        if r["mode"] == "shared":
            lines.append(f"- shared: consumedCapacity keys as the scheduler wrote them: "
                         f"{', '.join(r['consumed_keys']) or '(none)'}; devices over capacity: "
                         f"{len(r['overcommitted'])}; GPUs with < 100 compute left: "
                         f"{r['devices_compute_full']}")
        elif r["overcommitted"]:
            lines.append(f"- whole: devices given to more than one claim: {r['overcommitted']}")
    for r in results:
        if r["cpu_s"]:
            per = r["cpu_s"].get("kube-scheduler", 0) / max(r["bound"], 1) * 1000
            lines.append(f"- {r['mode']}: CPU seconds used while its pods were created and "
                         f"scheduled: " + ", ".join(f"{c} {v:.1f}" for c, v in r["cpu_s"].items())
                         + f" (kube-scheduler {per:.0f} ms per pod placed); kube-scheduler's "
                         f"client-side throttling waits of 1 s or more: {r['throttled_waits']}")
    for r in results:
        m = r["scheduler"]
        if m:
            reqs = sum(m.get("requests", {}).values())
            wait = sum(m.get("limiter_wait_s", {}).values())
            att = m.get("attempts", {})
            lines.append(
                f"- {r['mode']}: kube-scheduler made {reqs:.0f} API requests "
                f"({reqs / max(r['bound'], 1):.1f} per pod placed: "
                + ", ".join(f"{k} {v:.0f}" for k, v in sorted(m.get("requests", {}).items()))
                + f"), waiting {wait / max(reqs, 1):.2f} s each on average in its client-side "
                f"rate limiter; scheduling attempts: "
                + ", ".join(f"{k} {v:.0f}" for k, v in sorted(att.items())))
    if nodes_lost or renew_errors:
        lines.append(f"- simulated nodes that lost Ready during the run: {nodes_lost}; "
                     f"lease renewals failed: {renew_errors}")
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------

def int_range(s):
    a, _, b = s.partition("-")
    return (int(a), int(b or a))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    ap.add_argument("--gpu-memory", default="80Gi", help="memory of each GPU (default 80Gi)")
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--memory", type=int_range, default=(1, 16),
                    help="memory of a claim, GiB, uniform (default 1-16)")
    ap.add_argument("--compute", type=int_range, default=(100, 1000),
                    help="compute of a claim, thousandths in steps of 100 (default 100-1000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workloads", default="shared,whole",
                    help="which workloads, in order (default shared,whole)")
    ap.add_argument("--claims", choices=("direct", "template"), default="direct",
                    help="direct: a ResourceClaim made here per pod (the scheduler alone is "
                         "measured); template: a ResourceClaimTemplate per size, the "
                         "controller manager makes the claims (default direct)")
    ap.add_argument("--driver", default="gpuslice.dev",
                    help="the driver name of the shared slices, and the DeviceClass they are "
                         "claimed with (default gpuslice.dev, the chart's; another name keeps "
                         "the run apart from the real node's driver, e.g. while the cluster "
                         "tests run)")
    ap.add_argument("--creators", type=int, default=4, help="parallel clients creating pods")
    ap.add_argument("--qps", type=float, default=40,
                    help="claims and pods created per second at most, all clients together "
                         "(default 40; 0: no limit). On a small control plane an unlimited "
                         "burst delays kube-scheduler's lease renewal past its timeout, and "
                         "the scheduler exits")
    ap.add_argument("--settle", type=float, default=20,
                    help="seconds without a binding after which the rest is taken as unschedulable")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per workload at most")
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument("--gpuslice-dra", type=pathlib.Path,
                    default=pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
                    / "release/gpuslice-dra")
    ap.add_argument("--fakegpu", type=pathlib.Path,
                    default=pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
                    / "release/libfakegpu.so")
    ap.add_argument("--scheduler-metrics", default="https://127.0.0.1:10259/metrics",
                    help="kube-scheduler's metrics, read before and after each workload "
                         "(default https://127.0.0.1:10259/metrics)")
    ap.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    ap.add_argument("--cleanup", action="store_true",
                    help="only remove what an earlier run left (everything labelled "
                         f"{LABEL})")
    args = ap.parse_args()

    if not args.kubeconfig:
        env = subprocess.run(["bash", str(ROOT / "scripts/cluster.sh"), "env"],
                             capture_output=True, text=True, check=True).stdout
        args.kubeconfig = dict(w.split("=", 1) for w in shlex.split(env)[1:])["KUBECONFIG"]
    api = Api(args.kubeconfig)
    version = api.get("/version")["gitVersion"]
    if version.startswith("v0.0.0"):
        # Built from the module without the version stamped in: name the pinned module.
        mod = (ROOT / "tests/cluster/build/kubernetes/go.mod").read_text().split()
        pinned = next((mod[i + 1] for i, w in enumerate(mod) if w == "k8s.io/kubernetes"
                       and i + 1 < len(mod) and mod[i + 1].startswith("v1")), "?")
        version = f"k8s.io/kubernetes {pinned} (the server says {version})"
    if args.cleanup:
        sys.exit(0 if cleanup(api) else 1)
    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        if w not in ("shared", "whole"):
            ap.error(f"--workloads: {w!r}: shared or whole")
    for p in (args.gpuslice_dra, args.fakegpu):
        if not p.exists():
            ap.error(f"{p} is missing: cargo build --release -p gpuslice-dra -p fakegpu")
    if args.compute[0] < 100 or args.compute[1] > 1000 or args.memory[0] < 1:
        ap.error("--compute within 100-1000, --memory from 1 GiB")

    # SIGTERM as Ctrl-C: the finally below cleans up either way.
    def interrupted(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()
    if api.list("/api/v1/nodes", LABEL)["items"] or api.get(
            f"/api/v1/namespaces/{NAMESPACE}", ok=(404,)):
        log("removing what an earlier run left")
        cleanup(api)
    names = [f"sim-{i:03d}" for i in range(args.nodes)]
    nodes = Nodes(api, names)
    made_classes = []
    results = []
    nodes_lost = []
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="scale-bench-"))
    try:
        log(f"creating {args.nodes} simulated nodes")
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": NAMESPACE,
                                                       "labels": {LABEL: "true"}}})
        nodes.create()
        nodes.wait_ready()
        node_objs = {n["metadata"]["name"]: n for n in api.list("/api/v1/nodes", LABEL)["items"]}
        # Pods are refused until the namespace's default ServiceAccount exists.
        end = time.monotonic() + 60
        while not api.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default", ok=(404,)):
            if time.monotonic() > end:
                raise SystemExit("scale_bench: no default ServiceAccount in the namespace "
                                 "after 60 s (is kube-controller-manager running?)")
            time.sleep(0.5)
        sizes = workload(args)
        for mode in workloads:
            if scheduler_alive(api) is False:
                raise SystemExit("scale_bench: kube-scheduler has not renewed its leader lease "
                                 "(kube-system/kube-scheduler) for 30 s: is it running?")
            driver = args.driver if mode == "shared" else f"whole.{args.driver}"
            cls = ensure_class(api, driver, driver, made_classes)
            log(f"{mode}: DeviceClass {cls}; publishing {args.nodes} ResourceSlices of driver "
                f"{driver} from gpuslice-dra slice")
            slices = []
            for name in names:
                s = plugin_slice(args, name, driver, workdir)
                if mode == "whole":
                    s = whole_devices(s)
                s["metadata"]["labels"] = {LABEL: "true"}
                s["metadata"]["ownerReferences"] = [owner(node_objs[name])]
                slices.append(api.create(f"{RESOURCE}/resourceslices", s))
            results.append(run_workload(api, args, mode, cls.split()[0], sizes, slices))
            nodes_lost += nodes.check_still_ready()
            log(f"{mode}: removing its pods, claims and ResourceSlices")
            delete_workload(api)
            api.request("DELETE", f"{RESOURCE}/resourceslices?labelSelector="
                        f"{urllib.parse.quote(LABEL)}", ok=(404,))
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        raise
    finally:
        nodes.close()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            cleanup(api, made_classes)
        finally:
            subprocess.run(["rm", "-rf", str(workdir)])
    text = report(args, version, results, started, load_start, nodes_lost, nodes.renew_errors)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"version": version, "args": vars(args) | {
            "gpuslice_dra": str(args.gpuslice_dra), "fakegpu": str(args.fakegpu),
            "json": str(args.json)}, "results": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
