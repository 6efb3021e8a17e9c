#!/usr/bin/env bash
# Build the fake GPU (release) and print, on the last line, the absolute path of a directory
# holding libcuda.so.1, libcuda.so, libnvidia-ml.so.1 and libnvidia-ml.so (links to
# libfakegpu.so), for LD_LIBRARY_PATH:
#
#   export LD_LIBRARY_PATH="$(scripts/fakegpu.sh | tail -n1)"
#
# Honours CARGO_TARGET_DIR. Build output goes to stderr (CARGO_TERM_QUIET=true silences it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cargo build --release -p fakegpu >&2
target="${CARGO_TARGET_DIR:-$root/target}"
target="$(cd "$target" && pwd)"
lib="$target/release/libfakegpu.so"
dir="$target/release/fakegpu-libs"
mkdir -p "$dir"
for name in libcuda.so.1 libcuda.so libnvidia-ml.so.1 libnvidia-ml.so; do
    ln -sfn "$lib" "$dir/$name"
done
echo "$dir"
