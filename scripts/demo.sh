#!/usr/bin/env bash
# gpuslice in about 15 seconds, on a machine without a GPU (the first run builds for a minute or
# more before: about 100 MB under target/release; later runs build nothing).
#
# Builds everything (release, quietly: one line says so), then on a private fake GPU (tests/fakegpu: a CPU-backed
# libcuda/libnvidia-ml whose kernels take simulated time on one engine shared by every process):
#   1. two tenants with compute shares 0.25 and 0.75 saturate the device at the same time; their
#      achieved shares of the GPU are printed every second, as each tenant measures them;
#   2. a tenant with a 2 GiB memory quota allocates 1 GiB three times, keeping each (one round
#      of three allocations): the first two fit, the third fails with CUDA_ERROR_OUT_OF_MEMORY,
#      and the program carries on;
#   3. `gpuslice status` shows the node.
# Everything runs under `gpuslice run`, as a user would run a real program; nothing outside a
# temporary directory is touched (its own ledger and fake-GPU state), and everything it started
# is stopped at the end or on Ctrl-C.
#
#   scripts/demo.sh              # DEMO_SECONDS=8 by default: how long the shares are shown
#   DEMO_BUILD_DIR=target/debug scripts/demo.sh   # use artifacts built there, build nothing
#                                                 # (the test suite runs it this way)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${DEMO_SECONDS:-8}
case "$seconds" in '' | *[!0-9]* | 0) echo "demo.sh: DEMO_SECONDS must be a whole number > 0" >&2; exit 2 ;; esac

bold='' plain=''
if [ -t 1 ]; then
    bold=$(tput bold 2>/dev/null || true)
    plain=$(tput sgr0 2>/dev/null || true)
fi
say() { printf '\n%s== %s%s\n' "$bold" "$*" "$plain"; }

