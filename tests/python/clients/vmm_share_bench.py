"""What sharing a VMM allocation as a POSIX descriptor costs, per call (ctypes, on the fake GPU or
a real one): `vmm_share_bench.py MIB RUNS` prints one JSON line of medians (µs) over RUNS fresh
MIB MiB allocations, each exported here and imported by a second process (this script with
`import`, which opens the descriptor through /proc/<exporter>/fd, as a received one):

- `export`: cuMemExportToShareableHandle (under gpuslice: the export registered in the ledger,
  or with the node's monitor);
- `import`: cuMemImportFromShareableHandle in the other process (registered as an importer);
- `import_release`: the importer's cuMemRelease of its only handle (it leaves the record);
- `release`: the exporter's cuMemRelease once the importer left (the charge returned);
- `import_orphan`: the other process imports the same descriptor again, now that nobody holds
  the memory but the descriptor (under gpuslice an orphan: the importer is charged for it);
- `orphan_release`: its cuMemRelease of that handle (the charge returned).

Without gpuslice these are the driver's own costs; the difference under the shim is what
registering costs (docs/benchmarks.md).
"""
import ctypes
import json
import os
import subprocess
import sys

from cuda_ctx import Location, Prop, Timings, answer_lines, primary_context
from fw_common import MI

c_u64, c_size = ctypes.c_uint64, ctypes.c_size_t


def importer():
    cuda, _ = primary_context()
    t = Timings("import", "import_release", "import_orphan", "orphan_release")

    def each(line):
        again, pid, n = line.split()
        fd = os.open(f"/proc/{pid}/fd/{n}", os.O_RDWR)
        h = c_u64()
        t.call("import_orphan" if again == "again" else "import",
               cuda.cuMemImportFromShareableHandle, ctypes.byref(h), ctypes.c_void_p(fd), 1)
        os.close(fd)
        t.call("orphan_release" if again == "again" else "import_release", cuda.cuMemRelease, h)

    answer_lines(t, each)


def main(mib, runs):
    cuda, dev = primary_context()
    size = mib * MI
    child = subprocess.Popen([sys.executable, __file__, "import"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=os.environ)
    t = Timings("export", "release")
    prop = Prop(1, 1, Location(1, dev.value), None)
    for _ in range(runs):
        h = c_u64()
        assert cuda.cuMemCreate(ctypes.byref(h), c_size(size), ctypes.byref(prop), c_u64(0)) == 0
        fd = ctypes.c_int()
        t.call("export", cuda.cuMemExportToShareableHandle, ctypes.byref(fd), h, 1, c_u64(0))
        child.stdin.write(f"first {os.getpid()} {fd.value}\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ok"
        t.call("release", cuda.cuMemRelease, h)
        # Only the descriptor holds the memory now: imported again, an orphan.
        child.stdin.write(f"again {os.getpid()} {fd.value}\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ok"
        os.close(fd.value)
    child.stdin.close()
    out = t.medians()
    out.update(json.loads(child.stdout.readline()))
    child.wait()
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "import":
        importer()
    else:
        main(int(sys.argv[1]), int(sys.argv[2]))
