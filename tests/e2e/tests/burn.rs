//! `gpuslice-burn` on the fake GPU, without the shim: every allocation path, every launch form,
//! graphs, streams, both ways of resolving entry points, the report's fields and exit codes.

use std::process::Command;
use std::time::{Duration, Instant};

use gpuslice_e2e::{
    fake_context_bytes, run_json, run_json_within, spawn_holding, World, ALLOC_PATHS, GI, MI,
};
use serde_json::Value;

/// Run burn with `args` (plus `--json`); return its report and exit code.
fn burn(w: &World, args: &[&str]) -> (Value, i32) {
    let mut cmd = w.burn();
    cmd.args(args).arg("--json");
    let out = cmd.output().expect("spawn gpuslice-burn");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{'));
    let v = line
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "burn {args:?} printed no JSON (status {:?})\nstdout:\n{stdout}\nstderr:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (v, out.status.code().unwrap_or(-1))
}

/// Run burn expecting success and no error; return its report.
fn burn_ok(w: &World, args: &[&str]) -> Value {
    let (v, code) = burn(w, args);
    assert!(
        code == 0 && v["error"].is_null(),
        "burn {args:?} exited {code}: {v:#}"
    );
    v
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

#[test]
fn every_entry_point_resolves_both_ways() {
    let w = World::new(1, "8Gi");
    for resolve in ["proc-address", "dlsym"] {
        let v = burn_ok(
            &w,
            &[
                "--resolve",
                resolve,
                "--alloc",
                "16Mi",
                "--kernels",
                "4",
                "--kernel-us",
                "100",
            ],
        );
        assert_eq!(v["resolve"], resolve);
        assert_eq!(
            v["missing"],
            serde_json::json!([]),
            "{resolve}: the fake lacks entry points burn uses"
        );
        assert_eq!(u(&v["kernels"]), 4);
        assert!(
            v["device"]["uuid"].as_str().unwrap().starts_with("GPU-"),
            "{v}"
        );
        assert_eq!(u(&v["mem_total"]), 8 * GI);
    }
    let v = burn_ok(
        &w,
        &[
            "--cuda-version",
            "driver",
            "--kernels",
            "1",
            "--kernel-us",
            "10",
        ],
    );
    assert_eq!(v["cuda_version"], v["driver_version"]);
}

#[test]
fn every_alloc_path_allocates_reports_and_frees() {
    let w = World::new(1, "8Gi");
    for path in ALLOC_PATHS {
        let v = burn_ok(
            &w,
            &[
                "--alloc",
                "64Mi,256Mi",
                "--alloc-path",
                path,
                "--touch",
                "--free",
            ],
        );
        let allocs = v["allocs"].as_array().unwrap();
        assert_eq!(allocs.len(), 2, "{path}: {v}");
        assert!(allocs.iter().all(|a| a["ok"] == true), "{path}: {v}");
        let allocated = u(&v["allocated_bytes"]);
        assert!(
            (320 * MI..=384 * MI).contains(&allocated),
            "{path}: {allocated}"
        );
        assert_eq!(u(&v["freed_bytes"]), allocated, "{path}");
        assert_eq!(v["alloc_errors"], serde_json::json!([]), "{path}");
        let start = u(&v["mem"]["start"]["free"]);
        let after = u(&v["mem"]["after_alloc"]["free"]);
        let freed = u(&v["mem"]["after_free"]["free"]);
        // Managed memory need not show as device memory (a real GPU migrates it on demand).
        if path != "managed" {
            assert!(start - after >= 320 * MI, "{path}: free {start} -> {after}");
        }
        assert_eq!(freed, start, "{path}: everything freed");
    }
}

#[test]
fn out_of_memory_is_a_result_and_later_sizes_still_run() {
    let w = World::new(1, "4Gi");
    for path in ALLOC_PATHS.into_iter().filter(|&p| p != "managed") {
        let (v, code) = burn(&w, &["--alloc", "1Gi,16Gi,1Gi", "--alloc-path", path]);
        assert_eq!(code, 0, "{path}: out of memory is expected, exit 0: {v}");
        let ok: Vec<&Value> = v["allocs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| &a["ok"])
            .collect();
        assert_eq!(ok, [true, false, true], "{path}: {v}");
        assert_eq!(v["alloc_errors"], serde_json::json!([2]), "{path}");
        assert_eq!(
            v["alloc_error_names"],
            serde_json::json!(["CUDA_ERROR_OUT_OF_MEMORY"])
        );
        assert_eq!(v["allocs"][1]["name"], "CUDA_ERROR_OUT_OF_MEMORY");
    }
}

#[test]
fn alloc_rounds_free_between_rounds_and_report_each() {
    // On a 1Gi device (no shim): each round fills what its context leaves and is refused the
    // rest; the frees between rounds make round 2 identical to round 1.
    let w = World::new(1, "1Gi");
    let rest = GI - fake_context_bytes(GI);
    let sizes = format!("512Mi,{},1", rest - 512 * MI);
    for path in ALLOC_PATHS.into_iter().filter(|&p| p != "managed") {
        let v = burn_ok(
            &w,
            &[
                "--alloc",
                &sizes,
                "--alloc-path",
                path,
                "--alloc-rounds",
                "3",
            ],
        );
        let rounds = v["rounds"].as_array().unwrap();
        assert_eq!(rounds.len(), 3, "{path}: {v:#}");
        for r in rounds {
            let ok: Vec<&Value> = r["allocs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| &a["ok"])
                .collect();
            assert_eq!(ok, [true, true, false], "{path}: {r:#}");
            assert_eq!(r["alloc_errors"], serde_json::json!([2]), "{path}: {r:#}");
            assert_eq!(u(&r["allocated_bytes"]), rest, "{path}: {r:#}");
            assert_eq!(u(&r["mem_after_alloc"]["free"]), 0, "{path}: {r:#}");
        }
        // Top-level fields are round 1's; every free counts, between rounds and at exit.
        assert_eq!(v["allocs"], rounds[0]["allocs"], "{path}");
        assert_eq!(u(&v["allocated_bytes"]), rest, "{path}");
        assert_eq!(u(&v["freed_bytes"]), 3 * rest, "{path}: {v:#}");
    }
    // Without --alloc there are no rounds; with one round the list has one entry.
    assert_eq!(burn_ok(&w, &[])["rounds"], serde_json::json!([]));
    let v = burn_ok(&w, &["--alloc", "1Mi"]);
    assert_eq!(v["rounds"].as_array().unwrap().len(), 1, "{v:#}");
}

#[test]
fn every_launch_form_runs_the_spin_kernel() {
    let w = World::new(1, "8Gi");
    for launch in ["plain", "ex", "cooperative"] {
        let v = burn_ok(
            &w,
            &["--launch", launch, "--kernels", "40", "--kernel-us", "500"],
        );
        assert_eq!(u(&v["kernels"]), 40, "{launch}");
        assert_eq!(u(&v["launches"]), 40, "{launch}");
        let gpu = v["gpu_seconds"].as_f64().unwrap();
        assert!((gpu - 0.02).abs() < 1e-9, "{launch}: {gpu}");
        // The simulated kernels take their time: events and the wall clock see at least it.
        assert!(
            v["event_seconds"].as_f64().unwrap() >= 0.9 * gpu,
            "{launch}: {v}"
        );
        assert!(
            v["wall_seconds"].as_f64().unwrap() >= 0.9 * gpu,
            "{launch}: {v}"
        );
    }
}

#[test]
fn graphs_replay_every_captured_kernel() {
    let w = World::new(1, "8Gi");
    for launch in ["plain", "ex", "cooperative"] {
        let v = burn_ok(
            &w,
            &[
                "--graph",
                "8",
                "--kernels",
                "40",
                "--kernel-us",
                "250",
                "--launch",
                launch,
            ],
        );
        assert_eq!(
            u(&v["launches"]),
            5,
            "{launch}: one replay per 8 kernels: {v}"
        );
        assert_eq!(u(&v["kernels"]), 40, "{launch}");
        assert!(
            v["event_seconds"].as_f64().unwrap() >= 0.9 * 40.0 * 250e-6,
            "{launch}: {v}"
        );
    }
}

#[test]
fn zero_microsecond_kernels_run_in_every_launch_form() {
    // `--kernel-us 0` is valid: kernels that take no time still complete (a hang here once hid
    // in the fake's executor), plain and as graph replays, on several streams.
    let w = World::new(1, "8Gi");
    for extra in [&[][..], &["--graph", "4"]] {
        let mut cmd = w.burn();
        cmd.args([
            "--kernel-us",
            "0",
            "--kernels",
            "200",
            "--streams",
            "3",
            "--json",
        ])
        .args(extra);
        let v = run_json_within(&mut cmd, Duration::from_secs(60));
        assert!(v["error"].is_null(), "{extra:?}: {v:#}");
        assert_eq!(u(&v["kernels"]), 200, "{extra:?}: {v:#}");
        assert_eq!(v["gpu_seconds"].as_f64(), Some(0.0), "{extra:?}: {v:#}");
    }
}

#[test]
fn streams_and_depth_run_for_the_given_time() {
    let w = World::new(1, "8Gi");
    let v = burn_ok(
        &w,
        &[
            "--streams",
            "3",
            "--depth",
            "4",
            "--seconds",
            "0.4",
            "--kernel-us",
            "1000",
        ],
    );
    assert!(u(&v["kernels"]) > 0, "{v}");
    let wall = v["wall_seconds"].as_f64().unwrap();
    assert!((0.4..10.0).contains(&wall), "{v}");
    // One engine: whatever the streams, this process cannot get more than all of it.
    assert!(v["gpu_fraction"].as_f64().unwrap() <= 1.05, "{v}");
}

#[test]
fn alloc_loop_frees_what_it_allocates() {
    let w = World::new(1, "1Gi");
    let v = burn_ok(
        &w,
        &[
            "--alloc",
            "1Mi,64Mi,300Mi",
            "--alloc-loop",
            "--seconds",
            "0.3",
            "--alloc-path",
            "async",
        ],
    );
    let l = &v["alloc_loop"];
    assert!(
        u(&l["allocs"]) > 0 && u(&l["allocs"]) == u(&l["frees"]),
        "{v}"
    );
    // 8 live allocations of up to 300Mi on a 1Gi device: some are refused, none is an error.
    // Afterwards all its context leaves can be allocated again.
    let rest = (GI - fake_context_bytes(GI)).to_string();
    let again = burn_ok(&w, &["--alloc", &rest]);
    assert_eq!(
        again["alloc_errors"],
        serde_json::json!([]),
        "the loop leaked: {again}"
    );
}

#[test]
fn report_interval_prints_shares_while_running() {
    let w = World::new(1, "8Gi");
    let out = w
        .burn()
        .args([
            "--seconds",
            "1",
            "--kernel-us",
            "1000",
            "--report-interval",
            "0.25",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let intervals: Vec<&Value> = lines.iter().filter(|l| l["event"] == "interval").collect();
    assert!(intervals.len() >= 2, "{stdout}");
    for i in &intervals {
        let f = i["gpu_fraction"].as_f64().unwrap();
        assert!((0.0..=1.2).contains(&f), "{i}");
    }
    assert!(lines.last().unwrap()["kernels"].as_u64().unwrap() > 0);
}

#[test]
fn held_memory_shows_in_other_processes_until_the_holder_dies() {
    let w = World::new(1, "8Gi");
    let start = u(&burn_ok(&w, &[])["mem_free"]);
    // Its first line says it holds what it allocated (spawn_holding checks the event).
    let (mut holder, holding) = spawn_holding(w.burn().args([
        "--alloc",
        "2Gi",
        "--alloc-path",
        "vmm",
        "--hold",
        "60",
        "--json",
    ]));
    assert_eq!(u(&holding["allocated_bytes"]), 2 * GI);
    // Less what it holds and its context (each burn has its own).
    assert_eq!(
        u(&burn_ok(&w, &[])["mem_free"]),
        start - 2 * GI - fake_context_bytes(8 * GI)
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    // A dead process's memory comes back (the real driver frees it when the process exits).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let free = u(&burn_ok(&w, &[])["mem_free"]);
        if free == start {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "memory of a killed holder never came back: {free} != {start}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn bad_usage_exits_2_naming_the_flag() {
    let w = World::new(1, "8Gi");
    for (args, flag) in [
        (&["--alloc", "12XB"][..], "--alloc"),
        (&["--launch", "warp"], "--launch"),
        (&["--alloc-path", "heap"], "--alloc-path"),
    ] {
        let out = w.burn().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(flag),
            "{args:?}"
        );
    }
}

#[test]
fn no_driver_is_a_clear_failure() {
    // Never start a real driver: on a machine that has one, dlopen would find it.
    let cache = std::fs::read("/etc/ld.so.cache").unwrap_or_default();
    if cache.windows(12).any(|w| w == b"libcuda.so.1") {
        eprintln!("skipped: this machine has a real libcuda.so.1");
        return;
    }
    let mut cmd = Command::new(gpuslice_e2e::artifact("gpuslice-burn"));
    cmd.env("LD_LIBRARY_PATH", "/nonexistent")
        .env_remove("LD_PRELOAD")
        .arg("--json");
    let v = run_json(&mut cmd);
    assert_eq!(v["error"]["call"], "dlopen", "{v}");
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
}
