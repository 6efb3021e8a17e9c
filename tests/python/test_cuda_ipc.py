"""Device memory shared between processes through the driver API (issue 23): legacy CUDA IPC
handles and VMM allocations exported as POSIX fds, between real processes (clients/cuda_ipc.py,
ctypes on the fake GPU), without and under libgpuslice.so with a monitor that kills slices
over quota.

What the driver does, and the fake must: both processes see the same bytes; the memory is
counted to the process that allocated it, never to an importer, until its last holder lets go
(an exporter's free or release does not end it while an importer maps it); the errors for
opening a handle in its own process, a handle of freed memory, and closing twice.
"""
import json
import subprocess
import sys
import time

import pytest

from conftest import CLIENTS, Served
from helpers import Monitor, wait_until
from test_node_balloons import node_monitor  # noqa: F401 (a fixture)

GI = 1 << 30
MI = 1 << 20
# What each process's context takes on the fake's default 16 GiB device (docs/fakegpu.md): NVML
# counts it to the process, beside what it allocated.
CTX = 512 * MI
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NOT_READY = 600


class Client(Served):
    """clients/cuda_ipc.py ROLE SOCKET in serve mode, run by this interpreter (ctypes only)."""

    def __init__(self, env, role, sock):
        cmd = [sys.executable, str(CLIENTS / "cuda_ipc.py"), role, str(sock)]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.timeout = 120
        self.ready = self._read()


def handed(exporter, importer, command, send="send"):
    """`send` on the exporter (it listens), `command` on the importer (it connects); the
    importer's answer (the exporter's is left in `exporter.sent`)."""
    assert exporter.ask(send)["event"] == "listening"
    got = importer.ask(command)
    exporter.sent = exporter.read()
    assert "error" not in exporter.sent, exporter.sent
    return got


def held(mon):
    """What the monitor's NVML audit sees the slices hold, those holding anything, sorted."""
    return sorted(v for v in mon.observed().values() if v)


def used_by(info, pid):
    return info["nvml_procs"].get(str(pid), 0)


def test_legacy_ipc_handles_behave_as_the_driver(gpu_env, tmp_path):
    env = gpu_env()
    sock = tmp_path / "ipc.sock"
    with Client(env, "ipc-export", sock) as e, Client(env, "ipc-import", sock) as i:
        e.ask("alloc_shared 64")
        assert e.ask("own")["status"] == CUDA_ERROR_INVALID_CONTEXT, "opened in its own process"
        got = handed(e, i, "open")
        assert got["status"] == 0 and got["read_ok"], got
        # Counted once, to the exporter (NVML's per-process figures and the device's free).
        assert used_by(got, e.pid) == 64 * MI + CTX and used_by(got, i.pid) == CTX, got
        assert got["free"] == got["total"] - 64 * MI - 2 * CTX, got
        again = i.ask("reopen")
        assert again["status"] == 0 and again["ptr"] == got["ptr"], "the same mapping, counted twice"
        # The exporter frees it while the importer still maps it: the driver keeps it (and
        # counts it to its allocator) until the last close.
        freed = e.ask("free")
        assert freed["status"] == 0 and used_by(freed, e.pid) == 64 * MI + CTX, freed
        assert i.ask("close")["status"] == 0
        assert used_by(e.ask("info"), e.pid) == 64 * MI + CTX, "one open left"
        last = i.ask("close")
        assert last["status"] == 0 and used_by(last, e.pid) == CTX, last
        assert last["free"] == last["total"] - 2 * CTX, last
        assert i.ask("close")["status"] == CUDA_ERROR_INVALID_VALUE, "closing twice"
        assert i.ask("reopen")["status"] == CUDA_ERROR_INVALID_VALUE, "a handle of freed memory"


