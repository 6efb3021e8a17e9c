#!/usr/bin/env bash
# The one command that runs all of gpuslice's tests, on a machine without a GPU:
#   1. a Python venv (.venv, or $GPUSLICE_VENV) with requirements-test.txt installed;
#   2. cargo build --workspace (debug), which the system tests run;
#   3. cargo doc --no-deps with warnings as errors; cargo test --workspace --no-fail-fast: unit
#      tests (protocol/tests/fuzz.rs fuzzes the monitor protocol's decoders for a bounded
#      number of cases) and the system tests of tests/e2e on the fake GPU;
#   4. pytest tests/python: real third-party clients (numba, pynvml, and the GPU frameworks
#      PyTorch, CuPy, JAX, TensorFlow) on the fake GPU.
# The frameworks are installed by scripts/framework-venvs.sh into venvs in a fixed cache
# directory outside the checkout (GPUSLICE_FRAMEWORK_CACHE, default /var/cache/gpuslice-ci), so
# a second run on the machine, a fresh clone's included, downloads nothing.
# Steps 3 and 4 both run even if one fails; the exit status is non-zero if anything failed.
# Each step has a time limit (GPUSLICE_TEST_TIMEOUT seconds, default 1200), so a hung test fails
# the run instead of stalling CI; building the cluster's components, once per machine, has its
# own (GPUSLICE_CLUSTER_BUILD_TIMEOUT, default 3600). Extra arguments go to pytest (e.g. `scripts/test.sh -k numba`).
#
# `scripts/test.sh --no-frameworks` (first argument) leaves out the GPU frameworks: nothing is
# downloaded into the framework cache (about 18 GB the first time) and tests/python/
# test_frameworks_*.py are not run, which the run says at its end. The full run (no flag) is
# the default and what CI runs.
set -euo pipefail

frameworks=1
if [ "${1:-}" = "--no-frameworks" ]; then
    frameworks=0
    shift
fi

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
venv=${GPUSLICE_VENV:-$root/.venv}
limit=${GPUSLICE_TEST_TIMEOUT:-1200}
# The cluster's components, built once per machine (scripts/cluster.sh build).
build_limit=${GPUSLICE_CLUSTER_BUILD_TIMEOUT:-3600}
for v in GPUSLICE_TEST_TIMEOUT=$limit GPUSLICE_CLUSTER_BUILD_TIMEOUT=$build_limit; do
    case ${v#*=} in
    '' | *[!0-9]* | 0) echo "test.sh: ${v%%=*}=${v#*=}: give a whole number of seconds above 0" >&2; exit 2 ;;
    esac
done

step() { printf '\n=== %s\n' "$*" >&2; }

