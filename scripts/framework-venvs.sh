#!/usr/bin/env bash
# Install the GPU frameworks the tests run on the fake GPU (PyTorch, CuPy + JAX, TensorFlow),
# each group in its own venv, from requirements-{torch,cuda12,tf}.txt. The venvs live in a fixed
# cache directory outside the checkout (GPUSLICE_FRAMEWORK_CACHE, default /var/cache/gpuslice-ci),
# named by the hash of their requirements file, so a second run on the same machine (a fresh CI
# clone included) reuses them and downloads nothing; pip's own wheel cache sits beside them.
# Prints one line per group: `NAME=/path/to/venv`. Exits non-zero if an install fails.
# Honours GPUSLICE_FRAMEWORKS (space-separated subset of: torch cuda12 tf).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache=${GPUSLICE_FRAMEWORK_CACHE:-/var/cache/gpuslice-ci}
groups=${GPUSLICE_FRAMEWORKS:-torch cuda12 tf}
python=${PYTHON:-python3}
mkdir -p "$cache/pip"
export PIP_CACHE_DIR="$cache/pip" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
pyver=$("$python" -c 'import sys; print("%d%d" % sys.version_info[:2])')
install() {  # GROUP REQ VENV: a fresh venv with REQ installed, marked complete at the end
    local group=$1 req=$2 venv=$3 start
    start=$(date +%s)
    echo "framework-venvs.sh: installing $group into $venv" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q -r "$req" >&2
    touch "$venv/.complete"
    echo "framework-venvs.sh: $group installed in $(( $(date +%s) - start )) s" >&2
}

# Missing groups install in parallel (the downloads dominate); then one line per group.
# Each group needs about 7 GB; refuse up front, with the numbers, rather than fill the disk.
missing=0
for group in $groups; do
    sum=$(sha256sum "$root/requirements-$group.txt" 2>/dev/null | cut -c1-16)
    [ -f "$cache/venv-$group-py$pyver-$sum/.complete" ] || missing=$((missing + 1))
done
if [ "$missing" -gt 0 ]; then
    avail=$(df -Pk "$cache" | awk 'NR == 2 { print int($4 / 1048576) }')
    if [ "$avail" -lt $((missing * 8)) ]; then
        echo "framework-venvs.sh: $missing framework venv(s) to install need about $((missing * 8)) GB in $cache, which has $avail GB free; free space there or set GPUSLICE_FRAMEWORK_CACHE" >&2
        exit 1
    fi
fi
pids=() names=() lines=()
for group in $groups; do
    req="$root/requirements-$group.txt"
    [ -f "$req" ] || { echo "framework-venvs.sh: no $req" >&2; exit 2; }
    sum=$(sha256sum "$req" | cut -c1-16)
    venv="$cache/venv-$group-py$pyver-$sum"
    if [ ! -f "$venv/.complete" ]; then
        install "$group" "$req" "$venv" &
        pids+=($!) names+=("$group")
    fi
    lines+=("$group=$venv")
done
failed=0
for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
        echo "framework-venvs.sh: installing ${names[$i]} failed" >&2
        failed=1
    fi
done
[ "$failed" = 0 ] || exit 1
printf '%s\n' "${lines[@]}"
