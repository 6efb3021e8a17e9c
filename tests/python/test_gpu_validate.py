"""scripts/gpu-validate.sh's real-GPU path, with stand-ins for the GPU machine.

The --fake run (tests/e2e/tests/gpu_validate.rs: every burn-based check and the node-mode
section, on the fake GPU) cannot reach the PyTorch/JAX/CuPy/nvidia-smi branches, and a real GPU
is rare: this test runs the script in its real mode with a stub `nvidia-smi`, a stub Python that
answers each workload in tests/gpu/ with a canned result, and a stub `gpuslice-burn`, so the
orchestration and the verdicts of those branches cannot rot. It proves nothing about a GPU; it
proves the script judges what it is given: good results pass, wrong ones fail with the reason,
crashes are failures, absent libraries are skips, and a section that cannot run fails without
stopping the checks after it. The node-mode verdicts a real driver may answer differently from
the fake (a context larger than the allowance, shared memory NVML counts to its importer) are
judged here from canned readings.
"""

import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-validate.sh"
GiB = 1 << 30

NVIDIA_SMI = r"""#!/bin/bash
case "$*" in
  *query-compute-apps*) echo "$PPID, $((520 + ${STUB_REAL_GROWTH_MIB:-3072}))" ;;
  *memory.total,memory.used*)
    if [[ -n ${LD_PRELOAD:-} ]]; then echo "4096, 3072"; else echo "143771, 3600"; fi ;;
  *) echo "0, NVIDIA H200, 570.00, 143771 MiB" ;;
esac
"""

# Canned workload results: what a correct gpuslice on a real H200 would make them print.
GOOD = {
    "torch_workload": {"ok": True, "matmul_sum": 1.0, "graph_sum": 1.0},
    "torch_memory": {
        "mem_get_info": {"free": 4 * GiB, "total": 4 * GiB},
        "total_memory": 4 * GiB,
        "tensors": 3,
        "tensors_again": 3,
        "oom": {"type": "torch.OutOfMemoryError", "is_torch_oom": True},
        "oom_again": {"type": "torch.OutOfMemoryError", "is_torch_oom": True},
        "free_after_empty_cache": 4 * GiB - (2 << 20),
        "smi_in_slice_full": {"total_mib": 4096, "used_mib": 3074},
        "smi_real_baseline": {"used_mib": 520},
        "smi_real_full": {"used_mib": 3594},
    },
    "jax_memory": {"skip": "jax not importable: No module named 'jax'"},
    "cupy_memory": {
        "mem_get_info": {"free": 4 * GiB, "total": 4 * GiB},
        "tensors": 4,
        "tensors_again": 4,
        "oom": {"type": "cupy.cuda.memory.OutOfMemoryError", "is_cupy_oom": True},
        "oom_again": {"type": "cupy.cuda.memory.OutOfMemoryError", "is_cupy_oom": True},
    },
}

PYSTUB = r"""#!/bin/bash
# Stands in for a Python with torch: real Python for the script's own helpers, canned answers
# (from $STUB_ANSWERS) for the workloads.
case "$1" in
  -c) [[ $2 == *"import torch"* ]] && { echo "2.5.1 12.4"; exit 0; }; exec "$REAL_PY" "$@" ;;
  *verdict.py) exec "$REAL_PY" "$@" ;;
  *torch_matmul_loop.py)
    rate=$("$REAL_PY" -c "import os; print(1000 * float(os.environ.get('GPUSLICE_COMPUTE', 1)))")
    echo "{\"rate\": $rate, \"matmuls\": 1, \"window_seconds\": 10}" ;;
  *torch_train.py)
    if [[ -n ${LD_PRELOAD:-} ]]; then echo "{\"step_seconds_median\": $STUB_SHIM_STEP}"
    else echo '{"step_seconds_median": 0.001}'; fi ;;
  *)
    name=$(basename "$1" .py)
    [[ $name == torch_workload ]] && echo "gpuslice: debug: cuGetProcAddress_v2(cuMemAlloc, 12000) -> gpuslice cuMemAlloc_v2" >&2
    [[ -e $STUB_ANSWERS/$name.crash ]] && { echo "Segmentation fault" >&2; exit 139; }
    cat "$STUB_ANSWERS/$name.json" ;;
esac
"""

