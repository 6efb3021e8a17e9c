#!/usr/bin/env bash
# The NVML polling benchmark of docs/benchmarks.md: pynvml_poll.py (1,000 polls) direct, inside
# a slice (an NVML-only process) and outside any slice under the shim, in interleaved rounds,
# on the fake GPU, next to three gpuslice-burn holders (two in slice "bench", one in "other").
# Usage: tests/python/clients/pynvml_poll_bench.sh [ROUNDS]   (after `cargo build --workspace`,
# `cargo build --release -p gpuslice-shim` and scripts/test.sh's .venv). One JSON line per run.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
rounds=${1:-5}
lib=$(bash "$root/scripts/fakegpu.sh" </dev/null | tail -n1)
w=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$w"' EXIT
mkdir -p "$w/fake"
base=(env -i PATH=/usr/bin:/bin "LD_LIBRARY_PATH=$lib" "FAKEGPU_STATE_DIR=$w/fake" FAKEGPU_DEVICES=1
      FAKEGPU_MEMORY=16Gi "GPUSLICE_RUNTIME_DIR=$w/ledger")
shim=$root/target/release/libgpuslice.so
burn=$root/target/debug/gpuslice-burn
py=${GPUSLICE_VENV:-$root/.venv}/bin/python
poll=$root/tests/python/clients/pynvml_poll.py
"${base[@]}" LD_PRELOAD="$shim" GPUSLICE_SLICE=bench GPUSLICE_MEMORY=4Gi "$burn" --alloc 1Gi --hold 600 >/dev/null &
"${base[@]}" LD_PRELOAD="$shim" GPUSLICE_SLICE=bench "$burn" --alloc 512Mi --hold 600 >/dev/null &
"${base[@]}" LD_PRELOAD="$shim" GPUSLICE_SLICE=other GPUSLICE_MEMORY=2Gi "$burn" --alloc 256Mi --hold 600 >/dev/null &
sleep 3
for _ in $(seq "$rounds"); do
    echo "direct $("${base[@]}" "$py" "$poll" 1000)"
    echo "in-slice $("${base[@]}" LD_PRELOAD="$shim" GPUSLICE_SLICE=bench "$py" "$poll" 1000)"
    echo "outside $("${base[@]}" LD_PRELOAD="$shim" "$py" "$poll" 1000)"
done
