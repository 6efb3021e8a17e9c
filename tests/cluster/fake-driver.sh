#!/usr/bin/env bash
# The fake GPU as the cluster node's NVIDIA driver (scripts/cluster.sh runs this).
#
#   fake-driver.sh install COUNT MEMORY   e.g. install 1 16Gi
#   fake-driver.sh remove
#
# What a real GPU node has, and what stands in for it here:
# - the driver's libraries (libcuda.so.1, libnvidia-ml.so.1): the fake's, copied to
#   /opt/gpuslice-cluster/driver/ and mounted into containers at
#   /usr/lib/x86_64-linux-gnu/, where the NVIDIA Container Toolkit's CDI spec puts the real
#   ones on Debian and Ubuntu images;
# - the device nodes (/dev/nvidia*), which carry the driver's node-wide state: the fake's
#   state directory, /run/fakegpu (FAKEGPU_STATE_DIR), mounted at the same path, so every
#   container's processes share one device, its memory and its engine, as on a real GPU;
# - the toolkit's CDI spec (`nvidia-ctk cdi generate --device-name-strategy=uuid`):
#   /etc/cdi/fakegpu.json, kind nvidia.com/gpu, a device per GPU UUID and `all`, whose edits
#   mount the above. The DRA plugin returns `nvidia.com/gpu=<UUID>` beside its own device,
#   exactly as on a real node.
# The DaemonSet's containers (NVML for the monitor and the plugin) get the same libraries and
# directory through the chart's `driver` values (tests/cluster/values-fake.yaml), where a real
# node uses `runtimeClassName: nvidia`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
driver=/opt/gpuslice-cluster/driver
state_dir=/run/fakegpu
spec=/etc/cdi/fakegpu.json

case "${1:-}" in
install)
    count=${2:?COUNT}
    memory=${3:?MEMORY}
    libdir=$(cd "$root" && bash scripts/fakegpu.sh 2>/dev/null | tail -n 1)
    mkdir -p "$driver"
    install -m 0755 "$(readlink -f "$libdir/libcuda.so.1")" "$driver/libcuda.so.1"
    install -m 0755 "$(readlink -f "$libdir/libnvidia-ml.so.1")" "$driver/libnvidia-ml.so.1"
    # Shared by every user's processes, as /dev/nvidia* are (mode 0666 on a real node).
    rm -rf "$state_dir"
    mkdir -p "$state_dir"
    chmod 1777 "$state_dir"
    # Every user's processes open the state read-write (the fake makes its other files with
    # the state file's mode).
    install -m 0666 /dev/null "$state_dir/state"
    # The first process to open the state fixes the device's configuration; make it now, and
    # read the GPUs' UUIDs through NVML as nvidia-ctk does.
    uuids=$(FAKEGPU_STATE_DIR=$state_dir FAKEGPU_DEVICES=$count FAKEGPU_MEMORY=$memory \
        python3 - "$driver/libnvidia-ml.so.1" <<'EOF'
import ctypes, sys
nvml = ctypes.CDLL(sys.argv[1])
assert nvml.nvmlInit_v2() == 0, "nvmlInit_v2 failed"
n = ctypes.c_uint()
assert nvml.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0
for i in range(n.value):
    h = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
    buf = ctypes.create_string_buffer(96)
    assert nvml.nvmlDeviceGetUUID(h, buf, 96) == 0
    print(buf.value.decode())
nvml.nvmlShutdown()
EOF
    )
    python3 - "$spec" "$driver" "$state_dir" "$count" "$memory" $uuids <<'EOF'
import json, os, sys
spec, driver, state_dir, count, memory, *uuids = sys.argv[1:]
lib = "/usr/lib/x86_64-linux-gnu"
edits = {
    "env": [f"FAKEGPU_STATE_DIR={state_dir}", f"FAKEGPU_DEVICES={count}",
            f"FAKEGPU_MEMORY={memory}"],
    "mounts": [
        {"hostPath": f"{driver}/libcuda.so.1", "containerPath": f"{lib}/libcuda.so.1",
         "options": ["ro", "nosuid", "nodev", "bind"]},
        {"hostPath": f"{driver}/libnvidia-ml.so.1", "containerPath": f"{lib}/libnvidia-ml.so.1",
         "options": ["ro", "nosuid", "nodev", "bind"]},
        {"hostPath": state_dir, "containerPath": state_dir,
         "options": ["rw", "nosuid", "nodev", "bind"]},
    ],
}
# Each device's own edit: a real spec mounts its /dev/nvidiaN, so the container sees that GPU
# alone; here CUDA_VISIBLE_DEVICES does it for CUDA (NVML still lists every GPU). "all" names
# them all (CDI refuses a device without edits).
def only(u):
    return {"env": [f"CUDA_VISIBLE_DEVICES={u}"]}
devices = [{"name": u, "containerEdits": only(u)} for u in uuids]
devices += [{"name": str(i), "containerEdits": only(u)} for i, u in enumerate(uuids)]
devices.append({"name": "all", "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}})
doc = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices,
       "containerEdits": edits}
tmp = spec + ".tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=2)
os.replace(tmp, spec)
EOF
    echo "fake-driver.sh: $count fake GPU(s) of $memory: $uuids; CDI spec $spec"
    ;;
remove)
    rm -rf "$driver" "$state_dir" "$spec"
    ;;
*)
    echo "usage: fake-driver.sh install COUNT MEMORY | remove" >&2
    exit 2
    ;;
esac