BURN = r"""#!REAL_PY
# Stands in for gpuslice-burn on a GPU where gpuslice works as intended.
import json, os, sys
a = sys.argv[1:]
opt = lambda n, d=None: a[a.index(n) + 1] if n in a else d
wrapped = "LD_PRELOAD" in os.environ
share = float(os.environ.get("GPUSLICE_COMPUTE", os.environ.get("GPUSLICE_COMPUTE_CAP", 1))) if wrapped else 1.0
if os.environ.get("GPUSLICE_LOG") == "debug":
    print("gpuslice: debug: dlsym(libcuda, cuGetProcAddress_v2) -> gpuslice wrapper", file=sys.stderr)
secs = float(opt("--seconds", 0))
for i in range(1, int(secs) + 1) if "--report-interval" in a else ():
    print(json.dumps({"event": "interval", "t": float(i), "kernels": 1, "gpu_seconds": share, "gpu_fraction": share}))
out = {"kernels": int(secs * share * 1000), "gpu_seconds": secs * share, "wall_seconds": secs,
       "allocated_bytes": 0, "alloc_errors": [], "mem_total": 4 << 30 if wrapped else 141 << 30}
quota = 4 << 30 if "GPUSLICE_MEMORY" in os.environ else 1 << 50
for s in (opt("--alloc") or "").split(",") if opt("--alloc") else ():
    n = int(s[:-2]) << {"Gi": 30, "Mi": 20}[s[-2:]]
    if out["allocated_bytes"] + n <= quota:
        out["allocated_bytes"] += n
    else:
        out["alloc_errors"].append(2)
print(json.dumps(out))
"""


def libm_path():
    """A harmless real shared object to stand in for libgpuslice.so under LD_PRELOAD."""
    for line in open("/proc/self/maps"):
        if "/libm.so" in line or "/libm-" in line:
            return line.split()[-1]
    pytest.skip("no libm mapped in this Python")


def write(path, text, exe=False):
    path.write_text(text)
    if exe:
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_validate(tmp_path, answers, shim_step=0.001002, crash=(), only="personal"):
    bin_dir, target, ans = tmp_path / "bin", tmp_path / "target", tmp_path / "answers"
    for d in (bin_dir, target, ans):
        d.mkdir(exist_ok=True)
    write(bin_dir / "nvidia-smi", NVIDIA_SMI, exe=True)
    write(bin_dir / "pystub", PYSTUB, exe=True)
    write(target / "gpuslice-burn", BURN.replace("REAL_PY", sys.executable), exe=True)
    (target / "libgpuslice.so").symlink_to(libm_path())
    for name, obj in answers.items():
        write(ans / f"{name}.json", json.dumps(obj) + "\n")
    for name in crash:
        write(ans / f"{name}.crash", "")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSLICE_") and k != "LD_PRELOAD"}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        REAL_PY=sys.executable,
        STUB_ANSWERS=str(ans),
        STUB_SHIM_STEP=str(shim_step),
    )
    out = tmp_path / "res" / "run.txt"
    p = subprocess.run(
        ["bash", str(SCRIPT), "--target-dir", str(target), "--out", str(out), "--python", "pystub",
         "--seconds", "2", "--only", only],
        env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )
    res = json.loads((tmp_path / "res" / "run.json").read_text()) if (tmp_path / "res" / "run.json").exists() else None
    return p, res


def by_name(res):
    return {c["check"]: c for c in res["checks"]}


def test_good_results_pass_and_absent_libraries_skip(tmp_path):
    p, res = run_validate(tmp_path, GOOD)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.rstrip().splitlines()[-1].endswith("0 failed, 1 skipped"), p.stdout
    checks = by_name(res)
    assert res["meta"]["mode"] == "real" and "H200" in res["meta"]["gpu"]
    assert checks["jax memory 4Gi"]["status"] == "SKIP"
    for name in ("symbols: pytorch", "pytorch memory 4Gi default", "pytorch memory 4Gi cudaMallocAsync",
                 "cupy memory 4Gi", "shares 0.25/0.75: pytorch matmul", "overhead: pytorch training step",
                 "shares 0.25/0.75: burn graph", "cap 0.3 alone: burn"):
        assert checks[name]["status"] == "PASS", checks[name]
    assert "+0.20%" in checks["overhead: pytorch training step"]["measured"]
    sym = (tmp_path / "res" / "run.logs" / "symbols-torch.log").read_text()
    assert "cuGetProcAddress_v2(cuMemAlloc" in sym