def test_vmm_fd_charged_to_its_creator_only(gpu_env, gpuslice_bin, tmp_path):
    """A VMM allocation exported as a POSIX fd to a process of another slice, each slice with
    a 1 GiB quota, under `gpuslice monitor --on-violation kill`."""
    # NVML's figures count each process's context (the fake models it) and the quota does
    # not: the audit allows each process its context (`--context-allowance`,
    # docs/operations.md), so the importer filling its quota is no violation.
    env = gpu_env(preload=True, GPUSLICE_MEMORY="1Gi")
    sock = tmp_path / "vmm.sock"
    mon = Monitor(gpuslice_bin, env)
    try:
        with Client(env, "vmm-export", sock) as x, Client(env, "vmm-import", sock) as m:
            made = x.ask("create 256")
            assert made["status"] == 0 and made["free"] == GI - 256 * MI, made
            got = handed(x, m, "import")
            assert got["status"] == 0 and got["read_ok"], got
            # The importer's slice is not charged: its whole quota is free, and all of it fits.
            assert got["free"] == GI and got["total"] == GI, got
            # NVML inside each slice says what the driver would: the memory is the creator's.
            assert made["nvml_used"] == 256 * MI and used_by(made, x.pid) == 256 * MI, made
            assert got["nvml_used"] == 0 and got["nvml_procs"] == {str(m.pid): 0}, got
            own = m.ask("alloc 1024")
            assert own["status"] == 0 and own["free"] == 0, own
            # The creator releases and unmaps its handle while the importer still maps it: the
            # driver keeps the memory, and the creator's slice stays charged.
            assert x.ask("release")["free"] == GI - 256 * MI
            left = x.ask("unmap")
            assert left["unmap"] == 0 and left["free"] == GI - 256 * MI, left
            # The audit sees each slice hold its own: the creator 256 MiB, the importer 1 GiB,
            # each beside its context.
            assert wait_until(lambda: held(mon) == [256 * MI + CTX, GI + CTX], 20), (
                mon.observed(), mon.log())
            # The last mapping goes: the driver frees the memory (NVML no longer counts it to
            # the creator), and the creator's slice is no longer charged for it.
            gone = m.ask("unmap")
            assert gone["unmap"] == 0 and gone["release"] == 0, gone
            assert wait_until(lambda: held(mon) == [CTX, GI + CTX], 20), mon.observed()
            assert x.ask("info")["free"] == GI
            assert x.proc.poll() is None and m.proc.poll() is None, "nobody was killed"
        assert "audit:" not in mon.log(), mon.log()
    finally:
        mon.stop()


def slices_used(gpuslice_bin, env, key="memory_used"):
    """{slice: bytes used} (or another of its `key`s) from `gpuslice status --json`."""
    st = json.loads(subprocess.run([str(gpuslice_bin), "status", "--json"], env=env, check=True,
                                   capture_output=True, text=True, timeout=60).stdout)
    return {s["name"]: s[key] for s in st["slices"]}


@pytest.mark.parametrize("exporter_end,importer_end",
                         [("exit", "unmap"), ("kill", "unmap"), ("exit", "kill"), ("kill", "exit")])
def test_a_vmm_export_stays_charged_past_its_exporter_until_the_last_importer_lets_go(
        gpu_env, gpuslice_bin, tmp_path, exporter_end, importer_end):
    """Issue 23: the exporter of a VMM allocation (slice `x`) exits or is SIGKILLed while the
    importer (slice `y`) maps it: the driver keeps the memory, and `x` stays charged for it
    (`gpuslice status --json`) until the importer unmaps it, exits or is SIGKILLed; `y` is
    never charged. Under `gpuslice monitor --on-violation kill`: nothing reported or killed."""
    def env(name):
        return gpu_env(preload=True, GPUSLICE_MEMORY="1Gi", GPUSLICE_SLICE=name)
    xenv, ienv = env("x"), env("y")
    sock = tmp_path / "vmm.sock"
    mon = Monitor(gpuslice_bin, xenv)
    try:
        with Client(xenv, "vmm-export", sock) as x, Client(ienv, "vmm-import", sock) as m:
            assert x.ask("create 256")["status"] == 0
            got = handed(x, m, "import")
            assert got["status"] == 0 and got["read_ok"] and got["free"] == GI, got
            assert slices_used(gpuslice_bin, xenv) == {"x": 256 * MI, "y": 0}
            if exporter_end == "exit":
                assert x.ask("exit")["event"] == "exit" and x.proc.wait(timeout=30) == 0
            else:
                x.proc.kill()
                x.proc.wait(timeout=30)
            # The driver keeps the memory for the importer, and x stays charged for it, before
            # and after the monitor reaps the exporter.
            assert slices_used(gpuslice_bin, xenv) == {"x": 256 * MI, "y": 0}
            assert wait_until(lambda: "reaped pid" in mon.log(), 20), mon.log()
            still = m.ask("read")
            assert still["read_ok"] and still["free"] == GI, still
            assert slices_used(gpuslice_bin, xenv) == {"x": 256 * MI, "y": 0}
            held = slices_used(gpuslice_bin, xenv, "memory_held_for_importers")
            assert held == {"x": 256 * MI, "y": 0}, held
            if importer_end == "unmap":
                gone = m.ask("unmap")
                assert gone["unmap"] == 0 and gone["release"] == 0, gone
                assert slices_used(gpuslice_bin, xenv) == {"y": 0}
            elif importer_end == "exit":
                assert m.ask("exit")["event"] == "exit" and m.proc.wait(timeout=30) == 0
            else:
                m.proc.kill()
                m.proc.wait(timeout=30)
            assert wait_until(lambda: "x" not in slices_used(gpuslice_bin, xenv), 20), (
                slices_used(gpuslice_bin, xenv), mon.log())
            assert importer_end != "unmap" or m.proc.poll() is None, "the importer was killed"
        assert "audit:" not in mon.log(), mon.log()
    finally:
        mon.stop()


