//! The shim's VRAM quotas through real processes: `gpuslice-burn` under `LD_PRELOAD` on the
//! fake GPU. Every allocation path, both ways of resolving entry points, pass-through, what the
//! program is told about memory, and quotas per device.

use gpuslice_e2e::{in_slice, World, ALLOC_PATHS, GI, MI};
use serde_json::Value;

/// Run `cmd` with `--json`; its report, exit code and stderr.
fn run(mut cmd: std::process::Command, args: &[&str]) -> (Value, i32, String) {
    cmd.args(args).arg("--json");
    let out = cmd.output().expect("spawn gpuslice-burn");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "burn {args:?} printed no JSON (status {:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
                out.status
            )
        });
    (v, out.status.code().unwrap_or(-1), stderr)
}

/// [`run`] a wrapped `gpuslice-burn ARGS` with the memory quota `quota`.
fn under_quota(w: &World, quota: &str, args: &[&str]) -> (Value, i32, String) {
    let mut c = w.wrapped_burn();
    c.env("GPUSLICE_MEMORY", quota);
    run(c, args)
}

fn oks(v: &Value) -> Vec<bool> {
    v["allocs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["ok"].as_bool().unwrap())
        .collect()
}

fn codes(v: &Value) -> Vec<Option<u64>> {
    v["allocs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["code"].as_u64())
        .collect()
}

/// Allocation `i` of report `v` was refused with CUDA_ERROR_OUT_OF_MEMORY (2).
fn assert_refused(v: &Value, i: usize, what: &str) {
    assert_eq!(
        codes(v)[i],
        Some(2),
        "{what}: allocation {i} is refused with CUDA_ERROR_OUT_OF_MEMORY: {v:#}"
    );
}

/// Report `v` of a process under a 1 GiB quota: it got all of it, was full then (as the driver
/// told it), and had all of it back after its frees (in the same process).
fn assert_held_the_quota_then_freed(v: &Value, what: &str) {
    assert_eq!(v["allocated_bytes"], GI, "{what}: {v:#}");
    assert_eq!(v["mem"]["after_alloc"]["free"], 0, "{what}: {v:#}");
    assert_eq!(v["mem"]["after_free"]["free"], GI, "{what}: {v:#}");
}

#[test]
fn every_alloc_path_is_held_to_the_quota_and_freed_memory_can_be_had_again() {
    // Per path, in one process: round 1 gets 4×256Mi of the 1Gi quota and is refused the
    // 5th; everything is freed; round 2 gets the SAME 4×256Mi again and is refused the 5th.
    let w = World::new(1, "16Gi");
    for path in ALLOC_PATHS {
        let (v, code, err) = under_quota(
            &w,
            "1Gi",
            &[
                "--alloc-path",
                path,
                "--alloc",
                "256Mi,256Mi,256Mi,256Mi,256Mi,1",
                "--alloc-rounds",
                "2",
                "--free",
            ],
        );
        assert_eq!(code, 0, "{path}: {v:#}\n{err}");
        let rounds = v["rounds"].as_array().unwrap();
        assert_eq!(rounds.len(), 2, "{path}: {v:#}");
        for (i, r) in rounds.iter().enumerate() {
            let round = i + 1;
            assert_eq!(
                oks(r),
                [true, true, true, true, false, false],
                "{path} round {round}: {r:#}"
            );
            assert_refused(r, 4, &format!("{path} round {round}"));
            assert_eq!(r["allocated_bytes"], GI, "{path} round {round}: {r:#}");
            assert_eq!(
                r["mem_after_alloc"]["free"], 0,
                "{path} round {round}: {r:#}"
            );
        }
        // Both rounds' gigabyte went back: the one between the rounds and the one at the end.
        assert_eq!(v["freed_bytes"], 2 * GI, "{path}: {v:#}");
        assert_eq!(
            oks(&v),
            [true, true, true, true, false, false],
            "{path}: {v:#}"
        );
        assert_refused(&v, 4, path);
        assert_held_the_quota_then_freed(&v, path);
        assert_eq!(v["mem"]["after_alloc"]["total"], GI, "{path}");
    }
}

#[test]
fn graph_memory_beyond_the_quota_is_refused() {
    // Graph memory nodes, added with cuGraphAddMemAllocNode (`graph`) or captured from
    // cuMemAllocAsync (`capture`): the shim charges them when the node is made (the driver
    // takes the memory only at launch), so a node beyond the quota is refused there with
    // CUDA_ERROR_OUT_OF_MEMORY. The device has 16Gi: without the shim every size fits, so the
    // refusals below are the quota's.
    let w = World::new(1, "16Gi");
    let sizes = "768Mi,512Mi,256Mi,2Gi,1";
    for path in ["graph", "capture"] {
        let (v, code, err) = run(w.burn(), &["--alloc-path", path, "--alloc", sizes]);
        assert_eq!(code, 0, "{path} without the shim: {v:#}\n{err}");
        assert_eq!(oks(&v), [true; 5], "{path} without the shim: {v:#}");

        let (v, code, err) = under_quota(
            &w,
            "1Gi",
            &["--alloc-path", path, "--alloc", sizes, "--free"],
        );
        assert_eq!(code, 0, "{path}: {v:#}\n{err}");
        assert_eq!(
            oks(&v),
            [true, false, true, false, false],
            "{path}: 768Mi fits, 512Mi more does not, 256Mi does, then nothing: {v:#}"
        );
        assert_refused(&v, 1, path);
        assert_refused(&v, 3, path);
        assert_held_the_quota_then_freed(&v, path);
    }
}

#[test]
fn graph_memory_stays_charged_while_an_executable_can_take_it() {
    // Instantiate, destroy the graph (legal, and what most programs do), then launch the
    // executable: its 768Mi are taken at launch and must still count against the 1Gi quota,
    // whether the memory node was added (`cuGraphAddMemAllocNode`) or captured
    // (`cuMemAllocAsync` on a capturing stream). Once the memory is freed and the executable
    // destroyed, all of the quota is back.
    let w = World::new(1, "16Gi");
    for variant in ["node", "capture"] {
        let mut c = w.wrapped(gpuslice_e2e::artifact("fakegpu-client"));
        c.env("GPUSLICE_MEMORY", "1Gi")
            .args(["graphmem", &(768 * MI).to_string(), variant]);
        let v = gpuslice_e2e::run_json(&mut c);
        assert_eq!(v["add"], 0, "{variant}: {v}");
        assert_eq!(v["launch"], 0, "{variant}: {v}");
        assert_eq!(v["total"], GI, "{variant}: {v}");
        assert_eq!(
            v["free_after_launch"],
            256 * MI,
            "{variant}: the graph's memory is in use: {v}"
        );
        assert_eq!(
            v["second_alloc"], 2,
            "{variant}: 768Mi more in a 1Gi slice must be CUDA_ERROR_OUT_OF_MEMORY: {v}"
        );
        assert_eq!(
            v["free_after_destroy"], GI,
            "{variant}: the graph and its executable are gone: {v}"
        );
    }
    // A captured allocation beyond the quota is refused, and nothing stays charged.
    let mut c = w.wrapped(gpuslice_e2e::artifact("fakegpu-client"));
    c.env("GPUSLICE_MEMORY", "1Gi")
        .args(["graphmem", &(2 * GI).to_string(), "capture"]);
    let v = gpuslice_e2e::run_json(&mut c);
    assert_eq!(v["add"], 2, "CUDA_ERROR_OUT_OF_MEMORY: {v}");
    assert_eq!(v["free_after_destroy"], GI, "{v}");
}

#[test]
fn the_quota_comes_back_after_frees_in_an_allocation_loop() {
    // Random allocations and frees for a second: the report never shows more than the quota
    // allocated, and at the end everything is free again.
    let w = World::new(1, "16Gi");
    for path in ["plain", "async", "vmm"] {
        let (v, code, err) = under_quota(
            &w,
            "256Mi",
            &[
                "--alloc-path",
                path,
                "--alloc",
                "64Mi,96Mi,32Mi",
                "--alloc-loop",
                "--seconds",
                "1",
                "--free",
            ],
        );
        assert_eq!(code, 0, "{path}: {v:#}\n{err}");
        let lp = &v["alloc_loop"];
        assert!(lp.is_object(), "{path}: no alloc_loop in {v:#}");
        assert!(v["mem"]["after_free"]["free"] == 256 * MI, "{path}: {v:#}");
    }
}

#[test]
fn dlsym_and_proc_address_are_both_enforced_and_disable_passes_through() {
    let w = World::new(1, "16Gi");
    for resolve in ["dlsym", "proc-address"] {
        let (v, _, err) = under_quota(&w, "1Gi", &["--resolve", resolve, "--alloc", "1Gi,1"]);
        assert_eq!(oks(&v), [true, false], "{resolve}: {v:#}\n{err}");
        assert_eq!(v["mem_total"], GI, "{resolve}");

        let mut c = w.wrapped_burn();
        c.env("GPUSLICE_MEMORY", "1Gi").env("GPUSLICE_DISABLE", "1");
        let (v, _, err) = run(c, &["--resolve", resolve, "--alloc", "1Gi,1Gi"]);
        assert_eq!(oks(&v), [true, true], "{resolve} disabled: {v:#}\n{err}");
        assert_eq!(v["mem_total"], 16 * GI, "{resolve} disabled");
    }
    // The stream-ordered path through cuGetProcAddress (the per-thread `_ptsz` variants are
    // checked by address in tests/python/test_shim_clients.py).
    let (v, _, err) = under_quota(
        &w,
        "512Mi",
        &[
            "--resolve",
            "proc-address",
            "--alloc-path",
            "async",
            "--alloc",
            "512Mi,1",
        ],
    );
    assert_eq!(oks(&v), [true, false], "{v:#}\n{err}");
}

#[test]
fn the_program_is_told_its_quota() {
    let w = World::new(1, "16Gi");
    let (v, _, _) = under_quota(&w, "25%", &["--alloc", "1Gi"]);
    assert_eq!(v["mem"]["start"]["total"], 4 * GI);
    assert_eq!(v["mem"]["start"]["free"], 4 * GI);
    assert_eq!(v["mem"]["after_alloc"]["free"], 3 * GI);
    // Without a quota: the device as it is.
    let (v, _, _) = run(w.wrapped_burn(), &["--alloc", "1Gi"]);
    assert_eq!(v["mem"]["start"]["total"], 16 * GI);
}

#[test]
fn quotas_are_per_device_and_devices_are_keyed_by_uuid() {
    let w = World::new(2, "8Gi");
    for (dev, quota) in [("0", GI), ("1", 2 * GI)] {
        let mut c = w.wrapped_burn();
        c.env("GPUSLICE_MEMORY", "0=1Gi,1=2Gi");
        let sizes = format!("{quota},1");
        let (v, _, err) = run(c, &["--device", dev, "--alloc", &sizes]);
        assert_eq!(v["mem_total"], quota, "device {dev}: {v:#}\n{err}");
        assert!(oks(&v)[0], "device {dev}: {v:#}");
        assert!(!*oks(&v).last().unwrap(), "device {dev}: {v:#}");
    }
    // A device not listed has no quota.
    let (v, _, _) = under_quota(&w, "0=1Gi", &["--device", "1", "--alloc", "2Gi"]);
    assert_eq!(oks(&v), [true]);

    // Two processes seeing the devices in different orders share one slice per physical
    // device: the ledger knows each device once, by UUID.
    let mut a = w.wrapped_burn();
    a.envs(in_slice("pair", "1Gi"))
        .env("CUDA_VISIBLE_DEVICES", "1");
    let (va, _, _) = run(a, &["--alloc", "768Mi"]);
    let mut b = w.wrapped_burn();
    b.envs(in_slice("pair", "1Gi"))
        .env("CUDA_VISIBLE_DEVICES", "1,0");
    let (vb, _, _) = run(b, &["--device", "0"]);
    assert_eq!(
        va["device"]["uuid"], vb["device"]["uuid"],
        "both address physical device 1"
    );
    let ledger = gpuslice_ledger::Ledger::open(&w.runtime_dir()).expect("ledger");
    let snap = ledger.snapshot();
    assert_eq!(snap.devices.len(), 2, "{snap:#?}");
    let mut uuids: Vec<_> = snap.devices.iter().map(|d| d.uuid.clone()).collect();
    uuids.dedup();
    assert_eq!(uuids.len(), 2);
}

#[test]
fn a_slice_that_does_not_fit_is_refused_with_requested_and_available() {
    let w = World::new(1, "16Gi");
    let (v, code, err) = under_quota(&w, "100Gi", &["--alloc", "1Mi"]);
    assert_ne!(code, 0);
    assert_eq!(v["error"]["call"], "cuInit", "{v:#}");
    assert_eq!(v["error"]["code"], 1, "CUDA_ERROR_INVALID_VALUE: {v:#}");
    let line = err
        .lines()
        .find(|l| l.starts_with("gpuslice:"))
        .unwrap_or_else(|| panic!("no gpuslice line: {err}"));
    assert!(
        line.contains("GPUSLICE_MEMORY")
            && line.contains("requested 100 GiB")
            && line.contains("available 16 GiB"),
        "{line}"
    );

    // Reservations add up: two 10 GiB slices do not fit on 16 GiB while the first is alive.
    let (holder, _) = gpuslice_e2e::spawn_holding(
        w.wrapped_burn()
            .env("GPUSLICE_MEMORY", "10Gi")
            .args(["--hold", "30", "--json"]),
    );
    let (v, _, err) = under_quota(&w, "10Gi", &["--alloc", "1Mi"]);
    assert_eq!(v["error"]["code"], 1, "{v:#}");
    assert!(err.contains("requested 10 GiB, available 6 GiB"), "{err}");
    // Compute guarantees too.
    let mut c = w.wrapped_burn();
    c.env("GPUSLICE_COMPUTE", "0.7");
    let (h2, _) = gpuslice_e2e::spawn_holding(c.args(["--hold", "30", "--json"]));
    let mut c = w.wrapped_burn();
    c.env("GPUSLICE_COMPUTE", "0.5");
    let (v, _, err) = run(c, &[]);
    assert_eq!(v["error"]["code"], 1, "{v:#}");
    assert!(
        err.contains("GPUSLICE_COMPUTE: requested 0.50, available 0.30"),
        "{err}"
    );
    for mut h in [holder, h2] {
        h.kill().unwrap();
        h.wait().unwrap();
    }
    // Once the holders are gone their reservations come back to the next process.
    let mut c = w.wrapped_burn();
    c.env("GPUSLICE_MEMORY", "10Gi")
        .env("GPUSLICE_COMPUTE", "0.5");
    let (v, code, err) = run(c, &["--alloc", "1Mi"]);
    assert_eq!(code, 0, "{v:#}\n{err}");
}

#[test]
fn a_named_slice_is_shared_and_its_values_win() {
    let w = World::new(1, "16Gi");
    let (mut holder, _) = gpuslice_e2e::spawn_holding(
        w.wrapped_burn()
            .envs(in_slice("team", "1Gi"))
            .args(["--alloc", "768Mi", "--hold", "30", "--json"]),
    );
    // Asks for 4Gi, gets the slice's 1Gi (with a warning), of which 768Mi are taken.
    let mut c = w.wrapped_burn();
    c.envs(in_slice("team", "4Gi"));
    let (v, _, err) = run(c, &["--alloc", "256Mi,1"]);
    assert_eq!(oks(&v), [true, false], "{v:#}\n{err}");
    assert_eq!(v["mem"]["start"]["total"], GI);
    assert_eq!(v["mem"]["start"]["free"], 256 * MI);
    assert!(
        err.contains("already exists") && err.contains("using its values"),
        "{err}"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn hami_variables_are_understood() {
    let w = World::new(2, "8Gi");
    let mut c = w.wrapped_burn();
    c.env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "512m");
    let (v, _, _) = run(c, &["--alloc", "1Gi,1"]);
    assert_eq!(oks(&v), [true, false]);
    let mut c = w.wrapped_burn();
    c.env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "512m");
    let (v, _, _) = run(c, &["--device", "1"]);
    assert_eq!(v["mem_total"], 512 * MI);
    // gpuslice's own variable wins.
    let mut c = w.wrapped_burn();
    c.env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .env("GPUSLICE_MEMORY", "2Gi");
    let (v, _, _) = run(c, &[]);
    assert_eq!(v["mem_total"], 2 * GI);
}

#[test]
fn a_process_that_never_touches_cuda_creates_no_ledger() {
    let w = World::new(1, "16Gi");
    let out = w
        .wrapped("/bin/sh")
        .args(["-c", "ls / >/dev/null && echo ok"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!w.runtime_dir().join("ledger").exists());
}

/// Multi-GPU pools: memory allocated from a pool located on device 1, by a thread whose
/// current device is 0, is charged to device 1 (where the driver takes it) and, once freed
/// into the pool and the pool destroyed, credited back to device 1. On main it was charged to
/// the current device and credited to whichever device was current at the destroy: no
/// device's `charged` may go below zero or be credited another device's memory.
#[test]
fn pool_memory_is_charged_and_credited_on_the_pools_device() {
    use std::io::{BufRead, Write};
    let w = World::new(2, "16Gi");
    let mut h = w
        .wrapped(gpuslice_e2e::artifact("gpuslice-e2e-helper"))
        .args(["pool-devices", &(256 * MI).to_string()])
        .envs(in_slice("pools", "1Gi"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = h.stdin.take().unwrap();
    let mut output = std::io::BufReader::new(h.stdout.take().unwrap()).lines();
    let mut step = |s: Option<&str>| {
        if let Some(s) = s {
            writeln!(input, "{s}").unwrap();
        }
        let line = output.next().expect("the helper ended").unwrap();
        assert!(line.starts_with("done"), "{line}");
        line
    };
    let _ = step(None); // the pool exists
    let ledger = gpuslice_ledger::Ledger::open(&w.runtime_dir()).unwrap();
    // (device index in the ledger, slice used, this process's charged) for both devices.
    let held = || {
        let snap = ledger.snapshot();
        let proc_ = snap
            .processes
            .iter()
            .find(|p| p.slice == "pools")
            .expect("the helper's process record");
        let mut out: Vec<(String, u64, u64)> = snap
            .slices
            .iter()
            .filter(|s| s.name == "pools")
            .map(|s| {
                let charged = proc_
                    .devices
                    .iter()
                    .find(|d| d.device == s.device)
                    .map_or(0, |d| d.charged);
                (s.device_uuid.clone(), s.memory_used, charged)
            })
            .collect();
        out.sort();
        assert_eq!(out.len(), 2, "{snap:?}");
        out.into_iter()
            .map(|(_, used, charged)| (used, charged))
            .collect::<Vec<_>>()
    };
    // Fake devices are numbered by their UUIDs' order: [device 0, device 1].
    assert_eq!(held(), [(0, 0), (0, 0)]);
    step(Some("alloc"));
    assert_eq!(
        held(),
        [(0, 0), (256 * MI, 256 * MI)],
        "charged to the pool's device"
    );
    step(Some("free"));
    assert_eq!(
        held(),
        [(0, 0), (256 * MI, 256 * MI)],
        "freed into the pool: still charged there"
    );
    // Device 0 runs short: it reclaims its own pools' credit, never device 1's (on main it
    // returned device 1's pool credit to device 0, whose charged went below zero).
    let line = step(Some("overfill"));
    assert_eq!(line, "done overfill 2", "CUDA_ERROR_OUT_OF_MEMORY expected");
    assert_eq!(
        held()[0],
        (0, 0),
        "device 0 was credited device 1's pool memory"
    );
    step(Some("destroy"));
    assert_eq!(held(), [(0, 0), (0, 0)], "credited to the pool's device");
    drop(input);
    assert!(h.wait().unwrap().success());
}
