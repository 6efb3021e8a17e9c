//! Every process of a container that `gpuslice cdi`'s spec puts in a slice runs under the shim
//! in that slice, those that cleared their environment too (docs/containers.md): the spec
//! mounts `/etc/ld.so.preload` (naming the library) and the settings file, and the shim reads
//! the file for what its environment lacks. The container is made from the spec as a runtime
//! makes it (`gpuslice_e2e::container`), on a node (a root monitor in node mode) whose
//! operator made the slice, and its processes run as an unprivileged user.
//!
//! Needs root (a mount namespace, other users); without root it prints why and passes
//! vacuously, like tests/e2e/tests/tenants.rs. CI runs as root.

use gpuslice_e2e::container::{fake_gpu_env, Container};
use gpuslice_e2e::need_root;
use gpuslice_e2e::node::*;
use std::path::Path;
use std::process::Stdio;

const GI: u64 = 1 << 30;

/// What node mode charges a context inside its slice's quota on the tests' 16 GiB fake GPU.
const CONTEXT: u64 = 512 << 20;

#[test]
fn a_gpuslice_cdi_spec_holds_every_process_of_the_container() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let cdi = n.root().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let ok = |args: &[&str]| {
        let o = n.cli(0, args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    };
    ok(&["slice", "create", "team-a", "--memory", "4Gi"]);
    let lib = n.bin.join("libgpuslice.so");
    let spec = cdi.join("team-a.json");
    ok(&[
        "cdi",
        "--slice",
        "team-a",
        "--library",
        lib.to_str().unwrap(),
        "--output",
        spec.to_str().unwrap(),
    ]);
    let c = Container::new(&cdi, "gpuslice.dev/slice=team-a", &n.bin, &[&n.root()]);
    let hw = fake_gpu_env(&n.world);
    let hw: Vec<(&str, &str)> = hw.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let burn = n.bin.join("gpuslice-burn");

    // A process that cleared its environment (`env -i`): no LD_PRELOAD, no GPUSLICE_*; the
    // loader preloads the shim from /etc/ld.so.preload, which reads the slice from the file.
    assert_held_to_4_gib(&mut c.command(TENANT_A, &hw, &burn), CONTEXT);

    // A process with the container's environment: LD_PRELOAD and /etc/ld.so.preload name the
    // same library, which the loader maps once; held to 4 GiB, not charged twice (3 GiB would
    // fail at 2 GiB charged per GiB).
    let mut env = c.env();
    env.extend(hw.iter().copied());
    assert!(env.iter().any(|(k, _)| *k == "LD_PRELOAD"), "{env:?}");
    assert_held_to_4_gib(&mut c.command(TENANT_A, &env, &burn), CONTEXT);

    // Another copy of the library in LD_PRELOAD (an image's own): the loader binds every
    // call to the first one loaded, and the other is never called: charged once too.
    let mut other = hw.clone();
    other.push(("LD_PRELOAD", "/opt/own/libgpuslice.so"));
    let copy = format!(
        "mkdir -p \"$R/opt/own\" && cp {} \"$R/opt/own/\"",
        lib.display()
    );
    assert_held_to_4_gib(
        &mut c.command_after(TENANT_A, &other, &burn, &copy),
        CONTEXT,
    );

    // ... and it is in the slice: the node's status lists it there while it holds 1 GiB.
    let mut holder = c
        .command(TENANT_A, &hw, &burn)
        .args(["--alloc", "1Gi", "--hold", "60", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_slice(&n, "team-a", 1);
    let s = n.status();
    let team = slice_named(&s, "team-a");
    assert_eq!(team["pids"], serde_json::json!([holder.id()]), "{s:#}");
    kill_all([&mut holder]);

    // The environment wins over the file, variable by variable: a process that names a slice
    // of its own and its quota is in that slice (the file still gives it the ledger directory).
    let mut own = hw.clone();
    own.extend([("GPUSLICE_SLICE", "mine"), ("GPUSLICE_MEMORY", "2Gi")]);
    let o = c
        .command(TENANT_A, &own, &burn)
        .args(["--alloc", "2Gi,1Gi", "--json"])
        .output()
        .unwrap();
    let v = burn_json(&o);
    assert_eq!(v["mem_total"], 2 * GI, "{}", text(&o));
    assert_eq!(v["alloc_errors"], serde_json::json!([2]), "{}", text(&o));

    // A program that never calls CUDA runs as before under the preloaded shim (a shell, `ls`).
    let o = c
        .command(TENANT_A, &[], Path::new("/bin/sh"))
        .args([
            "-c",
            "ls /usr/lib/gpuslice/libgpuslice.so && cat /etc/ld.so.preload",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "/usr/lib/gpuslice/libgpuslice.so\n/usr/lib/gpuslice/libgpuslice.so\n",
        "{}",
        text(&o)
    );
    assert!(o.stderr.is_empty(), "{}", text(&o));
}

#[test]
fn a_malformed_settings_file_fails_cuinit_naming_the_file_and_line() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let cdi = n.root().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let lib = n.bin.join("libgpuslice.so");
    let spec = cdi.join("team-b.json");
    let o = n.cli(
        0,
        &[
            "cdi",
            "--slice",
            "team-b",
            "--memory",
            "1Gi",
            "--library",
            lib.to_str().unwrap(),
            "--output",
            spec.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    // An operator's hand edit gone wrong.
    let file = cdi.join("team-b.d/slice.env");
    let t = std::fs::read_to_string(&file).unwrap();
    let at = 1 + t.lines().position(|l| l == "GPUSLICE_MEMORY=1Gi").unwrap();
    std::fs::write(
        &file,
        t.replace("GPUSLICE_MEMORY=1Gi", "GPUSLICE_MEMORY=4XB"),
    )
    .unwrap();
    let c = Container::new(&cdi, "gpuslice.dev/slice=team-b", &n.bin, &[&n.root()]);
    let hw = fake_gpu_env(&n.world);
    let hw: Vec<(&str, &str)> = hw.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let o = c
        .command(TENANT_A, &hw, &n.bin.join("gpuslice-burn"))
        .args(["--alloc", "1Mi", "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("/etc/gpuslice/slice.env"))
        .unwrap_or_else(|| panic!("{}", text(&o)));
    assert!(!o.status.success(), "{}", text(&o));
    let v = burn_json(&o);
    assert_eq!(v["error"]["call"], "cuInit", "{}", text(&o));
    assert_eq!(
        v["error"]["code"],
        1,
        "CUDA_ERROR_INVALID_VALUE: {}",
        text(&o)
    );
    assert!(
        line.starts_with("gpuslice: ")
            && line.contains(&format!(
                "/etc/gpuslice/slice.env line {at}: GPUSLICE_MEMORY"
            ))
            && line.contains("4XB")
            && line.contains("accepted"),
        "{line}"
    );
}
