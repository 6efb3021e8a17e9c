"""Fixtures for gpuslice's tests with real third-party CUDA clients (numba, pynvml).

Each client runs in its own subprocess (`run_client`), so every test gets a fresh process, a
fresh driver state and exactly the environment `gpu_env` builds:

- ``LD_LIBRARY_PATH``: the fake GPU's library directory (``libcuda.so.1``, ``libnvidia-ml.so.1``),
  from ``$FAKEGPU_LIB_DIR`` when set (scripts/test.sh sets it), else from ``scripts/fakegpu.sh``.
- ``FAKEGPU_STATE_DIR`` and ``GPUSLICE_RUNTIME_DIR``: private directories under the test's tmp dir.
- ``CUDA_HOME``: a small folder with ``nvvm/lib64/libnvvm.so.4``, ``nvvm/libdevice/libdevice.10.bc``
  (from the ``nvidia-cuda-nvcc-cu12`` wheel) and ``lib64/libcudart.so.12`` (from
  ``nvidia-cuda-runtime-cu12``): all numba's ctypes path needs to compile kernels.
- ``NUMBA_CUDA_USE_NVIDIA_BINDING=0``: numba's built-in ctypes driver binding.
- with ``preload=True``: ``LD_PRELOAD`` = ``libgpuslice.so`` of this build (``$GPUSLICE_LIB`` or
  ``<target>/<profile>/libgpuslice.so``), for tests that run the clients under the shim.

Build artifacts (``gpuslice-burn``, ``libgpuslice.so``) are looked up in ``$GPUSLICE_PROFILE_DIR``,
else ``$CARGO_TARGET_DIR/debug``, else ``target/debug`` of the repository.
"""

import hashlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CLIENTS = pathlib.Path(__file__).resolve().parent / "clients"


@pytest.fixture(scope="session")
def fake_lib_dir():
    """Directory holding the fake libcuda.so.1 and libnvidia-ml.so.1."""
    d = os.environ.get("FAKEGPU_LIB_DIR")
    if not d:
        out = subprocess.run(
            ["bash", str(REPO / "scripts" / "fakegpu.sh")],
            cwd=REPO, check=True, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        ).stdout
        d = out.strip().splitlines()[-1]
    p = pathlib.Path(d)
    assert (p / "libcuda.so.1").exists(), f"no libcuda.so.1 in fake library dir {p}"
    return p


@pytest.fixture(scope="session")
def profile_dir():
    """target/<profile> of the build under test."""
    if os.environ.get("GPUSLICE_PROFILE_DIR"):
        return pathlib.Path(os.environ["GPUSLICE_PROFILE_DIR"])
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "debug"


def artifact(profile_dir, name):
    p = profile_dir / name
    if not p.exists():
        pytest.fail(f"{p} is missing: run `cargo build --workspace` first (scripts/test.sh does)")
    return p


@pytest.fixture(scope="session")
def gpuslice_bin(profile_dir):
    """Path of the gpuslice binary (the monitor and the CLI)."""
    return artifact(profile_dir, "gpuslice")


@pytest.fixture(scope="session")
def burn(profile_dir):
    """Path of the gpuslice-burn binary."""
    return artifact(profile_dir, "gpuslice-burn")


