"""kubectl for the cluster tests: run it, apply objects, wait for what a test needs.

Every wait has a deadline and, when it passes, fails with what the cluster says (the object,
its events), never with a bare timeout.
"""

import json
import pathlib
import shlex
import subprocess
import time

import yaml


class KubeError(AssertionError):
    pass


_SUFFIX = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "m": None}


def quantity(q):
    """A Kubernetes quantity as the API server writes it back (canonical: 1000 is "1k") as an
    int; milli-units are refused (nothing here uses them)."""
    q = str(q)
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if q.endswith(suffix) and q[: -len(suffix)].lstrip("-").isdigit():
            if _SUFFIX[suffix] is None:
                raise ValueError(f"quantity {q!r}: milli-units")
            return int(q[: -len(suffix)]) * _SUFFIX[suffix]
    return int(q)


def quantities(d):
    """A map of quantities (consumedCapacity, a capacity's values) as ints."""
    return {k: quantity(v) for k, v in d.items()}


class Cluster:
    def __init__(self, kubeconfig, path, root):
        self.kubeconfig = kubeconfig
        self.path = path
        self.root = pathlib.Path(root)
        self.env = {"KUBECONFIG": kubeconfig, "PATH": path, "HOME": "/root"}

    @classmethod
    def from_env_line(cls, line, root):
        """From `scripts/cluster.sh env`: `export KUBECONFIG=... PATH=BIN:$PATH`."""
        words = dict(w.split("=", 1) for w in shlex.split(line.strip())[1:])
        bin_dir = words["PATH"].split(":", 1)[0]
        import os

        return cls(words["KUBECONFIG"], f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", root)

    @property
    def bin(self):
        return pathlib.Path(self.path.split(":", 1)[0])

    # --- running -------------------------------------------------------------------------

    def run(self, *args, input=None, check=True, timeout=120):
        p = subprocess.run(
            list(args), input=input, capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if check and p.returncode != 0:
            raise KubeError(f"{' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        return p

    def kubectl(self, *args, **kw):
        return self.run(str(self.bin / "kubectl"), *args, **kw)

    def helm(self, *args, **kw):
        return self.run(str(self.bin / "helm"), *args, **kw)

    def get(self, kind, name=None, ns=None, selector=None):
        args = ["get", kind] + ([name] if name else []) + ["-o", "json"]
        if ns:
            args += ["-n", ns]
        if selector:
            args += ["-l", selector]
        return json.loads(self.kubectl(*args).stdout)

    def exists(self, kind, name, ns=None):
        args = ["get", kind, name] + (["-n", ns] if ns else [])
        return self.kubectl(*args, check=False).returncode == 0

    def apply(self, objs):
        text = yaml.safe_dump_all(objs) if isinstance(objs, list) else objs
        return self.kubectl("apply", "-f", "-", input=text)

    def delete(self, kind, name, ns=None, wait=True, timeout="120s"):
        args = ["delete", kind, name, "--ignore-not-found", f"--wait={str(wait).lower()}",
                f"--timeout={timeout}"]
        if ns:
            args += ["-n", ns]
        self.kubectl(*args, timeout=300)

    def describe(self, kind, name, ns=None):
        args = ["describe", kind, name] + (["-n", ns] if ns else [])
        return self.kubectl(*args, check=False).stdout

    def events(self, ns, name):
        p = self.kubectl("get", "events", "-n", ns, "--field-selector",
                         f"involvedObject.name={name}", "-o", "json", check=False)
        if p.returncode != 0:
            return []
        return [f"{e.get('reason')}: {e.get('message')}" for e in json.loads(p.stdout)["items"]]

    def check_up(self):
        self.kubectl("get", "--raw", "/readyz")

    # --- waiting -------------------------------------------------------------------------

    def wait_until(self, what, probe, timeout=120, interval=1.0, explain=None):
        """Call `probe` until it returns something true; return it."""
        end = time.monotonic() + timeout
        last = None
        while True:
            try:
                r = probe()
            except KubeError as e:
                r, last = None, e
            if r:
                return r
            if time.monotonic() > end:
                detail = explain() if explain else (str(last) if last else "")
                raise KubeError(f"{what}: not after {timeout} s\n{detail}")
            time.sleep(interval)

    def pod(self, ns, name):
        return self.get("pod", name, ns)

    def wait_pod_phase(self, ns, name, phases, timeout=180):
        phases = {phases} if isinstance(phases, str) else set(phases)

        def probe():
            p = self.pod(ns, name)
            return p if p["status"].get("phase") in phases else None

        return self.wait_until(
            f"pod {ns}/{name} in {sorted(phases)}", probe, timeout,
            explain=lambda: self.describe("pod", name, ns),
        )

    def wait_running(self, ns, name, timeout=180):
        return self.wait_pod_phase(ns, name, "Running", timeout)

    def logs(self, ns, name, container=None, previous=False):
        args = ["logs", "-n", ns, name] + (["-c", container] if container else [])
        if previous:
            args.append("--previous")
        return self.kubectl(*args, check=False).stdout

    def json_lines(self, ns, name, container=None):
        out = []
        for line in self.logs(ns, name, container).splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return out

    def exec(self, ns, pod, cmd, container=None, check=True, timeout=120):
        args = ["exec", "-n", ns, pod] + (["-c", container] if container else []) + ["--"] + cmd
        return self.kubectl(*args, check=check, timeout=timeout)

    # --- gpuslice on the node ------------------------------------------------------------

    def driver_pod(self):
        pods = self.get("pods", ns="gpuslice-system",
                        selector="app.kubernetes.io/name=gpuslice")["items"]
        live = [p for p in pods if p["metadata"].get("deletionTimestamp") is None
                and p["status"].get("phase") == "Running"]
        if not live:
            raise KubeError("no running gpuslice pod in gpuslice-system")
        return live[0]["metadata"]["name"]

    def gpuslice_status(self):
        """`gpuslice status --json` in the monitor's container, as an operator runs it."""
        out = self.exec("gpuslice-system", self.driver_pod(), ["gpuslice", "status", "--json"],
                        container="monitor").stdout
        return json.loads(out)

    def resource_slices(self):
        return self.get("resourceslices")["items"]