# A private world: fake GPU state and the gpuslice ledger in a temporary directory.
work=$(mktemp -d "${TMPDIR:-/tmp}/gpuslice-demo.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    # The monitor `gpuslice run` started for this ledger: its pid is in the lock file it holds.
    if [ -f "$work/ledger/monitor.lock" ]; then
        m=$(cat "$work/ledger/monitor.lock" 2>/dev/null || true)
        [ -n "$m" ] && kill "$m" 2>/dev/null || true
    fi
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$work/fakegpu" "$work/ledger"

if [ -n "${DEMO_BUILD_DIR:-}" ]; then
    bin=$(cd "$DEMO_BUILD_DIR" && pwd)
    # The fake GPU under the names a CUDA program loads.
    mkdir -p "$work/fakelib"
    for n in libcuda.so.1 libcuda.so libnvidia-ml.so.1 libnvidia-ml.so; do
        ln -s "$bin/libfakegpu.so" "$work/fakelib/$n"
    done
    fake_lib_dir="$work/fakelib"
else
    # One line, not cargo's: its output goes to a log, shown only if the build fails.
    echo "building gpuslice (cargo build --release; the first time takes a minute or more)..."
    build_log="$work/build.log"
    if ! { cargo build --release --quiet -p gpuslice -p gpuslice-shim -p gpuslice-burn &&
           fake_lib_dir=$(CARGO_TERM_QUIET=true scripts/fakegpu.sh </dev/null | tail -n 1); } \
         >"$build_log" 2>&1; then
        cat "$build_log" >&2
        echo "demo.sh: the build failed (above)" >&2
        exit 1
    fi
    bin=${CARGO_TARGET_DIR:-$root/target}/release
fi
for f in gpuslice gpuslice-burn libgpuslice.so; do
    [ -e "$bin/$f" ] || { echo "demo.sh: $bin/$f is missing" >&2; exit 1; }
done
gpuslice="$bin/gpuslice"
burn="$bin/gpuslice-burn"
unset LD_PRELOAD GPUSLICE_MEMORY GPUSLICE_COMPUTE GPUSLICE_COMPUTE_CAP GPUSLICE_SLICE \
      GPUSLICE_LIBRARY GPUSLICE_DISABLE CUDA_DEVICE_MEMORY_LIMIT CUDA_DEVICE_SM_LIMIT
export LD_LIBRARY_PATH="$fake_lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FAKEGPU_STATE_DIR="$work/fakegpu" FAKEGPU_DEVICES=1 FAKEGPU_MEMORY=16Gi
export GPUSLICE_RUNTIME_DIR="$work/ledger"

# The value of "key" in the last per-second report (`"event":"interval"` line) of FILE.
field() {
    grep '"event":"interval"' "$1" 2>/dev/null | tail -n 1 | grep -o "\"$2\":[^,}]*" |
        cut -d: -f2 || true
}
# A fraction as a percentage, never above 100% (a tenant's window can catch a kernel begun in
# the window before, so a lone tenant's own figure can read a hair over 1).
pct() { awk -v x="${1:-0}" 'BEGIN { if (x == "") x = 0; if (x > 1) x = 1; printf "%5.1f%%", 100 * x }'; }

say "two tenants share one GPU: tenant-a has a 0.25 share, tenant-b 0.75 (both want all of it)"
burn_args=(--seconds $((seconds + 6)) --kernel-us 1000 --report-interval 1 --json)
echo "\$ gpuslice run --compute 0.25 --slice tenant-a -- gpuslice-burn ${burn_args[*]} &"
echo "\$ gpuslice run --compute 0.75 --slice tenant-b -- gpuslice-burn ${burn_args[*]} &"
"$gpuslice" run --compute 0.25 --slice tenant-a -- "$burn" "${burn_args[@]}" >"$work/a.out" 2>"$work/a.err" &
pids+=($!)
# Let the first one start the node monitor (it says so on stderr) before the second asks.
for _ in $(seq 50); do [ -s "$work/a.err" ] || [ -s "$work/a.out" ] && break; sleep 0.1; done
"$gpuslice" run --compute 0.75 --slice tenant-b -- "$burn" "${burn_args[@]}" >"$work/b.out" 2>"$work/b.err" &
pids+=($!)
sleep 0.5
grep -h "^gpuslice:" "$work/a.err" "$work/b.err" || true

# Each tenant measures the GPU time of its own kernels over its own one-second windows; the
# two windows are not aligned, so their sum can read a little above what the engine can do:
# "GPU busy" is that sum, never shown above 100%.
echo "  each line: the share of the GPU each tenant measured over its last second"
printf '\n  %-6s  %-22s  %-22s  %s\n' "time" "tenant-a (share 25%)" "tenant-b (share 75%)" "GPU busy"
for t in $(seq "$seconds"); do
    sleep 1
    a=$(field "$work/a.out" gpu_fraction)
    b=$(field "$work/b.out" gpu_fraction)
    busy=$(awk -v a="${a:-0}" -v b="${b:-0}" 'BEGIN { s = a + b; print (s > 1 ? 1 : s) }')
    printf '  %4ss    %-22s  %-22s  %s\n' "$t" "$(pct "$a") of the GPU" "$(pct "$b") of the GPU" "$(pct "$busy")"
done
# Averages over the seconds shown, skipping the first (start-up).
avg() { grep '"event":"interval"' "$1" | grep -o '"gpu_fraction":[^,}]*' | cut -d: -f2 |
        awk 'NR > 1 { s += $1; n++ } END { if (n) print s / n; else print 0 }'; }
echo "  average after start-up: tenant-a $(pct "$(avg "$work/a.out")"), tenant-b $(pct "$(avg "$work/b.out")")"
for x in a b; do
    if ! grep -q '"event":"interval"' "$work/$x.out"; then
        echo "  tenant-$x reported nothing; its output:"
        sed 's/^/    /' "$work/$x.err" "$work/$x.out" | tail -n 5
    fi
done

say "a tenant with a 2 GiB memory quota allocates 1 GiB three times, keeping each"
echo "\$ gpuslice run --memory 2Gi --slice tenant-c -- gpuslice-burn --alloc 1Gi,1Gi,1Gi --json"
set +e
"$gpuslice" run --memory 2Gi --slice tenant-c -- "$burn" --alloc 1Gi,1Gi,1Gi --json >"$work/c.out" 2>"$work/c.err"
c_status=$?
grep -h "^gpuslice:" "$work/c.err"
json=$(grep '^{' "$work/c.out" | tail -n 1 || true)
if [ -z "$json" ]; then
    echo "  tenant-c printed no report (exit $c_status):"; sed 's/^/    /' "$work/c.err"
else
    # "allocs":[{"bytes":..,"code":..,"name":..,"ok":..,"size":..},...] -> one line each. The
    # report lists them twice (top level, and again under "rounds" for --alloc-rounds): the
    # first list is the one round this tenant made.
    i=0
    grep -o '"allocs":\[[^]]*\]' <<<"$json" | head -n 1 | grep -o '{[^}]*}' | while read -r a; do
        i=$((i + 1))
        size=$(grep -o '"size":[0-9]*' <<<"$a" | cut -d: -f2)
        name=$(grep -o '"name":"[^"]*"' <<<"$a" | cut -d'"' -f4)
        printf '  allocation %d: %5s MiB -> %s\n' "$i" "$((size >> 20))" "${name:-CUDA_SUCCESS}"
    done
    total=$(grep -o '"mem_total":[0-9]*' <<<"$json" | cut -d: -f2)
    echo "  the program saw a device of $((${total:-0} >> 20)) MiB (its quota) and exited with status $c_status"
fi
set -e

say "gpuslice status"
"$gpuslice" status

wait "${pids[@]}" 2>/dev/null || true
pids=()
say "done: the tenants have exited, the demo's monitor and files are removed on exit"