@pytest.mark.parametrize("exporter_end", ["exit", "kill"])
def test_in_node_mode_a_vmm_export_stays_charged_past_its_exporter(
        gpu_env, gpuslice_bin, node_monitor, tmp_path, exporter_end):
    """The same in node mode (the root monitor keeps the records, asked over `monitor.sock`;
    `--on-violation kill`): the exporter's slice `x` stays charged while the importer maps the
    memory, past the exporter's exit or SIGKILL; the importer's unmap returns it. Nothing
    reported or killed."""
    node_monitor("--on-violation", "kill")
    def env(name):
        return gpu_env(preload=True, GPUSLICE_MEMORY="1Gi", GPUSLICE_SLICE=name)
    xenv, ienv = env("x"), env("y")
    sock = tmp_path / "vmm-node.sock"
    used = lambda: {k.split("/")[-1]: v for k, v in slices_used(gpuslice_bin, xenv).items()}
    # Node mode charges each process's context inside its slice's quota (CTX each).
    with Client(xenv, "vmm-export", sock) as x, Client(ienv, "vmm-import", sock) as m:
        assert x.ask("create 256")["status"] == 0
        got = handed(x, m, "import")
        assert got["status"] == 0 and got["read_ok"] and got["free"] == GI - CTX, got
        assert wait_until(lambda: used() == {"x": 256 * MI + CTX, "y": CTX}, 20), used()
        if exporter_end == "exit":
            assert x.ask("exit")["event"] == "exit" and x.proc.wait(timeout=30) == 0
        else:
            x.proc.kill()
            x.proc.wait(timeout=30)
        assert wait_until(lambda: "reaped pid" in node_monitor.log(), 20), node_monitor.log()
        still = m.ask("read")
        assert still["read_ok"] and still["free"] == GI - CTX, still
        assert used() == {"x": 256 * MI, "y": CTX}, node_monitor.log()
        gone = m.ask("unmap")
        assert gone["unmap"] == 0 and gone["release"] == 0, gone
        assert wait_until(lambda: "x" not in used(), 20), (used(), node_monitor.log())
        assert m.proc.poll() is None
    assert "audit:" not in node_monitor.log(), node_monitor.log()


CUDA_ERROR_OUT_OF_MEMORY = 2