def wheel_dir(module):
    """Directory of an installed ``nvidia.*`` wheel package."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"{module} is not installed (pip install -r requirements-test.txt)")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


@pytest.fixture(scope="session")
def cuda_home(tmp_path_factory):
    """A minimal CUDA_HOME for numba, linked from NVIDIA's pip wheels.

    numba needs libnvvm and libdevice to compile kernels, and libcudart only to ask its version
    (which tells it the compute capabilities NVVM supports); none of them touches the driver.
    numba only accepts versioned names (``libnvvm.so.4``), as a toolkit installs them.
    """
    nvvm = wheel_dir("nvidia.cuda_nvcc") / "nvvm"
    cudart = wheel_dir("nvidia.cuda_runtime") / "lib"
    home = tmp_path_factory.mktemp("cuda_home")
    for src, dst in (
        (nvvm / "lib64/libnvvm.so", "nvvm/lib64/libnvvm.so"),
        (nvvm / "lib64/libnvvm.so", "nvvm/lib64/libnvvm.so.4"),
        (nvvm / "libdevice/libdevice.10.bc", "nvvm/libdevice/libdevice.10.bc"),
        (cudart / "libcudart.so.12", "lib64/libcudart.so.12"),
    ):
        assert src.exists(), f"{src} missing from its wheel"
        dst = home / dst
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.symlink_to(src)
    return home


@pytest.fixture
def gpu_env(tmp_path, fake_lib_dir, cuda_home, profile_dir):
    """Factory: the environment of a client process on a private fake GPU."""

    def make(devices=1, memory="16Gi", preload=False, **extra):
        env = {
            k: v
            for k, v in os.environ.items()
            # A developer's own settings must not leak into a test.
            if not k.startswith(("GPUSLICE_", "CUDA_DEVICE_", "FAKEGPU_", "NUMBA_"))
            and k not in ("LD_PRELOAD", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES")
        }
        state = tmp_path / "fakegpu"
        runtime = tmp_path / "ledger"
        state.mkdir(exist_ok=True)
        runtime.mkdir(exist_ok=True)
        env.update(
            LD_LIBRARY_PATH=str(fake_lib_dir),
            FAKEGPU_STATE_DIR=str(state),
            FAKEGPU_DEVICES=str(devices),
            FAKEGPU_MEMORY=memory,
            GPUSLICE_RUNTIME_DIR=str(runtime),
            CUDA_HOME=str(cuda_home),
            NUMBA_CUDA_USE_NVIDIA_BINDING="0",
            NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS="0",
            PYTHONDONTWRITEBYTECODE="1",
        )
        if preload:
            lib = os.environ.get("GPUSLICE_LIB") or str(artifact(profile_dir, "libgpuslice.so"))
            env["LD_PRELOAD"] = lib
        env.update({k: str(v) for k, v in extra.items()})
        return env

    return make


def last_json(stdout):
    for line in reversed(stdout.splitlines()):
        if line.lstrip().startswith("{"):
            return json.loads(line)
    return None


def run_client(name, env, *args, timeout=300):
    """Run tests/python/clients/<name>.py in a fresh interpreter; return its last JSON line.

    Fails the test with the client's output when it exits non-zero or prints no JSON.
    """
    return run_script(sys.executable, name, env, args, timeout)


def run_script(python, name, env, args, timeout):
    """Run tests/python/clients/<name>.py with interpreter `python`; return its last JSON line,
    failing the test with its output (stderr's last 6000 characters) when it exits non-zero or
    prints none."""
    cmd = [str(python), str(CLIENTS / f"{name}.py"), *map(str, args)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    out = last_json(p.stdout)
    if p.returncode != 0 or out is None:
        pytest.fail(f"{name} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr[-6000:]}")
    return out


@pytest.fixture
def client():
    """`client(name, env, *args)`: run a client script, return its JSON report."""
    return run_client


# --- the GPU frameworks (PyTorch, CuPy, JAX, TensorFlow) ---------------------------------------
#
# They live in their own venvs (scripts/framework-venvs.sh), one per requirements-<group>.txt,
# in a fixed cache directory shared by every checkout on the machine. A test that needs one and
# does not find it fails, naming the command that installs it: never a silent skip.

FRAMEWORK_CACHE = pathlib.Path(os.environ.get("GPUSLICE_FRAMEWORK_CACHE", "/var/cache/gpuslice-ci"))


def framework_venv(group):
    """The venv of requirements-<group>.txt, as scripts/framework-venvs.sh names it."""
    req = REPO / f"requirements-{group}.txt"
    digest = hashlib.sha256(req.read_bytes()).hexdigest()[:16]
    py = "%d%d" % sys.version_info[:2]
    venv = FRAMEWORK_CACHE / f"venv-{group}-py{py}-{digest}"
    if not (venv / ".complete").exists():
        pytest.fail(f"{venv} is not installed: run `bash scripts/framework-venvs.sh` "
                    f"(scripts/test.sh does)")
    return venv / "bin" / "python"


@pytest.fixture
def fw_env(gpu_env):
    """`fw_env(preload=..., **extra)`: gpu_env for a framework process (16 GiB device, kernels of
    FAKEGPU_KERNEL_US=1000 so launches take engine time, quiet framework logs)."""

    def make(preload=True, memory="16Gi", **extra):
        base = dict(FAKEGPU_KERNEL_US="1000", TF_CPP_MIN_LOG_LEVEL="2")
        base.update(extra)
        return gpu_env(memory=memory, preload=preload, **base)

    return make


def run_framework(group, name, env, *args, timeout=600):
    """Run tests/python/clients/<name>.py with the python of framework venv `group`; return its
    last JSON line (the test fails with the output when it exits non-zero or prints none)."""
    return run_script(framework_venv(group), name, env, args, timeout)


class Served:
    """A framework client in `serve` mode: `ask("alloc 256")` sends one command and returns its
    JSON answer. Use as a context manager; the process is killed on exit."""

    def __init__(self, group, name, env, *args, timeout=300, wait_ready=True):
        cmd = [str(framework_venv(group)), str(CLIENTS / f"{name}.py"), *map(str, args)]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.timeout = timeout
        self.ready = self._read() if wait_ready else None

    @property
    def pid(self):
        return self.proc.pid

    def read(self):
        """The client's next JSON line."""
        return self._read()

    def _read(self):
        import select
        while True:
            r, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
            if not r:
                self.stop()
                pytest.fail(f"no answer within {self.timeout} s; stderr:\n{self.proc.stderr.read()[-6000:]}")
            line = self.proc.stdout.readline()
            if not line:
                err = self.proc.stderr.read()
                self.stop()
                pytest.fail(f"client exited {self.proc.poll()}; stderr:\n{err[-6000:]}")
            if line.lstrip().startswith("{"):
                return json.loads(line)

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
