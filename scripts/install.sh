#!/usr/bin/env bash
# Install gpuslice: PREFIX/bin/gpuslice and PREFIX/lib/libgpuslice.so (PREFIX defaults to
# /usr/local). Builds the release artifacts first when cargo is available (cargo rebuilds only
# what changed); without cargo, installs the ones already in target/release. Safe to run again:
# files are replaced by rename, so programs already running with the old library keep it.
#
#   scripts/install.sh                 # /usr/local (needs root)
#   scripts/install.sh "$HOME/.local"  # then put $HOME/.local/bin on PATH
#
# `gpuslice run` finds the library at ../lib/libgpuslice.so from its own binary, so the two
# must stay in the same PREFIX (or set GPUSLICE_LIBRARY).
set -euo pipefail

usage() { echo "usage: scripts/install.sh [PREFIX]   (default /usr/local)" >&2; exit 2; }
[ $# -le 1 ] || usage
case "${1:-}" in -h|--help) usage ;; esac
prefix=${1:-/usr/local}
case "$prefix" in /*) ;; *) prefix="$PWD/$prefix" ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
release="$target/release"

if command -v cargo >/dev/null 2>&1; then
    echo "building release artifacts (cargo build --release -p gpuslice -p gpuslice-shim)..." >&2
    (cd "$root" && cargo build --release --quiet -p gpuslice -p gpuslice-shim)
elif [ ! -x "$release/gpuslice" ] || [ ! -f "$release/libgpuslice.so" ]; then
    echo "install.sh: cargo is not on PATH and $release has no gpuslice and libgpuslice.so;" \
         "install Rust (https://rustup.rs) or build them elsewhere and copy target/release here" >&2
    exit 1
fi

# Copy to a temporary name in the destination directory, then rename over the old file: never
# truncate a library that running programs (or /etc/ld.so.preload) have mapped.
put() { # put SRC DEST MODE
    local src=$1 dest=$2 mode=$3 dir tmp
    dir=$(dirname "$dest")
    if ! mkdir -p "$dir" 2>/dev/null || [ ! -w "$dir" ]; then
        echo "install.sh: cannot write to $dir; run as root (sudo scripts/install.sh $prefix)" \
             "or choose another PREFIX, for example scripts/install.sh \"\$HOME/.local\"" >&2
        exit 1
    fi
    if [ -f "$dest" ] && cmp -s "$src" "$dest"; then
        echo "unchanged  $dest"
        return
    fi
    tmp=$(mktemp "$dir/.$(basename "$dest").XXXXXX")
    cp "$src" "$tmp"
    chmod "$mode" "$tmp"
    mv -f "$tmp" "$dest"
    echo "installed  $dest"
}

put "$release/gpuslice" "$prefix/bin/gpuslice" 0755
put "$release/libgpuslice.so" "$prefix/lib/libgpuslice.so" 0644

case ":$PATH:" in
    *":$prefix/bin:"*) ;;
    *) echo "note: $prefix/bin is not on PATH; add it: export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
cat <<MSG
done. Try: gpuslice run --memory 4Gi --compute 0.25 -- python train.py
(cargo install users: \`cargo install --path monitor\` installs only the gpuslice binary; get the
library with \`scripts/install.sh "\$HOME/.cargo"\`, which puts it in ~/.cargo/lib where
~/.cargo/bin/gpuslice finds it, or set GPUSLICE_LIBRARY=/path/to/libgpuslice.so.)
MSG