def orphan_case(gpu_env, gpuslice_bin, tmp_path, reaped, exporter_end, node=False):
    """The exporter (slice `x`) sends its VMM fd to the importer (slice `y`), which keeps it
    without importing; the exporter ends (`exit`, `kill`, or `let-go`: release and unmap,
    then exit); once reaped, nobody is charged for the memory the descriptor keeps alive
    (`node`: `x` stays charged while the importers hold its descriptor, and the import moves
    the charge). The importer's import then charges `y` (its whole quota less 256 MiB free),
    its unmap returns it (`node`: once the monitor finds no descriptor left, both importers
    having closed theirs); over a 128 MiB quota (slice `small`) the import is refused with
    CUDA_ERROR_OUT_OF_MEMORY and charges nothing."""
    def env(name, quota="1Gi"):
        return gpu_env(preload=True, GPUSLICE_MEMORY=quota, GPUSLICE_SLICE=name)
    # Node mode charges each process's context inside its slice's quota: `small` has room for
    # its context and 128 MiB.
    c = CTX if node else 0
    xenv, ienv = env("x"), env("y")
    senv = env("small", f"{(128 * MI + c) // MI}Mi")
    sock = tmp_path / "vmm-orphan.sock"
    used = lambda: {k.split("/")[-1]: v for k, v in slices_used(gpuslice_bin, xenv).items()}
    with Client(xenv, "vmm-export", sock) as x, Client(ienv, "vmm-import", sock) as m, \
            Client(senv, "vmm-import", sock) as small:
        assert x.ask("create 256")["status"] == 0
        assert handed(x, m, "receive")["received"]
        assert handed(x, small, "receive")["received"]
        if exporter_end == "let-go":
            assert x.ask("release")["status"] == 0 and x.ask("unmap")["unmap"] == 0
            assert wait_until(lambda: used().get("x") == 256 * MI, 20), (
                "kept until it exits: the descriptor is on its way", used())
        if exporter_end == "kill":
            x.proc.kill()
            x.proc.wait(timeout=30)
        else:
            assert x.ask("exit")["event"] == "exit" and x.proc.wait(timeout=30) == 0
        assert wait_until(lambda: "reaped pid" in reaped(), 20), reaped()
        if node:
            time.sleep(2.5)  # past a scan or two of /proc/*/fd
            assert used().get("x") == 256 * MI, ("the descriptors hold it", used())
        else:
            assert wait_until(lambda: "x" not in used(), 20), used()
        refused = small.ask("import")
        assert refused["status"] == CUDA_ERROR_OUT_OF_MEMORY, refused
        assert refused["free"] == 128 * MI, refused
        got = m.ask("import")
        assert got["status"] == 0 and got["read_ok"], got
        assert got["free"] == GI - 256 * MI - c, ("charged as its own allocation", got)
        assert wait_until(lambda: used() == {"y": 256 * MI + c, "small": c}, 20), used()
        gone = m.ask("unmap")
        assert gone["unmap"] == 0 and gone["release"] == 0, gone
        assert node or gone["free"] == GI, gone
        assert wait_until(lambda: used() == {"y": c, "small": c}, 20), used()
        assert m.ask("info")["free"] == GI - c
        assert m.proc.poll() is None and small.proc.poll() is None
    assert "audit:" not in reaped(), reaped()


@pytest.mark.parametrize("exporter_end", ["exit", "kill", "let-go"])
def test_a_descriptor_imported_after_its_exporter_ended_charges_the_importer(
        gpu_env, gpuslice_bin, tmp_path, exporter_end):
    """The quota escape of exporting, handing the descriptor to a friend and exiting: the
    friend's import is charged to its own slice (personal ledger, `--on-violation kill`)."""
    mon = Monitor(gpuslice_bin, gpu_env(preload=True, GPUSLICE_MEMORY="1Gi"))
    try:
        orphan_case(gpu_env, gpuslice_bin, tmp_path, mon.log, exporter_end)
    finally:
        mon.stop()


@pytest.mark.parametrize("exporter_end", ["exit", "kill"])
def test_in_node_mode_a_descriptor_imported_after_its_exporter_ended_charges_the_importer(
        gpu_env, gpuslice_bin, node_monitor, tmp_path, exporter_end):
    """The same in node mode: the exporter's slice stays charged while a descriptor is open;
    the monitor charges the importer's slice (in its region) and makes it the record's
    exporter when it asks `share-import`."""
    node_monitor("--on-violation", "kill")
    orphan_case(gpu_env, gpuslice_bin, tmp_path, node_monitor.log, exporter_end, node=True)


