"""`gpuslice cdi` writes Container Device Interface specs that a CDI runtime accepts.

Checked against the CDI project's own JSON schema (vendored in data/cdi/, see SOURCE.md there)
with `jsonschema`, plus the rules its Go parser applies that the schema does not encode: kind
and device names (pkg/parser/parser.go), `KEY=VALUE` environment entries, absolute container
paths. The vendored upstream example is validated too, and a broken spec is rejected, so the
validator is known to work.
"""

import json
import pathlib
import re
import subprocess

import jsonschema
import pytest
import referencing

from conftest import artifact

DATA = pathlib.Path(__file__).resolve().parent / "data" / "cdi"

# pkg/parser/parser.go: vendor and class start with a letter and end with a letter or digit;
# device names start and end with a letter or digit; between, these characters.
VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


@pytest.fixture(scope="module")
def validator():
    schema = json.loads((DATA / "schema.json").read_text())
    defs = json.loads((DATA / "defs.json").read_text())
    # schema.json refers to "defs.json#/definitions/..." relative to its own location.
    registry = referencing.Registry().with_resource(
        "defs.json", referencing.Resource.from_contents(defs, referencing.jsonschema.DRAFT7)
    )
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema, registry=registry)


def check_cdi(validator, spec):
    """Everything a CDI runtime checks when it loads this spec; raises on the first problem."""
    validator.validate(spec)
    vendor, _, cls = spec["kind"].partition("/")
    assert VENDOR_OR_CLASS.match(vendor) and VENDOR_OR_CLASS.match(cls), spec["kind"]
    names = [d["name"] for d in spec["devices"]]
    assert len(names) == len(set(names)), names
    for dev in spec["devices"]:
        assert DEVICE_NAME.match(dev["name"]), dev["name"]
        edits = dev["containerEdits"]
        for e in edits.get("env", []):
            assert isinstance(e, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", e), e
        for m in edits.get("mounts", []):
            assert m["containerPath"].startswith("/"), m
            assert m["hostPath"].startswith("/"), m


@pytest.fixture
def gpuslice(profile_dir, tmp_path):
    """Run `gpuslice cdi ARGS`; returns the CompletedProcess."""
    exe = artifact(profile_dir, "gpuslice")
    runtime = tmp_path / "ledger"
    runtime.mkdir()

    def call(*args, **env):
        e = {"PATH": "/usr/bin:/bin", "GPUSLICE_RUNTIME_DIR": str(runtime), **env}
        return subprocess.run([str(exe), "cdi", *args], env=e, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=60)

    call.runtime = runtime
    return call


def test_validator_accepts_upstream_example_and_rejects_broken_specs(validator):
    check_cdi(validator, json.loads((DATA / "spec-example.json").read_text()))
    broken = {"cdiVersion": "0.5.0", "kind": "gpuslice.dev/slice", "devices": [{"name": "a"}]}
    with pytest.raises(jsonschema.ValidationError):
        check_cdi(validator, broken)
    bad_mount = {"cdiVersion": "0.5.0", "kind": "gpuslice.dev/slice",
                 "devices": [{"name": "a", "containerEdits": {"mounts": [{"hostPath": "/x"}]}}]}
    with pytest.raises(jsonschema.ValidationError):
        check_cdi(validator, bad_mount)
    with pytest.raises(AssertionError):
        check_cdi(validator, {**broken, "devices": [{"name": "-a", "containerEdits": {}}]})


def test_generated_spec_validates_and_injects_the_slice(validator, gpuslice, profile_dir):
    p = gpuslice("--slice", "team-a", "--memory", "4Gi", "--compute", "0.25",
                 "--compute-cap", "50%")
    assert p.returncode == 0, p.stderr
    spec = json.loads(p.stdout)
    check_cdi(validator, spec)

    assert spec["kind"] == "gpuslice.dev/slice"
    [dev] = spec["devices"]
    assert dev["name"] == "team-a"
    env = dict(e.split("=", 1) for e in dev["containerEdits"]["env"])
    mounts = {m["containerPath"]: m for m in dev["containerEdits"]["mounts"]}
    assert env["GPUSLICE_SLICE"] == "team-a"
    assert env["GPUSLICE_MEMORY"] == "4Gi"
    assert env["GPUSLICE_COMPUTE"] == "0.25"
    assert env["GPUSLICE_COMPUTE_CAP"] == "50%"
    # The library is mounted read-only where LD_PRELOAD points.
    lib = mounts[env["LD_PRELOAD"]]
    assert "ro" in lib["options"]
    assert pathlib.Path(lib["hostPath"]) == (profile_dir / "libgpuslice.so").resolve()
    # The host's ledger directory is mounted read-write where GPUSLICE_RUNTIME_DIR points.
    ledger = mounts[env["GPUSLICE_RUNTIME_DIR"]]
    assert "rw" in ledger["options"]
    assert ledger["hostPath"] == str(gpuslice.runtime)
    # On stdout there is no beside for the spec's own files: none mounted, and it says so.
    assert "/etc/ld.so.preload" not in mounts and "/etc/gpuslice/slice.env" not in mounts
    assert "clear their environment" in p.stderr


def test_output_file_kind_and_library_flags(validator, gpuslice, tmp_path, profile_dir):
    lib = tmp_path / "libgpuslice.so"
    lib.write_bytes((profile_dir / "libgpuslice.so").read_bytes())
    out = tmp_path / "cdi" / "gpuslice.json"
    out.parent.mkdir()
    p = gpuslice("--slice", "0", "--kind", "example.com/gpu-slice", "--library", str(lib),
                 "--output", str(out))
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""
    assert "--device example.com/gpu-slice=0" in p.stderr
    spec = json.loads(out.read_text())
    check_cdi(validator, spec)
    assert spec["kind"] == "example.com/gpu-slice"
    assert spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] == str(lib)
    # Only the spec is left in the directory a runtime watches (no temporary file), and the
    # directory of its own files (runtimes read no subdirectory), root-only.
    assert sorted(x.name for x in out.parent.iterdir()) == ["gpuslice.d", "gpuslice.json"]
    files = out.parent / "gpuslice.d"
    assert files.stat().st_mode & 0o777 == 0o700
    assert sorted(x.name for x in files.iterdir()) == ["ld.so.preload", "slice.env"]
    # Mounted read-only over the container's /etc/ld.so.preload (naming the library the
    # spec mounts) and at the settings file the shim reads.
    mounts = {m["containerPath"]: m for m in spec["devices"][0]["containerEdits"]["mounts"]}
    preload = mounts["/etc/ld.so.preload"]
    assert preload["hostPath"] == str(files / "ld.so.preload") and "ro" in preload["options"]
    assert (files / "ld.so.preload").read_text() == "/usr/lib/gpuslice/libgpuslice.so\n"
    assert "/usr/lib/gpuslice/libgpuslice.so" in mounts
    settings = mounts["/etc/gpuslice/slice.env"]
    assert settings["hostPath"] == str(files / "slice.env") and "ro" in settings["options"]
    lines = [x for x in (files / "slice.env").read_text().splitlines() if not x.startswith("#")]
    assert lines == ["GPUSLICE_RUNTIME_DIR=/run/gpuslice", "GPUSLICE_SLICE=0"]


@pytest.mark.parametrize("args, says", [
    ([], "--slice"),
    (["--slice", "a/b"], "--slice"),
    (["--slice", "-a"], "--slice"),
    (["--slice", "a", "--memory", "12XB"], "12XB"),
    (["--slice", "a", "--compute", "2"], "--compute"),
    (["--slice", "a", "--kind", "slice"], "--kind"),
    (["--slice", "a", "--kind", "9vendor/x"], "--kind"),
    (["--slice", "a", "--library", "/nonexistent/libgpuslice.so"], "--library"),
    (["--slice", "a", "--bogus"], "--bogus"),
])
def test_bad_arguments_are_exit_2(gpuslice, args, says):
    p = gpuslice(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert says in p.stderr, p.stderr
    assert p.stdout == ""
