"""Judges what scripts/gpu-validate.sh measured, and writes its results.

The script runs each workload as a process whose stdout, stderr and exit status land in
`<base>.out`, `<base>.err`, `<base>.rc`. Each subcommand here reads such bases for one check,
compares the numbers with the check's target and appends one record (check, status, measured,
target, note, numbers) to the records file (JSON lines). `report` turns the records into the
results files (text and JSON) and prints the table, last. Keeping every threshold here keeps the
shell script pure orchestration.

Statuses: PASS, FAIL, SKIP (not applicable here: fake GPU, library absent). A workload that
crashed, hung or printed no result is a FAIL with its exit status and stderr tail.
"""

import argparse
import json
import os
import re
import statistics
import sys

GiB = 1 << 30
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY


class Skipped(Exception):
    """A workload said it cannot run here (its result has `skip`): the check is a SKIP."""


class Failed(Exception):
    """A workload did not produce a usable result."""


def load(base):
    """The JSON result a workload printed last, after checking it exited cleanly."""
    try:
        rc = int(open(base + ".rc").read().strip() or "-1")
    except (OSError, ValueError):
        rc = -1
    out = _read(base + ".out")
    line = next((ln for ln in reversed(out.splitlines()) if ln.lstrip().startswith("{")), None)
    obj = None
    if line is not None:
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
    if rc != 0 or obj is None:
        why = {124: "timed out", 137: "killed after timing out"}.get(rc)
        if why is None and rc > 128:
            why = f"killed by signal {rc - 128}"
        why = why or (f"exit status {rc}" if rc != 0 else "printed no JSON result")
        raise Failed(f"{os.path.basename(base)}: {why}; stderr: {tail(base + '.err')}")
    return obj


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def tail(path, n=3):
    """The last lines of a stderr file that say something, for a FAIL note."""
    lines = [ln.strip() for ln in _read(path).splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-400:] or "(empty)"


def pts(x):
    return f"{100 * x:.1f}%"


def gib(x):
    return f"{x / GiB:.2f}GiB"