def test_in_node_mode_another_tenant_can_neither_release_nor_pin_an_export(
        gpu_env, gpuslice_bin, node_monitor, tmp_path):
    """A third admitted process (slice `h`), hand-making `share-*` requests on `monitor.sock`
    as its shim would: letting go of or leaving every record, importing with a descriptor it
    holds (/dev/null, not the export's). The exporter's slice stays charged while the real
    importer maps the memory, and goes when it unmaps: the forger released nothing early and
    pins nothing; its own slice is never charged."""
    node_monitor("--on-violation", "kill")
    def env(name):
        return gpu_env(preload=True, GPUSLICE_MEMORY="1Gi", GPUSLICE_SLICE=name)
    xenv, ienv, henv = env("x"), env("y"), env("h")
    sock = tmp_path / "vmm-forge.sock"
    used = lambda: {k.split("/")[-1]: v for k, v in slices_used(gpuslice_bin, xenv).items()}
    with Client(xenv, "vmm-export", sock) as x, Client(ienv, "vmm-import", sock) as m, \
            Client(henv, "vmm-import", tmp_path / "unused.sock") as h:
        assert x.ask("create 256")["status"] == 0
        assert handed(x, m, "import")["read_ok"]
        def forge_all():
            for rec in ("0", "1", "2", "255", "256", "-1", "x"):
                for op in ("share-let-go", "share-leave"):
                    r = h.ask(f"forge {op} {rec}")["reply"]
                    assert r.get("ok") in ("keep", "left") or "err" in r, (op, rec, r)
            r = h.ask("forge share-import devnull")["reply"]
            assert r.get("ok") == "-", r
        forge_all()
        # Each process's context is charged inside its slice (node mode).
        assert used() == {"x": 256 * MI + CTX, "y": CTX, "h": CTX}
        x.proc.kill()
        x.proc.wait(timeout=30)
        assert wait_until(lambda: "reaped pid" in node_monitor.log(), 20), node_monitor.log()
        forge_all()
        assert used() == {"x": 256 * MI, "y": CTX, "h": CTX}, "released early"
        assert m.ask("unmap")["unmap"] == 0
        assert wait_until(lambda: used() == {"y": CTX, "h": CTX}, 20), "pinned"
        assert m.proc.poll() is None and h.proc.poll() is None
    assert "audit:" not in node_monitor.log(), node_monitor.log()


def test_an_importer_that_dies_or_exits_holding_leaves_nothing_held(gpu_env, tmp_path):
    """An importer SIGKILLed while it maps shared memory: once the exporter lets go, the memory
    is free again. One that exits without closing, after the exporter let go: free at its exit
    (the driver drops a gone process's references)."""
    env = gpu_env()
    cases = [("ipc", "alloc_shared 64", ["free"]), ("vmm", "create 64", ["release", "unmap"])]
    for (role, make, release), end in [(c, e) for c in cases for e in ("kill", "exit")]:
        sock = tmp_path / f"{role}-{end}.sock"
        with Client(env, f"{role}-export", sock) as e, Client(env, f"{role}-import", sock) as i:
            e.ask(make)
            got = handed(e, i, "open" if role == "ipc" else "import")
            assert got["status"] == 0 and got["read_ok"], (role, got)
            if end == "kill":
                i.proc.kill()
                i.proc.wait(timeout=30)
            for command in release:
                left = e.ask(command)
            if end == "exit":
                assert used_by(left, e.pid) == 64 * MI + CTX, ("still mapped by the importer", left)
                assert i.ask("exit")["event"] == "exit" and i.proc.wait(timeout=30) == 0
                left = e.ask("info")
            # Left: the exporter's own context.
            assert used_by(left, e.pid) == CTX and left["free"] == left["total"] - CTX, (role, end, left)


def test_a_vmm_handle_released_while_mapped_stays_charged_until_unmapped(gpu_env, tmp_path):
    """The driver frees a VMM allocation when it is released *and* unmapped (NCCL and UCX
    release right after mapping): the slice stays charged until the unmap, never less than
    the driver holds."""
    env = gpu_env(preload=True, GPUSLICE_MEMORY="1Gi")
    with Client(env, "vmm-export", tmp_path / "unused.sock") as x:
        assert x.ask("create 256")["free"] == GI - 256 * MI
        released = x.ask("release")
        assert released["status"] == 0 and released["free"] == GI - 256 * MI, released
        assert used_by(released, x.pid) == 256 * MI, ("the driver still holds it", released)
        gone = x.ask("unmap")
        assert gone["unmap"] == 0 and gone["free"] == GI and gone["nvml_used"] == 0, gone


