#!/usr/bin/env bash
# The compute-share benchmark (a benchmark, not a test: it prints numbers, it asserts nothing).
#
#   scripts/bench.sh                 representative subset: every scenario with 1 ms kernels and
#                                    plain launches, the pair with 20 µs / 5 ms kernels and with
#                                    cuLaunchKernelEx and graphs, then the launch overhead
#   scripts/bench.sh --all           the full matrix (scenarios × 20 µs, 1 ms, 5 ms × plain, ex,
#                                    graph; about 45 runs of --seconds each)
#   scripts/bench.sh shares ARGS...  one `gpuslice-bench shares` run, e.g.
#                                    --scenario pair,eight --kernel-us 20,5000 --launch graph --seconds 12
#   scripts/bench.sh overhead        the launch overhead only
#   scripts/bench.sh freeze [--runs N] [--seconds S]
#                                    issue 14's pair (0.25/0.75, 1 ms, depth 2) N times (50),
#                                    started together and 0-300 ms apart: gaps and 5 s splits
#   scripts/bench.sh latency [--seconds S]
#                                    a request/response client alone, next to a trainer, and
#                                    with GPUSLICE_PRIORITY=latency: burst p50/p99 (personal
#                                    mode; node mode: latency_personal_vs_node in
#                                    tests/e2e/tests/turns.rs, as root)
#
# Builds the release artifacts, then runs target/release/gpuslice-bench (tests/e2e/src/bin/) on
# the fake GPU (FAKEGPU=0: on the machine's real libcuda.so.1). Each scenario gets its own fake
# GPU and ledger. Scenarios: pair (0.25/0.75), article (0.2/0.5/0.3), eight (8 × 0.125), cap
# (cap 0.3 alone), idle (two of 0.5, one stops halfway: the other's share after), alone (share
# 0.25 alone against the same load unwrapped). "achieved" is over the measured window (from 1 s
# after the start to 1 s before the end: 10 s with the default --seconds 12), "worst-1s" the
# largest deviation of a single 1 s interval from "expected".
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}

cargo build --release -q -p fakegpu -p gpuslice-burn -p gpuslice-shim -p gpuslice -p gpuslice-e2e
bench="$CARGO_TARGET_DIR/release/gpuslice-bench"

gpu="fake GPU"
[ "${FAKEGPU:-1}" = 0 ] && gpu="the system's libcuda.so.1"
echo "# gpuslice compute-share benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs," \
    "$(uname -m), load $(cut -d' ' -f1-3 /proc/loadavg), $gpu"

case "${1:-}" in
    shares) shift; exec "$bench" shares "$@" ;;
    overhead) shift; exec "$bench" overhead "$@" ;;
    freeze) shift; exec "$bench" freeze "$@" ;;
    latency) shift; exec "$bench" latency "$@" ;;
    --all)
        "$bench" shares --all
        "$bench" overhead
        ;;
    "")
        "$bench" shares --scenario pair,article,eight,cap,idle,alone --kernel-us 1000 --launch plain
        "$bench" shares --scenario pair --kernel-us 20,5000 --launch plain
        "$bench" shares --scenario pair --kernel-us 1000 --launch ex,graph
        "$bench" overhead
        ;;
    *) echo "usage: scripts/bench.sh [--all | shares ARGS... | overhead | freeze ARGS... | latency ARGS...]" >&2; exit 2 ;;
esac