def test_wrong_results_fail_with_the_reason(tmp_path):
    bad = json.loads(json.dumps(GOOD))
    # The quota not shown to torch, and OOM surfacing as a generic CUDA error.
    bad["torch_memory"]["total_memory"] = 141 * GiB
    bad["torch_memory"]["oom"] = {"type": "builtins.RuntimeError", "is_torch_oom": False,
                                  "message": "CUDA error: out of memory"}
    p, res = run_validate(tmp_path, bad, shim_step=0.00103, crash=["cupy_memory"])
    assert p.returncode == 1, p.stdout + p.stderr
    checks = by_name(res)
    mem = checks["pytorch memory 4Gi default"]
    assert mem["status"] == "FAIL" and "total_memory" in mem["note"] and "RuntimeError" in mem["note"], mem
    cupy = checks["cupy memory 4Gi"]
    assert cupy["status"] == "FAIL" and "signal 11" in cupy["note"], cupy
    over = checks["overhead: pytorch training step"]
    assert over["status"] == "FAIL" and "+3.00%" in over["measured"], over
    assert checks["shares 0.25/0.75: burn plain"]["status"] == "PASS"
    text = (tmp_path / "res" / "run.txt").read_text()
    assert text.rstrip().splitlines()[-1] == p.stdout.rstrip().splitlines()[-1]


def test_burn_shares_are_measured_over_the_window_all_tenants_ran(tmp_path):
    """A tenant that starts 3 s after its neighbour had the device alone meanwhile: its share
    counts only while both ran (CLOCK_MONOTONIC from burn's interval lines), not over its own
    run less a margin, which would credit the neighbour's solo seconds to the pair."""
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    import verdict

    def burn_out(name, start, per_second):
        lines = [json.dumps({"event": "interval", "t": i + 1.0, "mono": start + i + 1.0,
                             "gpu_seconds": g}) for i, g in enumerate(per_second)]
        (tmp_path / f"{name}.out").write_text("\n".join(lines) + "\n")
        return str(tmp_path / name)

    # early: alone for 3 s (1.0 of the device), then 0.75 for 8 s; late: 0.25 for 8 s.
    early = burn_out("early", 100.0, [1.0] * 3 + [0.75] * 8)
    late = burn_out("late", 103.0, [0.25] * 8)
    lo, hi = verdict.common_window([early, late], 1.0)
    assert (lo, hi) == (104.0, 110.0)
    share, span, worst, best = verdict.window_share(early, {}, 1.0, (lo, hi))
    assert share == pytest.approx(0.75) and span == pytest.approx(6.0) and worst == best
    # Its own run less the margin would have mixed in the solo seconds.
    own, _, _, _ = verdict.window_share(early, {"wall_seconds": 11.0}, 1.0)
    assert own > 0.8
    assert verdict.common_window([early, str(tmp_path / "absent")], 1.0) is None


def test_a_node_section_that_cannot_run_fails_and_the_later_checks_still_run(tmp_path):
    """Node mode needs the `gpuslice` binary (and root): without it every node-mode check is a
    FAIL naming why, and the PyTorch checks that come after it still run and pass."""
    p, res = run_validate(tmp_path, GOOD, only="all")
    assert p.returncode == 1, p.stdout + p.stderr
    checks = by_name(res)
    node = [c for n, c in checks.items() if n.startswith(("node:", "context:"))]
    assert len(node) == 10, checks.keys()
    why = "gpuslice is missing" if os.geteuid() == 0 else "needs root"
    for c in node:
        assert c["status"] == "FAIL" and why in c["note"], c
    for name in ("shares 0.25/0.75: pytorch matmul", "overhead: pytorch training step"):
        assert checks[name]["status"] == "PASS", checks[name]