def test_an_interprocess_event_is_seen_from_another_process(gpu_env, tmp_path):
    """The exporter records an interprocess event after a 5 s kernel: the importer's opened
    event is not ready at first, synchronizes until the kernel is done, then is complete."""
    env = gpu_env()
    sock = tmp_path / "event.sock"
    with Client(env, "ipc-export", sock) as e, Client(env, "ipc-import", sock) as i:
        got = handed(e, i, "event_open", send="event_send 5000")
        assert e.sent["without_flag"] == CUDA_ERROR_INVALID_VALUE, "needs CU_EVENT_INTERPROCESS"
        assert e.sent["own"] == CUDA_ERROR_INVALID_CONTEXT, "opened in its own process"
        assert got["status"] == 0 and got["first_query"] == CUDA_ERROR_NOT_READY, got
        assert got["sync"] == 0 and got["waited_s"] > 0, got
        assert got["after_query"] == 0 and got["stream_wait"] == 0 and got["destroy"] == 0, got


@pytest.mark.parametrize("order", [("retain", "unmap", "release", "release"),
                                   ("release", "retain", "unmap", "release"),
                                   ("retain", "release", "release", "unmap")])
@pytest.mark.parametrize("shim", [False, True])
def test_a_retained_vmm_handle_stays_charged_until_its_last_reference_goes(
        gpu_env, tmp_path, order, shim):
    """cuMemRetainAllocationHandle adds a reference the program must release. The driver (the
    fake, alone) keeps the memory while any reference or mapping is left, whatever the order;
    under the shim the slice stays charged exactly as long, is uncharged once, and a release
    too many changes nothing. Otherwise retain, unmap and release would leave a live,
    mappable handle charged to nobody."""
    env = gpu_env(preload=True, GPUSLICE_MEMORY="1Gi") if shim else gpu_env()
    # Under the shim NVML shows the slice's charges; alone, the fake's, with the context.
    ctx = 0 if shim else CTX
    with Client(env, "vmm-export", tmp_path / "unused.sock") as x:
        total = x.ready["total"]
        assert x.ask("create 256")["free"] == total - ctx - 256 * MI
        steps = list(order)
        for i, step in enumerate(steps):
            got = x.ask(step)
            assert got.get("status", got.get("unmap")) == 0, (step, got)
            assert step != "retain" or got["same"], got
            if i < len(steps) - 1:
                assert used_by(got, x.pid) == 256 * MI + ctx, ("the driver holds it", step, got)
                assert got["free"] == total - ctx - 256 * MI, ("still charged", step, got)
        assert used_by(got, x.pid) == ctx and got["free"] == total - ctx, ("all gone", got)
        again = x.ask("release")
        assert again["status"] == CUDA_ERROR_INVALID_VALUE, again
        assert again["free"] == total - ctx, again
        if shim:
            assert x.ask("alloc 1024")["status"] == 0, "the quota is whole, never more"
            assert x.ask("alloc 1")["status"] == CUDA_ERROR_OUT_OF_MEMORY


def test_an_importers_retained_reference_keeps_the_exporter_charged(
        gpu_env, gpuslice_bin, tmp_path):
    """An importer that retains its mapping's handle, then unmaps and releases its own, still
    holds the memory: its exporter's slice `x` stays charged past the exporter's exit until
    the retained reference is released (`--on-violation kill`: nothing reported or killed)."""
    def env(name):
        return gpu_env(preload=True, GPUSLICE_MEMORY="1Gi", GPUSLICE_SLICE=name)
    xenv, ienv = env("x"), env("y")
    mon = Monitor(gpuslice_bin, xenv)
    try:
        with Client(xenv, "vmm-export", tmp_path / "r.sock") as x, \
                Client(ienv, "vmm-import", tmp_path / "r.sock") as m:
            assert x.ask("create 256")["status"] == 0
            assert handed(x, m, "import")["status"] == 0
            assert m.ask("retain")["same"]
            gone = m.ask("unmap")
            assert gone["unmap"] == 0 and gone["release"] == 0, gone
            assert x.ask("exit")["event"] == "exit" and x.proc.wait(timeout=30) == 0
            assert wait_until(lambda: "reaped pid" in mon.log(), 20), mon.log()
            assert slices_used(gpuslice_bin, xenv) == {"x": 256 * MI, "y": 0}
            assert m.ask("release")["status"] == 0
            assert wait_until(lambda: "x" not in slices_used(gpuslice_bin, xenv), 20)
            assert slices_used(gpuslice_bin, xenv) == {"y": 0}
        assert "audit:" not in mon.log(), mon.log()
    finally:
        mon.stop()