step "python venv: $venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
# Reinstall only when requirements-test.txt changed.
stamp="$venv/.requirements-test.sha256"
sum=$(sha256sum requirements-test.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -r requirements-test.txt
    echo "$sum" >"$stamp"
fi

pytest_args=()
if [ "$frameworks" = 1 ]; then
    step "GPU framework venvs (scripts/framework-venvs.sh)"
    fw_start=$(date +%s)
    bash scripts/framework-venvs.sh </dev/null
    echo "frameworks ready in $(( $(date +%s) - fw_start )) s" >&2
else
    step "GPU framework venvs: skipped (--no-frameworks)"
    pytest_args+=(--ignore-glob='tests/python/test_frameworks_*.py')
fi

step "cargo build --workspace"
cargo build --workspace

step "fake GPU libraries (scripts/fakegpu.sh)"
FAKEGPU_LIB_DIR=$(bash scripts/fakegpu.sh </dev/null | tail -n 1)
export FAKEGPU_LIB_DIR
export GPUSLICE_PROFILE_DIR="$CARGO_TARGET_DIR/debug"

# Root-only tests (node mode: a root monitor, other users) fail when not root unless told to
# skip; skipped ones are listed in $root_not_run and reported below as not run, never as passed.
root_not_run="$CARGO_TARGET_DIR/tests-not-run"
: >"$root_not_run"
if [ "$(id -u)" != 0 ]; then
    export GPUSLICE_ROOT_TESTS=skip GPUSLICE_NOT_RUN_FILE="$root_not_run"
fi

failed=()
# The docs build without a warning (a broken link, a bad code block); a minute on CI.
step "cargo doc --no-deps (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace || failed+=("cargo doc")

step "cargo test --workspace --no-fail-fast"
# timeout signals the whole process group, so test children of a hung test go too.
timeout -k 10 "$limit" cargo test --workspace --no-fail-fast || failed+=("cargo test")

step "pytest tests/python"
timeout -k 10 "$limit" "$venv/bin/python" -m pytest tests/python ${pytest_args[@]+"${pytest_args[@]}"} "$@" </dev/null ||
    failed+=("pytest")
# The cluster tests: a one-node Kubernetes cluster built from Kubernetes' own components
# (scripts/cluster.sh: the components are built once into GPUSLICE_CLUSTER_CACHE), gpuslice
# installed by its Helm chart, real pods claiming slices (tests/cluster). Root only.
cluster_not_run=""
if [ "${GPUSLICE_CLUSTER_TESTS:-1}" = 0 ]; then
    cluster_not_run="GPUSLICE_CLUSTER_TESTS=0"
elif [ "$(id -u)" != 0 ]; then
    cluster_not_run="not root"
else
    step "Kubernetes cluster tests (scripts/cluster.sh, tests/cluster)"
    cl_start=$(date +%s)
    bash scripts/cluster.sh down >/dev/null 2>&1 || true
    # Building the components is its own step with its own limit: on a new machine it takes
    # about 20 minutes of downloads and compiling on 2 CPUs (docs/cluster.md, "Cost"), after
    # which `up` (gpuslice's release build, the image, the start) has the usual limit.
    if timeout -k 10 "$build_limit" bash scripts/cluster.sh build </dev/null &&
        timeout -k 10 "$limit" bash scripts/cluster.sh up </dev/null &&
        timeout -k 10 600 bash scripts/cluster.sh install </dev/null; then
        echo "cluster up and gpuslice installed in $(( $(date +%s) - cl_start )) s" >&2
        timeout -k 10 "$limit" "$venv/bin/python" -m pytest tests/cluster </dev/null ||
            failed+=("cluster tests")
    else
        failed+=("cluster up/install")
    fi
    bash scripts/cluster.sh logs-on-failure "${failed[*]}" >&2 || true
    bash scripts/cluster.sh down </dev/null || failed+=("cluster down")
fi

# The plain manifests in deploy/ are the Helm chart's rendering (scripts/render-manifests.sh);
# checked with the helm the cluster's build made (tests/cluster/test_chart.py checks it too),
# or any helm on PATH. Without one, said at the end.
step "deploy/ is the chart's rendering (scripts/render-manifests.sh --check)"
render_not_run=""
render_rc=0
bash scripts/render-manifests.sh --check </dev/null || render_rc=$?
case $render_rc in
0) ;;
3) render_not_run="no helm: scripts/cluster.sh build makes one" ;;
*) failed+=("rendered manifests") ;;
esac

not_run=""
if [ -n "$render_not_run" ]; then
    not_run=" (NOT RUN: the check that deploy/ is the chart's rendering: $render_not_run)"
fi
if [ -n "$cluster_not_run" ]; then
    not_run="$not_run (NOT RUN: the Kubernetes cluster tests, tests/cluster: $cluster_not_run)"
fi
if [ "$frameworks" = 0 ]; then
    not_run="$not_run (NOT RUN: the GPU framework tests, tests/python/test_frameworks_*.py: --no-frameworks)"
fi

if [ -s "$root_not_run" ]; then
    n=$(sort -u "$root_not_run" | wc -l)
    step "NOT RUN: $n root-only tests (run as root to run them):"
    sort -u "$root_not_run" >&2
    not_run="$not_run (NOT RUN: $n root-only tests, listed above)"
fi
if [ ${#failed[@]} -gt 0 ]; then
    step "FAILED: ${failed[*]}$not_run"
    exit 1
fi
step "all tests passed$not_run"