class Recorder:
    def __init__(self, path):
        self.path = path

    def add(self, check, status, measured="", target="", note="", numbers=None):
        rec = {
            "check": check,
            "status": status,
            "measured": measured,
            "target": target,
            "note": note,
            "numbers": numbers or {},
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
        print(f"[{status}] {check}: " + " -- ".join(x for x in (measured, note) if x), file=sys.stderr)

    def verdict(self, check, notes, measured, target, numbers):
        """PASS when nothing was noted against the result, else FAIL with the notes."""
        self.add(check, "FAIL" if notes else "PASS", measured, target, "; ".join(notes), numbers)


def judged(fn):
    """Turns a workload failure or an unexpected shape into a FAIL record instead of a trace."""

    def run(rec, a):
        try:
            fn(rec, a)
        except Skipped as e:
            rec.add(a.name, "SKIP", note=str(e))
        except Failed as e:
            rec.add(a.name, "FAIL", "no result", note=str(e))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            rec.add(a.name, "FAIL", "unreadable result", note=f"{type(e).__name__}: {e}")

    return run


def unless_skipped(*objs):
    """Raises Skipped with the first `skip` reason among the workload results."""
    why = next((o["skip"] for o in objs if isinstance(o, dict) and "skip" in o), None)
    if why:
        raise Skipped(why)


def load_ran(base):
    """`load(base)` of a workload that ran: Skipped with its reason if it skipped."""
    o = load(base)
    unless_skipped(o)
    return o


# ---- burn-based checks (fake and real GPU) ----


def error_codes(v):
    """burn's alloc_errors, leniently: a list of codes or names, a {name: count} map, or a count."""
    if v is None:
        return []
    if isinstance(v, dict):
        v = list(v.keys())
    if isinstance(v, (int, float)):
        return ["?"] * int(v)
    out = []
    for e in v:
        if isinstance(e, dict):
            e = e.get("code", e.get("name", e))
        out.append(e)
    return out


def is_oom(e):
    return e == OOM or (isinstance(e, str) and ("OUT_OF_MEMORY" in e or e.strip() == "2"))


def quota_fill_notes(tag, o, quota, unit):
    """What is wrong with burn's report `o` of allocating `unit`-byte pieces past a quota of
    `quota` bytes (nothing when it got the quota, then out of memory, and was told the quota)."""
    notes = []
    got = int(o["allocated_bytes"])
    errs = error_codes(o.get("alloc_errors"))
    total = o.get("mem_total")
    if got > quota:
        notes.append(f"{tag}: {got} bytes allocated, over the quota {quota}")
    if got < quota - unit:
        notes.append(f"{tag}: only {got} bytes allocated under a quota of {quota}")
    if not any(is_oom(e) for e in errs):
        notes.append(f"{tag}: no CUDA_ERROR_OUT_OF_MEMORY among {errs}")
    if any(not is_oom(e) for e in errs):
        notes.append(f"{tag}: errors other than out-of-memory: {errs}")
    if total != quota:
        notes.append(f"{tag}: cuMemGetInfo total {total}, not the quota {quota}")
    return notes


def quota_fill_numbers(o):
    return {"allocated_bytes": int(o["allocated_bytes"]), "alloc_errors": error_codes(o.get("alloc_errors")),
            "mem_total": o.get("mem_total"), "mem": o.get("mem")}


@judged
def burn_alloc(rec, a):
    """Allocations of `unit` bytes up to the quota succeed, the next fails with OOM, cuMemGetInfo
    reports the quota as total, and a second process (after the first exited) gets the same
    amount: nothing leaked."""
    first, second = load(a.bases[0]), load(a.bases[1])
    nums = {"first": quota_fill_numbers(first), "second": quota_fill_numbers(second)}
    notes = quota_fill_notes("first", first, a.quota, a.unit) + quota_fill_notes("second", second, a.quota, a.unit)
    if nums["second"]["allocated_bytes"] != nums["first"]["allocated_bytes"]:
        notes.append("the second process got a different amount: memory not returned")
    rec.verdict(
        a.name,
        notes,
        f"total {gib(first.get('mem_total') or 0)}; {gib(nums['first']['allocated_bytes'])} then OOM; "
        f"again {gib(nums['second']['allocated_bytes'])}",
        f"total {gib(a.quota)}, OOM at it, same again",
        nums,
    )


def parse_pairs(pairs):
    out = []
    for p in pairs:
        base, _, target = p.rpartition(":")
        out.append((base, float(target)))
    return out


def intervals(base):
    """burn's `--report-interval` lines: (t at the end of the interval, its length, gpu_seconds,
    CLOCK_MONOTONIC seconds at its end or None)."""
    out, prev = [], 0.0
    for ln in _read(base + ".out").splitlines():
        if '"interval"' not in ln:
            continue
        try:
            o = json.loads(ln)
        except ValueError:
            continue
        if o.get("event") == "interval":
            mono = o.get("mono")
            t = float(o["t"])
            out.append((t, t - prev, float(o["gpu_seconds"]), float(mono) if mono is not None else None))
            prev = t
    return out


def common_window(bases, margin):
    """The CLOCK_MONOTONIC window in which every tenant ran (the latest first interval start to
    the earliest last interval end), less `margin` seconds at each side; None when a tenant
    printed no timestamped intervals."""
    froms, tos = [], []
    for base in bases:
        iv = [x for x in intervals(base) if x[3] is not None]
        if not iv:
            return None
        froms.append(iv[0][3] - iv[0][1])
        tos.append(iv[-1][3])
    return max(froms) + margin, min(tos) - margin


def window_share(base, o, margin, window=None):
    """The share a burn tenant achieved while all tenants ran: its interval reports inside the
    common `window` (CLOCK_MONOTONIC, see `common_window`), or, without one, inside its own run
    less the first and last `margin` seconds, or the whole run when it printed no intervals.
    Also the worst and best 1-interval shares inside that window."""
    iv = intervals(base)
    slack = 0.25  # interval lines come a little after each whole second
    if window is not None:
        lo, hi = window
        inside = [x for x in iv if x[3] - x[1] >= lo - slack and x[3] <= hi + slack]
    else:
        end = float(o.get("wall_seconds") or (iv[-1][0] if iv else 0))
        inside = [x for x in iv if x[0] - x[1] >= margin - slack and x[0] <= end - margin + slack]
    if len(inside) >= 2:
        span = sum(x[1] for x in inside)
        shares = [x[2] / x[1] for x in inside if x[1] > 0]
        return sum(x[2] for x in inside) / span, span, min(shares), max(shares)
    share = float(o["gpu_seconds"]) / float(o["wall_seconds"])
    return share, float(o["wall_seconds"]), None, None


@judged
def burn_shares(rec, a):
    """Each tenant's achieved share of the device (GPU time done over the wall-clock window in
    which all tenants ran) within `tol` of its target."""
    tenants = parse_pairs(a.pair)
    window = common_window([b for b, _ in tenants], a.margin)
    nums = {}
    for base, target in tenants:
        o = load(base)
        share, span, lo, hi = window_share(base, o, a.margin, window)
        nums[os.path.basename(base)] = {
            "target": target,
            "share": share,
            "window_seconds": span,
            "worst_interval_shares": [lo, hi],
            "gpu_seconds": o["gpu_seconds"],
            "wall_seconds": o["wall_seconds"],
            "kernels": o.get("kernels"),
            "event_seconds": o.get("event_seconds"),
        }
    together = sum(n["share"] for n in nums.values())
    ok = True
    notes = []
    shown = []
    for n in nums.values():
        share, target = n["share"], n["target"]
        if a.at_least is not None:
            ok &= share >= a.at_least
        elif a.of_total:
            # The scheduler's split of what the tenants got together: a starved CPU (the fake
            # on a busy machine) lowers both alike, and their sum says nothing of the split.
            n["part"] = share / together if together > 0 else 0.0
            ok &= abs(n["part"] - target) <= a.tol
        else:
            ok &= abs(share - target) <= a.tol
        shown.append(f"{share:.3f}")
    targets = "/".join(f"{t:g}" for _, t in tenants)
    if a.at_least is not None:
        target_txt = f">= {a.at_least:g}"
    elif a.of_total:
        target_txt = f"{targets} ±{100 * a.tol:g}pt of their sum (>= {a.min_sum:g})"
        notes.append("parts of the sum " + "/".join(f"{n['part']:.3f}" for n in nums.values()))
        if together < a.min_sum:
            ok = False
            notes.append(f"together they kept the device only {together:.3f} busy: the split means nothing")
    else:
        target_txt = f"{targets} ±{100 * a.tol:g}pt"
    if not ok:
        notes.append("achieved share off its target")
    span = min(n["window_seconds"] for n in nums.values())
    rec.add(
        a.name,
        "PASS" if ok else "FAIL",
        "/".join(shown) + f" over {span:.1f}s" + (f" (sum {together:.3f})" if len(nums) > 1 else ""),
        target_txt,
        "; ".join(notes),
        nums,
    )


RESOLVE = re.compile(r"dlsym|getprocaddress|proc.?address|resolv", re.I)


@judged
def symbols(rec, a):
    """The shim's debug lines about symbol resolution, for a workload that completed. The lines
    go to `--log-out` (the record for docs/architecture.md)."""
    o = load_ran(a.base)
    lines = [ln for ln in _read(a.base + ".err").splitlines() if ln.startswith("gpuslice:")]
    resolution = [ln for ln in lines if RESOLVE.search(ln)]
    with open(a.log_out, "w") as f:
        f.write("\n".join(resolution) + ("\n" if resolution else ""))
    names = sorted({m for ln in resolution for m in re.findall(r"\b(cu[A-Z]\w+|nvml\w+)", ln)})
    # "... -> who answered" (the shim's format); counted by answer, leniently.
    answers = {}
    for ln in resolution:
        who = ln.rsplit("->", 1)[1].strip() if "->" in ln else "?"
        answers[who] = answers.get(who, 0) + 1
    okw = o.get("ok", True)
    ok = bool(okw) and len(resolution) > 0
    note = []
    if not okw:
        note.append(f"workload failed: {o.get('error', o)}")
    if not resolution:
        note.append(f"no gpuslice: resolution lines at GPUSLICE_LOG=debug ({len(lines)} gpuslice: lines in all)")
    rec.add(
        a.name,
        "PASS" if ok else "FAIL",
        f"{len(resolution)} lookups, {len(names)} names; "
        + ", ".join(f"{n} {who}" for who, n in sorted(answers.items(), key=lambda x: -x[1])),
        "workload ok, lookups logged",
        "; ".join(note) or f"log: {a.log_out}",
        {"lookup_lines": len(resolution), "answers": answers, "gpuslice_lines": len(lines), "names": names,
         "workload": o},
    )


# ---- PyTorch / JAX / CuPy (real GPU only) ----


def _oom_ok(oom, flag):
    return isinstance(oom, dict) and bool(oom.get(flag))


@judged
def torch_memory(rec, a):
    o = load_ran(a.base)
    q = a.quota
    notes = []
    total = o["mem_get_info"]["total"]
    props = o["total_memory"]
    if total != q:
        notes.append(f"mem_get_info total {total} != quota {q}")
    if props != q:
        notes.append(f"total_memory {props} != quota {q}")
    n, n2 = o["tensors"], o["tensors_again"]
    if n * GiB > q or n < q // GiB - 1:
        notes.append(f"{n} GiB tensors fit under a {gib(q)} quota")
    if not _oom_ok(o["oom"], "is_torch_oom"):
        notes.append(f"stopped by {o['oom']} instead of torch.OutOfMemoryError")
    if n2 != n or not _oom_ok(o["oom_again"], "is_torch_oom"):
        notes.append(f"after empty_cache: {n2} tensors, stopped by {o['oom_again']}")
    if o["free_after_empty_cache"] < (n * GiB) * 0.9:
        notes.append(f"free after empty_cache {o['free_after_empty_cache']} bytes")
    smi = o.get("smi_in_slice_full", {})
    real0, real1 = o.get("smi_real_baseline", {}), o.get("smi_real_full", {})
    smi_txt = ""
    if "total_mib" in smi:
        smi_txt = f"; smi in slice {smi['used_mib']:g}/{smi['total_mib']:g}MiB"
        if abs(smi["total_mib"] - q / (1 << 20)) > 1 or smi["used_mib"] > smi["total_mib"]:
            notes.append(f"nvidia-smi inside the slice shows {smi}")
    else:
        notes.append(f"nvidia-smi inside the slice: {smi.get('error', smi)}")
    if "used_mib" in real0 and "used_mib" in real1:
        delta = (real1["used_mib"] - real0["used_mib"]) * (1 << 20)
        smi_txt += f"; real +{delta / (1 << 20):g}MiB"
        if delta > q:
            notes.append(f"real usage grew by {delta} bytes, over the quota")
    else:
        notes.append(f"nvidia-smi real usage: {real1.get('error', real1)}")
    rec.verdict(
        a.name,
        notes,
        f"total {gib(total)}/{gib(props)}; {n}x1GiB, "
        f"{(o['oom'] or {}).get('type', 'no error').rsplit('.', 1)[-1]}; again {n2}{smi_txt}",
        f"total {gib(q)}, torch OOM, again; smi",
        o,
    )


@judged
def jax_memory(rec, a):
    o = load_ran(a.base)
    notes = []
    lim = o.get("bytes_limit")
    if lim is None or lim > a.quota:
        notes.append(f"XLA's allocator limit {lim} is not within the quota {a.quota}")
    err = o.get("big_error")
    if not err or "RESOURCE_EXHAUSTED" not in err.get("message", "") + err.get("type", ""):
        notes.append(f"the 6 GiB computation ended with {err}, not RESOURCE_EXHAUSTED")
    if not (o.get("small_ok") and o.get("after_ok")):
        notes.append("small computations before/after gave wrong results")
    rec.verdict(
        a.name,
        notes,
        f"limit {gib(lim or 0)}; 6GiB -> {'RESOURCE_EXHAUSTED' if not notes or err else err}",
        f"limit <= {gib(a.quota)}; RESOURCE_EXHAUSTED; still computes",
        o,
    )


@judged
def cupy_memory(rec, a):
    o = load_ran(a.base)
    notes = []
    total = o["mem_get_info"]["total"]
    n, n2 = o["tensors"], o["tensors_again"]
    if total != a.quota:
        notes.append(f"memGetInfo total {total} != quota {a.quota}")
    if n * GiB > a.quota or n < a.quota // GiB - 1:
        notes.append(f"{n} GiB arrays fit")
    if not _oom_ok(o["oom"], "is_cupy_oom") or not _oom_ok(o["oom_again"], "is_cupy_oom"):
        notes.append(f"stopped by {o['oom']} / {o['oom_again']}")
    if n2 != n:
        notes.append(f"after free_all_blocks {n2} arrays fit, not {n}")
    rec.verdict(
        a.name,
        notes,
        f"total {gib(total)}; {n}x1GiB then OOM; again {n2}",
        f"total {gib(a.quota)}; OOM at quota; again after free",
        o,
    )


@judged
def torch_shares(rec, a):
    """Shares of two PyTorch matmul tenants: their rates over the common window divided by the
    rate of a solo, unwrapped run of the same loop."""
    solo = load_ran(a.solo)
    nums = {"solo_rate": solo["rate"]}
    ok = True
    shown = []
    notes = []
    for base, target in parse_pairs(a.pair):
        o = load(base)
        share = o["rate"] / solo["rate"]
        nums[os.path.basename(base)] = {"target": target, "share": share, **o}
        ok &= abs(share - target) <= a.tol
        shown.append(f"{share:.3f}")
        if o.get("late_start_seconds", 0) > 0.5:
            notes.append(f"{os.path.basename(base)} started {o['late_start_seconds']:.1f}s late")
    rec.add(
        a.name,
        "PASS" if ok else "FAIL",
        "/".join(shown) + f" of solo {solo['rate']:.0f} matmul/s",
        "/".join(f"{t:g}" for _, t in parse_pairs(a.pair)) + f" ±{100 * a.tol:g}pt",
        "; ".join(notes),
        nums,
    )


@judged
def overhead(rec, a):
    """Median step time with the shim over without, from interleaved runs."""
    plain = [load(b) for b in a.plain]
    shim = [load(b) for b in a.shim]
    unless_skipped(*plain, *shim)
    p = statistics.median(o["step_seconds_median"] for o in plain)
    s = statistics.median(o["step_seconds_median"] for o in shim)
    pct = 100 * (s / p - 1)
    rec.add(
        a.name,
        "PASS" if pct < a.target_pct else "FAIL",
        f"{1e3 * p:.3f}ms -> {1e3 * s:.3f}ms per step ({pct:+.2f}%)",
        f"< {a.target_pct:g}%",
        f"{len(plain)}+{len(shim)} interleaved runs",
        {
            "plain_step_seconds": [o["step_seconds_median"] for o in plain],
            "shim_step_seconds": [o["step_seconds_median"] for o in shim],
            "overhead_pct": pct,
        },
    )


# ---- node mode (a root monitor, balloons, tenants of other uids) ----

MiB = 1 << 20


def mib(x):
    return "?" if x is None else f"{x / MiB:.0f}MiB"


def holding(base):
    """burn's `{"event": "holding", ...}` line (pid, allocated_bytes) from a holder that is
    still running or was stopped after it (its exit status does not matter)."""
    for ln in _read(base + ".out").splitlines():
        if '"holding"' in ln:
            o = json.loads(ln)
            if o.get("event") == "holding":
                return o
    raise Failed(f"{os.path.basename(base)}: never held its allocations; stderr: {tail(base + '.err')}")


def fake_context(total):
    """The fake GPU's default context size for a device of `total` bytes (docs/fakegpu.md)."""
    return min(total // 32, 512 * MiB)


@judged
def node_context(rec, a):
    """A driver-API process's context (burn holding 2 MiB, unwrapped, on a quiet device): NVML's
    figure for it less what it allocated, and the device's used memory it added. It must fit
    `--context-allowance`, which the audit allows each process and a slice's balloon keeps free
    for its first process's context."""
    quiet, held, h = load(a.quiet)["nvml"], load(a.holding)["nvml"], holding(a.holder)
    alloc = int(h["allocated_bytes"])
    proc = held["procs"].get(str(h["pid"]))
    per_proc = None if proc is None else proc - alloc
    delta = held["used"] - quiet["used"] - alloc
    ctx = per_proc if per_proc is not None else delta
    fake = fake_context(held["total"])
    notes = []
    if ctx > a.allowance:
        notes.append(f"the context ({mib(ctx)}) does not fit --context-allowance {mib(a.allowance)}")
    if per_proc is None:
        notes.append(f"NVML lists no memory for pid {h['pid']}: {held['procs']}")
    nums = {"context_bytes_nvml_process": per_proc, "context_bytes_device_delta": delta, "allocated": alloc,
            "device_total": held["total"], "fake_default_bytes": fake, "allowance": a.allowance,
            "quiet": quiet, "holding": held}
    ratio = f" ({fake / ctx:.2f}x)" if ctx > 0 else ""
    rec.add(a.name, "FAIL" if ctx > a.allowance else "PASS",
            f"{mib(per_proc)} by NVML's process list, device +{mib(delta)}; the fake's default for "
            f"this card: {mib(fake)}{ratio}",
            f"<= --context-allowance {mib(a.allowance)}", "; ".join(notes), nums)


@judged
def torch_context(rec, a):
    o = load_ran(a.base)
    first, mm = o["first_tensor"], o["after_matmul"]
    ctx = mm["context_bytes"]
    notes = []
    if ctx is None:
        notes.append("NVML lists no memory for the process")
    elif ctx > a.allowance:
        notes.append(f"the context after a matmul ({mib(ctx)}) does not fit --context-allowance {mib(a.allowance)}")
    rec.verdict(a.name, notes,
                f"{mib(first['context_bytes'])} after the first tensor, {mib(ctx)} after a bf16 matmul "
                f"(NVML less torch's reserved)",
                f"<= --context-allowance {mib(a.allowance)}", o)


@judged
def node_monitor(rec, a):
    """The monitor alone, nothing reserved: its own device memory (one context per GPU)."""
    quiet, mon = load(a.quiet)["nvml"], load(a.monitor)["nvml"]
    proc = mon["procs"].get(str(a.pid))
    delta = mon["used"] - quiet["used"]
    notes = []
    if delta > a.allowance:
        notes.append(f"the monitor took {mib(delta)} with nothing reserved")
    rec.verdict(a.name, notes,
                f"{mib(proc)} by NVML's process list (pid {a.pid}), device +{mib(delta)}",
                f"one context, <= {mib(a.allowance)}",
                {"monitor_nvml_bytes": proc, "device_delta": delta, "quiet": quiet, "monitor": mon})


@judged
def node_balloons(rec, a):
    """Two slices' reservations (each its quota, which its contexts are charged inside) leave the
    driver's free memory: the monitor holds them (NVML counts them to its process)."""
    before, after_all = load(a.before), load(a.after)
    b, c = before["nvml"], after_all["nvml"]
    held = b["free"] - c["free"]
    mon_b, mon_c = b["procs"].get(str(a.pid)), c["procs"].get(str(a.pid))
    mon_grew = None if mon_b is None or mon_c is None else mon_c - mon_b
    notes = []
    if not after_all.get("reached"):
        notes.append(f"NVML's free memory never fell by the reservations in {after_all.get('waited_seconds')} s")
    if not (a.expected - 128 * MiB <= held <= a.expected + 256 * MiB):
        notes.append(f"{mib(held)} left the free memory for {mib(a.expected)} reserved")
    if mon_grew is not None and mon_grew < a.expected - 128 * MiB:
        notes.append(f"NVML counts only {mib(mon_grew)} more to the monitor")
    devs = (after_all.get("status") or {}).get("devices") or [{}]
    rec.verdict(a.name, notes,
                f"NVML free {gib(b['free'])} -> {gib(c['free'])} (-{mib(held)}); monitor's process "
                f"{mib(mon_b)} -> {mib(mon_c)}",
                f"-{mib(a.expected)} (2 x quota), held by the monitor",
                {"held": held, "expected": a.expected, "monitor_before": mon_b, "monitor_after": mon_c,
                 "waited_seconds": after_all.get("waited_seconds"),
                 "memory_reserved": devs[0].get("memory_reserved"), "before": b, "after": c})


@judged
def node_bypass(rec, a):
    """A process without the library, asking for every piece it can get while the balloons hold
    the slices' reservations: it gets at most what was free then less its own context."""
    held, during, h = load(a.held)["nvml"], load(a.during)["nvml"], holding(a.holder)
    got = int(h["allocated_bytes"])
    proc = during["procs"].get(str(h["pid"]))
    ctx = None if proc is None else proc - got
    unreserved = held["free"] - (ctx or 0)
    notes = []
    if got > unreserved + a.slack:
        notes.append(f"it got {mib(got - unreserved)} more than was unreserved")
    if during["free"] > 512 * MiB:
        notes.append(f"{mib(during['free'])} still free: it did not fill the device, nothing was tested")
    if ctx is None:
        notes.append(f"NVML lists no memory for pid {h['pid']}")
    rec.verdict(a.name, notes,
                f"got {gib(got)} of {gib(unreserved)} unreserved (free {gib(held['free'])} less its "
                f"context {mib(ctx)}); free while it holds: {mib(during['free'])}",
                f"<= unreserved + {mib(a.slack)}",
                {"got": got, "unreserved": unreserved, "context": ctx, "slack": a.slack, "held": held,
                 "during": during})


@judged
def node_tenants(rec, a):
    """Each tenant's first process, in its own slice, allocates its whole quota while the bypass
    holds everything it could get (its context from the room its admission handed back, the
    rest from its slice's balloon), then gets CUDA_ERROR_OUT_OF_MEMORY at the quota."""
    outs = [load(b) for b in a.bases]
    notes, nums, shown = [], {}, []
    for base, o in zip(a.bases, outs):
        tag = os.path.basename(base)
        notes += quota_fill_notes(tag, o, a.quota, a.unit)
        nums[tag] = quota_fill_numbers(o)
        got = nums[tag]["allocated_bytes"]
        # Node mode charges the process's context inside the quota (issue #34): what it can
        # allocate is what cuMemGetInfo called free at its start, to within one piece, and the
        # context is what the quota lost to it.
        free = o.get("mem_free")
        if free is None:
            notes.append(f"{tag}: burn reported no cuMemGetInfo at its start")
            shown.append(gib(got))
            continue
        ctx = a.quota - free
        nums[tag]["context"] = ctx
        if got < free - a.unit:
            notes.append(f"{tag}: {got} bytes allocated of {free} that cuMemGetInfo called free")
        if not 0 < ctx <= a.quota // 4:
            notes.append(f"{tag}: the quota less the free memory at start is {mib(ctx)}, not a context's size")
        shown.append(f"{gib(got)} (context {mib(ctx)} inside the quota)")
    rec.verdict(a.name, notes, " and ".join(shown) + ", then OOM",
                f"{gib(a.quota)} each less its context, OOM at it", nums)


def allocated(slice_json, missing=-1):
    """What a slice of `gpuslice status --json` is charged besides its processes' CUDA contexts
    (node mode charges those inside the quota, issue #34): its allocations."""
    if not slice_json or "memory_used" not in slice_json:
        return missing
    return slice_json["memory_used"] - (slice_json.get("memory_contexts") or 0)


@judged
def node_share(rec, a):
    """Memory one process shares with another (CUDA IPC, or a VMM allocation passed as a POSIX
    fd) is charged once: to the exporter's slice in the ledger, to the exporter's process by
    NVML (so the audit finds no importer over what it charged); for VMM, the exporter's slice
    stays charged past the exporter's exit while the importer maps it (what NVML shows then is
    recorded, not judged: it is what this check exists to find out); unmapped by the importer, the
    charge stays while a process of the exporter's uid lives in its PID namespace (it may hold the
    descriptor where no scan sees it: recorded), and goes once the importer exits; the audit says nothing about either process or slice. The slices'
    charges are judged less their processes' contexts (`allocated`). The device's
    total is not judged: the monitor's balloons shrink by what a slice uses of its reservation."""
    o = load(a.base)
    if "error" in o:
        raise Failed(f"{o['error']}; stderr: {o.get('stderr')}")
    n = o["mib"] * MiB
    ctxs, sh = o["contexts"], o["shared"]
    notes = []
    if o.get("made_status") or o.get("import_status") or not o.get("read_ok"):
        notes.append(f"sharing failed: made {o.get('made_status')}, imported {o.get('import_status')}, "
                     f"read back {o.get('read_ok')}")
    ex, im = sh["exporter_slice"] or {}, sh["importer_slice"] or {}
    if not (n <= allocated(ex) <= n + 2 * MiB):
        notes.append(f"the exporter's slice is charged {allocated(ex)} for {n} besides its contexts")
    if not im or allocated(im) > 2 * MiB:
        notes.append(f"the importer's slice: {im or 'not found'}")

    def grew(who):
        b, c = ctxs.get(f"{who}_nvml"), sh.get(f"{who}_nvml")
        return None if b is None or c is None else c - b

    ex_grew, im_grew = grew("exporter"), grew("importer")
    if ex_grew is None or im_grew is None:
        notes.append(f"NVML lists no memory for the exporter or the importer: {sh['nvml_procs']}")
    else:
        if not (n - 2 * MiB <= ex_grew <= n + 64 * MiB):
            notes.append(f"NVML counts {mib(ex_grew)} more to the exporter for {mib(n)} shared")
        if im_grew > 64 * MiB:
            notes.append(f"NVML counts {mib(im_grew)} more to the importer: the audit would charge its slice")
    measured = (f"ledger {mib(allocated(ex))} exporter / {mib(allocated(im))} importer besides contexts; "
                f"NVML +{mib(ex_grew)} exporter / +{mib(im_grew)} importer")
    if o["kind"] == "vmm":
        gone = o.get("exporter_gone") or {}
        gx, gi = gone.get("exporter_slice") or {}, gone.get("importer_slice") or {}
        if gx.get("memory_used", 0) < n or (gx.get("held_for_importers") or 0) < n:
            notes.append(f"after the exporter exited its slice shows {gx}")
        if allocated(gi) > 2 * MiB:
            notes.append(f"after the exporter exited the importer's slice shows {gi}")
        if not o.get("read_ok_after_exit"):
            notes.append("the importer could not read the memory after the exporter exited")
        imp = gone.get("importer_nvml")
        imp_grew = None if imp is None or ctxs.get("importer_nvml") is None else imp - ctxs["importer_nvml"]
        whose = "the importer" if imp_grew is not None and imp_grew >= n - 2 * MiB else "no process"
        measured += (f"; exporter exited: ledger {mib(gx.get('held_for_importers'))} held for the importer, "
                     f"NVML counts it to {whose} (importer +{mib(imp_grew)}, device used "
                     f"{gib(ctxs['nvml_used'])} -> {gib(gone.get('nvml_used', 0))} with the balloons)")
    if o["kind"] == "vmm":
        kept = (o.get("after_unmap") or {}).get("exporter_slice") or {}
        measured += (f"; importer unmapped, still running: {mib(allocated(kept, 0))} kept charged "
                     f"(a process of the exporter's uid lives); after it exited: released")
    after = (o.get("after") or {}).get("exporter_slice") or {}
    if allocated(after, 0) >= n:
        notes.append(f"still charged after the last holder exited: {after}")
    if o.get("audit_lines"):
        notes.append(f"the audit reported: {o['audit_lines'][:3]}")
    rec.verdict(a.name, notes, measured, "charged once: exporter's slice and process; no audit line", o)


@judged
def node_stopped(rec, a):
    """The monitor stops on SIGTERM and the driver returns what it held (its context and every
    balloon): the device's free memory is what it was before it started."""
    quiet, after_all = load(a.quiet)["nvml"], load(a.after)
    after = after_all["nvml"]
    notes = []
    if a.rc != 0:
        notes.append(f"the monitor exited with status {a.rc} on SIGTERM")
    if after["free"] < quiet["free"] - 64 * MiB:
        notes.append(f"{mib(quiet['free'] - after['free'])} not returned in {after_all.get('waited_seconds')} s")
    rec.verdict(a.name, notes,
                f"exit {a.rc}; NVML free {gib(after['free'])} of {gib(quiet['free'])} before it started",
                "exit 0; free memory back", {"quiet": quiet, "after": after, "rc": a.rc})


# ---- output ----


def report(a):
    meta = json.load(open(a.meta))
    recs = [json.loads(ln) for ln in _read(a.records).splitlines() if ln.strip()]
    counts = {s: sum(r["status"] == s for r in recs) for s in ("PASS", "FAIL", "SKIP")}
    doc = {"meta": meta, "checks": recs, "summary": counts}
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
    table = render_table(recs, counts)
    with open(a.txt, "w") as f:
        f.write("gpuslice real-GPU validation (scripts/gpu-validate.sh)\n")
        for k in sorted(meta):
            f.write(f"{k}: {meta[k]}\n")
        f.write("\nDetails\n")
        for r in recs:
            f.write(f"\n== {r['check']}: {r['status']}\n")
            for k in ("measured", "target", "note"):
                if r[k]:
                    f.write(f"{k}: {r[k]}\n")
            if r["numbers"]:
                f.write("numbers: " + json.dumps(r["numbers"], sort_keys=True) + "\n")
        f.write("\n" + table)
    print(f"results: {a.txt} and {a.json}")
    print(table, end="")


def render_table(recs, counts):
    rows = [("check", "status", "measured", "target")] + [
        (r["check"], r["status"], r["measured"] or r["note"][:70], r["target"]) for r in recs
    ]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    out = []
    for i, r in enumerate(rows):
        out.append(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}".rstrip())
        if i == 0:
            out.append("-" * min(160, sum(w) + 6 + max(len(x[3]) for x in rows)))
    out.append(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", required=True, help="records file (JSON lines)")
    sub = p.add_subparsers(dest="cmd", required=True)

    def cmd(name, fn, *args):
        s = sub.add_parser(name)
        s.set_defaults(fn=fn)
        if fn is not report:
            s.add_argument("--name", required=True)
        for spec in args:
            flag, kw = spec
            s.add_argument(flag, **kw)
        return s

    quota = ("--quota", {"type": int, "required": True})
    cmd("record", None, ("--status", {"choices": ["PASS", "FAIL", "SKIP"], "required": True}),
        ("--measured", {"default": ""}), ("--target", {"default": ""}), ("--note", {"default": ""}))
    cmd("burn-alloc", burn_alloc, quota, ("--unit", {"type": int, "required": True}), ("bases", {"nargs": 2}))
    cmd("burn-shares", burn_shares, ("--tol", {"type": float, "required": True}),
        ("--margin", {"type": float, "default": 0.0, "help": "seconds left out at each end"}),
        ("--at-least", {"type": float, "help": "one-sided: pass when the share is at least this"}),
        ("--of-total", {"action": "store_true",
                        "help": "judge each tenant's part of what all got together (the fake on a busy CPU)"}),
        ("--min-sum", {"type": float, "default": 0.25,
                       "help": "with --of-total: the least the tenants' sum may be for their split to count"}),
        ("pair", {"nargs": "+", "help": "BASE:TARGET"}))
    cmd("symbols", symbols, ("--log-out", {"required": True}), ("base", {}))
    cmd("torch-memory", torch_memory, quota, ("base", {}))
    cmd("jax-memory", jax_memory, quota, ("base", {}))
    cmd("cupy-memory", cupy_memory, quota, ("base", {}))
    cmd("torch-shares", torch_shares, ("--tol", {"type": float, "required": True}), ("--solo", {"required": True}),
        ("pair", {"nargs": "+", "help": "BASE:TARGET"}))
    cmd("overhead", overhead, ("--target-pct", {"type": float, "required": True}),
        ("--plain", {"nargs": "+", "required": True}), ("--shim", {"nargs": "+", "required": True}))
    allowance = ("--allowance", {"type": int, "required": True, "help": "--context-allowance, bytes"})
    cmd("node-context", node_context, allowance, ("--quiet", {"required": True}),
        ("--holding", {"required": True}), ("--holder", {"required": True}))
    cmd("torch-context", torch_context, allowance, ("base", {}))
    cmd("node-monitor", node_monitor, allowance, ("--quiet", {"required": True}),
        ("--monitor", {"required": True}), ("--pid", {"type": int, "required": True}))
    cmd("node-balloons", node_balloons, ("--before", {"required": True}), ("--after", {"required": True}),
        ("--expected", {"type": int, "required": True}), ("--pid", {"type": int, "required": True}))
    cmd("node-bypass", node_bypass, ("--held", {"required": True}), ("--during", {"required": True}),
        ("--holder", {"required": True}), ("--slack", {"type": int, "required": True}))
    cmd("node-tenants", node_tenants, quota, ("--unit", {"type": int, "required": True}),
        ("bases", {"nargs": "+"}))
    cmd("node-share", node_share, ("base", {}))
    cmd("node-stopped", node_stopped, ("--quiet", {"required": True}), ("--after", {"required": True}),
        ("--rc", {"type": int, "required": True}))
    cmd("report", report, ("--meta", {"required": True}), ("--json", {"required": True}), ("--txt", {"required": True}))
    a = p.parse_args()
    rec = Recorder(a.records)
    if a.cmd == "record":
        rec.add(a.name, a.status, a.measured, a.target, a.note)
    elif a.cmd == "report":
        report(a)
    else:
        a.fn(rec, a)


if __name__ == "__main__":
    main()
