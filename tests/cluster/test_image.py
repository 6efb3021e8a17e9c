"""gpuslice's image as the cluster runs it agrees with deploy/Dockerfile, which users build: the
same files at the same paths, the same entrypoint, the same Debian release as the base."""

import json
import pathlib
import re
import tarfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARCHIVE = pathlib.Path("/var/lib/gpuslice-cluster/images/gpuslice.tar")


def dockerfile_final_stage():
    lines = (ROOT / "deploy/Dockerfile").read_text().splitlines()
    stages = [i for i, ln in enumerate(lines) if ln.startswith("FROM ")]
    final = lines[stages[-1]:]
    base = final[0].split()[1]
    files = {}
    entry = None
    for ln in final[1:]:
        if ln.startswith("COPY "):
            words = ln.split()[1:]
            words = [w for w in words if not w.startswith("--from")]
            *srcs, dst = words
            for s in srcs:
                name = s.rsplit("/", 1)[1]
                files[name] = dst + name if dst.endswith("/") else dst
        elif ln.startswith("ENTRYPOINT "):
            entry = json.loads(ln[len("ENTRYPOINT "):])
    return base, files, entry


def image_archive():
    with tarfile.open(ARCHIVE) as t:
        index = json.load(t.extractfile("index.json"))
        m = index["manifests"][0]
        manifest = json.load(t.extractfile("blobs/sha256/" + m["digest"].split(":")[1]))
        config = json.load(t.extractfile("blobs/sha256/" + manifest["config"]["digest"].split(":")[1]))
        top = manifest["layers"][-1]["digest"].split(":")[1]
        with tarfile.open(fileobj=t.extractfile("blobs/sha256/" + top)) as layer:
            paths = {"/" + n for n in layer.getnames()}
        base = manifest["layers"][0]["digest"].split(":")[1]
        with tarfile.open(fileobj=t.extractfile("blobs/sha256/" + base)) as layer:
            os_release = layer.extractfile("./etc/os-release").read().decode()
    return m["annotations"]["io.containerd.image.name"], config, paths, os_release


def test_the_image_is_the_dockerfiles(cluster):
    base, files, entry = dockerfile_final_stage()
    name, config, paths, os_release = image_archive()
    assert name == "localhost/gpuslice:dev"
    assert config["config"]["Entrypoint"] == entry, (config, entry)
    for f, dst in files.items():
        assert dst in paths, f"{dst} (Dockerfile: {f}) is not in the image: {sorted(paths)}"
    extra = {p for p in paths if not p.endswith("/") and p not in files.values()}
    extra = {p for p in extra if not any(d.startswith(p + "/") for d in files.values())}
    assert not extra, f"the image has files the Dockerfile does not copy: {extra}"
    # debian:bookworm-slim and mmdebstrap's bookworm: one Debian release.
    m = re.match(r"debian:(\w+)", base)
    assert m, base
    assert f"VERSION_CODENAME={m.group(1)}" in os_release, os_release