# ---- node-mode verdicts, from readings a real driver could give ----

MiB = 1 << 20


def judge(tmp_path, fn, **args):
    """verdict.py's `fn` on `args`; the one record it wrote."""
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    import argparse
    import verdict

    records = tmp_path / "records.jsonl"
    getattr(verdict, fn)(verdict.Recorder(str(records)), argparse.Namespace(name=fn, **args))
    return json.loads(records.read_text().splitlines()[-1])


def result(tmp_path, name, obj, holding=None):
    """A workload's output files (`BASE.out`, `.rc`), as the script leaves them; its BASE."""
    base = tmp_path / name
    lines = ([json.dumps({"event": "holding", **holding})] if holding else []) + [json.dumps(obj)]
    (tmp_path / f"{name}.out").write_text("\n".join(lines) + "\n")
    (tmp_path / f"{name}.rc").write_text("0\n")
    (tmp_path / f"{name}.err").write_text("")
    return str(base)


def nvml(used, procs, total=80 * GiB):
    return {"nvml": {"total": total, "free": total - used, "used": used, "procs": procs}}


@pytest.mark.parametrize("context_mib, status", [(480, "PASS"), (600, "FAIL")])
def test_a_context_is_judged_against_the_allowance(tmp_path, context_mib, status):
    ctx = context_mib * MiB
    quiet = result(tmp_path, "quiet", nvml(0, {}))
    held = result(tmp_path, "held", nvml(ctx + 2 * MiB, {"77": ctx + 2 * MiB}))
    holder = result(tmp_path, "holder", {}, holding={"pid": 77, "allocated_bytes": 2 * MiB})
    r = judge(tmp_path, "node_context", quiet=quiet, holding=held, holder=holder, allowance=512 * MiB)
    assert r["status"] == status, r
    assert r["numbers"]["context_bytes_nvml_process"] == ctx
    # The fake's default for an 80 GiB card (1/32, at most 512 MiB), for #34 to compare with.
    assert r["numbers"]["fake_default_bytes"] == 512 * MiB and "512MiB" in r["measured"], r


def share_result(importer_grows, exporter_slice_after_exit=256 * MiB):
    n = 256 * MiB
    slice_a = lambda used, held=0, pids=(1,): {"name": "tenant-a", "memory_used": used,
                                               "held_for_importers": held, "pids": list(pids)}
    own = {"name": "pid-2", "memory_used": 0, "pids": [2]}
    snap = lambda ex, im, a: {"exporter_nvml": ex, "importer_nvml": im, "nvml_used": 0, "nvml_procs": {},
                              "exporter_slice": a, "importer_slice": own}
    return {
        "kind": "vmm", "mib": 256, "pids": {"exporter": 1, "importer": 2}, "made_status": 0,
        "import_status": 0, "read_ok": True, "read_ok_after_exit": True, "audit_lines": [],
        "contexts": snap(500 * MiB, 500 * MiB, slice_a(0)),
        "shared": snap(500 * MiB + n, 500 * MiB + importer_grows, slice_a(n)),
        "exporter_gone": snap(None, 500 * MiB + n, slice_a(exporter_slice_after_exit,
                                                           exporter_slice_after_exit, ())),
        "after": snap(None, 500 * MiB, slice_a(0, 0, ())),
    }


def test_shared_memory_is_judged_charged_once(tmp_path):
    good = judge(tmp_path, "node_share", base=result(tmp_path, "good", share_result(0)))
    assert good["status"] == "PASS", good
    # After its exporter exited NVML counting it to the importer is recorded, not judged.
    assert "NVML counts it to the importer" in good["measured"], good
    twice = judge(tmp_path, "node_share", base=result(tmp_path, "twice", share_result(256 * MiB)))
    assert twice["status"] == "FAIL" and "more to the importer" in twice["note"], twice
    dropped = judge(tmp_path, "node_share", base=result(tmp_path, "dropped", share_result(0, 0)))
    assert dropped["status"] == "FAIL" and "after the exporter exited" in dropped["note"], dropped
