#!/usr/bin/env python3
"""Writes an OCI image archive (image-layout tarball) that `ctr images import` loads.

No registry can be reached on the test machines and no image builder runs without a daemon,
so the cluster's images are assembled here from layer tarballs: a Debian root filesystem made
by mmdebstrap, and a layer of files from the host (the release binaries, the pause program).

    oci_image.py --name localhost/gpuslice:dev --out img.tar \
        --layer rootfs.tar --file target/release/gpuslice:/usr/bin/gpuslice \
        --entrypoint gpuslice-dra --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

Layers are stored uncompressed (the archive stays on the machine). Files added with --file are
owned by root, mode kept from the host, mtime 0, so the same inputs give the same image digest.
"""

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def file_layer(pairs, path):
    """A tar of host files at their image paths, with their parent directories."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        dirs = set()
        for src, dst in pairs:
            dst = dst.lstrip("/")
            parts = dst.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d in dirs:
                    continue
                dirs.add(d)
                info = tarfile.TarInfo(d)
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            st = os.stat(src)
            info = tarfile.TarInfo(dst)
            info.size = st.st_size
            info.mode = st.st_mode & 0o7777
            with open(src, "rb") as f:
                tar.addfile(info, f)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def add_bytes(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True, help="image reference, e.g. localhost/gpuslice:dev")
    p.add_argument("--out", required=True, help="the archive to write")
    p.add_argument("--layer", action="append", default=[], help="a layer tarball, bottom first")
    p.add_argument("--file", action="append", default=[], help="HOST:IMAGE, a file of the top layer")
    p.add_argument("--entrypoint", nargs="+", default=None)
    p.add_argument("--env", action="append", default=[])
    args = p.parse_args()

    pairs = []
    for spec in args.file:
        src, sep, dst = spec.partition(":")
        if not sep or not dst.startswith("/"):
            sys.exit(f"oci_image.py: --file {spec!r}: expected HOST:/IMAGE/PATH")
        if not os.path.isfile(src):
            sys.exit(f"oci_image.py: --file {spec!r}: {src} is not a file")
        pairs.append((src, dst))

    with tempfile.TemporaryDirectory() as tmp:
        layers = list(args.layer)
        if pairs:
            top = os.path.join(tmp, "files.tar")
            file_layer(pairs, top)
            layers.append(top)
        descs = []
        for path in layers:
            digest = sha256_file(path)
            descs.append((path, digest, os.path.getsize(path)))

        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": args.env, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for _, d, _ in descs]},
        }
        if args.entrypoint:
            config["config"]["Entrypoint"] = args.entrypoint
        config_bytes = json.dumps(config, sort_keys=True).encode()
        config_digest = hashlib.sha256(config_bytes).hexdigest()
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": f"sha256:{config_digest}",
                       "size": len(config_bytes)},
            "layers": [{"mediaType": LAYER, "digest": f"sha256:{d}", "size": s}
                       for _, d, s in descs],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        manifest_digest = hashlib.sha256(manifest_bytes).hexdigest()
        tag = args.name.rsplit(":", 1)[1] if ":" in args.name.rsplit("/", 1)[-1] else "latest"
        index = {
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": MANIFEST,
                "digest": f"sha256:{manifest_digest}",
                "size": len(manifest_bytes),
                "annotations": {
                    "io.containerd.image.name": args.name,
                    "org.opencontainers.image.ref.name": tag,
                },
                "platform": {"architecture": "amd64", "os": "linux"},
            }],
        }
        with tarfile.open(args.out, "w") as tar:
            add_bytes(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            add_bytes(tar, "index.json", json.dumps(index, sort_keys=True).encode())
            add_bytes(tar, f"blobs/sha256/{config_digest}", config_bytes)
            add_bytes(tar, f"blobs/sha256/{manifest_digest}", manifest_bytes)
            for path, digest, _ in descs:
                tar.add(path, arcname=f"blobs/sha256/{digest}")
    print(f"{args.name} sha256:{manifest_digest}")


if __name__ == "__main__":
    main()
