#!/usr/bin/env python3
"""Generate tests/fakegpu/src/procaddr.tsv: the fake GPU's cuGetProcAddress version table.

Run once (by hand) when the reference data changes:
    python3 tests/fakegpu/gen/procaddr.py ../shared/reference/driver-535-proc-address.tsv \
        /path/to/cuda_runtime/include [/path/to/cuda13/include] > tests/fakegpu/src/procaddr.tsv

The optional second include directory (CUDA 13's: `nvidia/cu13/include` of the
`nvidia-cuda-runtime` wheel, or `triton/backends/nvidia/include` of the PyTorch venv) adds the
entry points that are new in CUDA 13 (bases the 12.x table lacks, such as
cuMemGetDefaultMemPool), as bare symbols, and the versioned changes of existing ones
(`PFN_cuCtxSynchronize_v13000`: cuCtxSynchronize_v2 from 13000), checked against 13's cuda.h.
No 13.x driver's answers are recorded yet: these rows are what the headers imply a 13.x driver
answers (the fake caps a request at the version it presents, FAKEGPU_DRIVER_VERSION).

Rows are `base flags min_version symbol` (`-` = no symbol in that range), exactly the reference
driver's answers (CUDA 12.2), extended with the entry points that CUDA 12.3 .. 12.9 added, taken
from the `PFN_<name>_v<version>[_ptsz|_ptds]` typedefs of cudaTypedefs.h. A newer version's
symbol is `<base>_v<n+1>` after the newest `_v<n>` the reference knows (checked against the
prototypes of cuda.h), or the bare base name for an entry point the reference lacks.
"""
import re, sys, collections

ref_path, inc = sys.argv[1], sys.argv[2]
rows = collections.defaultdict(list)  # (base, flags) -> [(ver, sym)]
for line in open(ref_path):
    b, f, v, s = line.rstrip("\n").split("\t")
    rows[(b, int(f))].append((int(v), s))
REF_MAX = 12020
cuda_h = open(inc + "/cuda.h").read()
protos = set(re.findall(r"CUresult\s+CUDAAPI\s+(cu\w+)\s*\(", cuda_h))
typedefs = open(inc + "/cudaTypedefs.h").read()
newer = collections.defaultdict(dict)  # base -> ver -> ptsz suffix or None
for m in re.finditer(r"PFN_(cu\w+?)_v(\d{4,5})(_ptsz|_ptds)?\b", typedefs):
    base, ver, pt = m.group(1), int(m.group(2)), m.group(3)
    if ver > REF_MAX:
        newer[base].setdefault(ver, None)
        if pt:
            newer[base][ver] = pt

def last_sym(base):
    syms = [s for (v, s) in sorted(rows.get((base, 0), [])) if s != "-"]
    return syms[-1] if syms else None

def add_version(base, ver, pt, protos, bare_if_new):
    """Rows for `base` from `ver` on: the next `_v<n>` after its newest symbol (which must have a
    prototype in `protos`), or the bare base name for an entry point with no earlier symbol
    when `bare_if_new`; `pt` is the per-thread suffix of the flags-2 row, if any."""
    prev = last_sym(base)
    if prev is None:
        if not bare_if_new:
            sys.stderr.write(f"skip {base} {ver}: no earlier symbol\n")
            return
        sym = base
    else:
        n = int(re.match(r"^(cu\w+?)(?:_v(\d+))?$", prev).group(2) or 1)
        sym = f"{base}_v{n + 1}"
        if sym not in protos:
            sys.stderr.write(f"skip {base} {ver}: {sym} has no prototype\n")
            return
    for flags in (0, 1, 2):
        if not rows[(base, flags)]:
            rows[(base, flags)].append((2000, "-"))
        rows[(base, flags)].append((ver, sym + pt if (flags == 2 and pt) else sym))

for base in sorted(newer):
    for ver in sorted(newer[base]):
        add_version(base, ver, newer[base][ver], protos, True)

if len(sys.argv) > 3:
    inc13 = sys.argv[3]
    protos13 = set(re.findall(r"CUresult\s+CUDAAPI\s+(cu\w+)\s*\(", open(inc13 + "/cuda.h").read()))
    known = {b for (b, _) in rows}
    t13 = open(inc13 + "/cudaTypedefs.h").read()
    new13 = {}
    changed13 = collections.defaultdict(dict)  # known base -> ver -> ptsz suffix or None
    for m in re.finditer(r"PFN_(cu\w+?)_v(\d{4,5})(_ptsz|_ptds)?\b", t13):
        base, ver, pt = m.group(1), int(m.group(2)), m.group(3)
        if ver < 13000:
            continue
        if base not in known:
            cur = new13.setdefault(base, [ver, None])
            cur[0] = min(cur[0], ver)
            if pt:
                cur[1] = pt
        else:
            changed13[base].setdefault(ver, None)
            if pt:
                changed13[base][ver] = pt
    for base, (ver, pt) in new13.items():
        for flags in (0, 1, 2):
            rows[(base, flags)] = [(2000, "-"), (ver, base + pt if (flags == 2 and pt) else base)]
    # Versioned changes of existing entry points in 13.x (cuCtxSynchronize(CUcontext) is
    # cuCtxSynchronize_v2 from 13000): the next `_v<n>` after the newest known, checked
    # against 13's prototypes (where `_v2` names are declared outright).
    for base in sorted(changed13):
        for ver in sorted(changed13[base]):
            add_version(base, ver, changed13[base][ver], protos13, False)

for (base, flags) in sorted(rows):
    for ver, sym in sorted(rows[(base, flags)]):
        print(f"{base}\t{flags}\t{ver}\t{sym}")
