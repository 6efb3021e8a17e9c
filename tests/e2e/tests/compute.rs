//! Compute shares through real processes: `gpuslice-burn` under the shim on the fake GPU, whose
//! one execution engine per device is shared by every process of the test's world. Shares are
//! read from burn's own measure (completed kernels × kernel time, per interval), so the
//! scheduler's bookkeeping is not trusted to grade itself. Bounds are loose (±8 points, the
//! issue's), and each figure is taken over the middle of a run, when every tenant is launching.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpuslice_e2e::World;
use serde_json::Value;

/// Held by each test: shares are measured in real time on a small machine, so the tests of this
/// file run one at a time (each still has its own fake GPU and ledger).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A wrapped `gpuslice-burn` started in the background.
struct Tenant {
    child: Child,
    name: String,
}

/// What a tenant printed: its interval lines and its final report.
struct Ran {
    intervals: Vec<Value>,
    report: Value,
    stderr: String,
}

fn spawn(w: &World, name: &str, env: &[(&str, &str)], args: &[&str]) -> Tenant {
    let mut c: Command = w.wrapped_burn();
    c.args(args)
        .args(["--json", "--report-interval", "0.5"])
        .env("GPUSLICE_SLICE", name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    Tenant {
        child: c.spawn().expect("spawn gpuslice-burn"),
        name: name.into(),
    }
}

fn finish(t: Tenant) -> Ran {
    let out = t.child.wait_with_output().expect("wait gpuslice-burn");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let report = lines.last().cloned().unwrap_or(Value::Null);
    assert!(
        out.status.success() && report["error"].is_null(),
        "tenant {} failed ({:?}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        t.name,
        out.status
    );
    let intervals = lines
        .into_iter()
        .filter(|v| v["event"] == "interval")
        .collect();
    Ran {
        intervals,
        report,
        stderr,
    }
}

/// GPU fraction over the intervals that end inside `[from, to]` seconds of the tenant's run.
fn fraction_between(r: &Ran, from: f64, to: f64) -> f64 {
    let (mut gpu, mut first, mut last) = (0.0, None, 0.0);
    let mut prev_t = 0.0;
    for v in &r.intervals {
        let t = v["t"].as_f64().unwrap();
        if t > from && t <= to {
            gpu += v["gpu_seconds"].as_f64().unwrap();
            first.get_or_insert(prev_t);
            last = t;
        }
        prev_t = t;
    }
    let span = last - first.unwrap_or(last);
    assert!(
        span > 0.0,
        "no interval between {from} and {to} s: {:?}",
        r.intervals
    );
    gpu / span
}

fn assert_near(what: &str, got: f64, want: f64, r: &Ran) {
    assert!(
        (got - want).abs() <= 0.08,
        "{what}: got {got:.3}, want {want:.3} ± 0.08\nintervals: {:?}\nstderr: {}",
        r.intervals
            .iter()
            .map(|v| v["gpu_fraction"].as_f64().unwrap_or(0.0))
            .collect::<Vec<_>>(),
        r.stderr
    );
}

/// Tenants with `shares`, all saturating for `secs`; each one's fraction over the middle.
fn contend(shares: &[&str], args: &[&str], secs: f64) -> Vec<(f64, Ran)> {
    let w = World::new(1, "8Gi");
    let secs_s = secs.to_string();
    let mut all: Vec<&str> = vec!["--seconds", &secs_s];
    all.extend_from_slice(args);
    let tenants: Vec<Tenant> = shares
        .iter()
        .enumerate()
        .map(|(i, s)| spawn(&w, &format!("t{i}"), &[("GPUSLICE_COMPUTE", s)], &all))
        .collect();
    tenants
        .into_iter()
        .map(finish)
        .map(|r| (fraction_between(&r, 1.0, secs - 0.5), r))
        .collect()
}

/// Each tenant's part of the GPU time the tenants got together is its share ± 8 points, and
/// none got much less than its share of the whole device. The split is what the scheduler
/// decides; the absolute figure also depends on whether the launching processes got a CPU, which
/// on a loaded 2-core machine they sometimes do not, hence the looser floor.
fn assert_shares(what: &str, got: &[(f64, Ran)], want: &[f64]) {
    let total: f64 = got.iter().map(|g| g.0).sum();
    for ((f, r), w) in got.iter().zip(want) {
        assert_near(
            &format!("{what}: part of the GPU time, share {w}"),
            f / total,
            *w,
            r,
        );
        assert!(
            *f >= w - 0.15,
            "{what}: share {w} got only {f:.3} of the device (all tenants together: {total:.3})"
        );
    }
}

#[test]
fn two_tenants_get_a_quarter_and_three_quarters() {
    let _serial = serial();
    let got = contend(
        &["0.25", "0.75"],
        &["--kernel-us", "1000", "--depth", "4"],
        5.0,
    );
    assert_shares("plain launches", &got, &[0.25, 0.75]);
}

#[test]
fn graphs_are_held_to_their_share() {
    let _serial = serial();
    let args = ["--kernel-us", "200", "--graph", "8", "--depth", "2"];
    let got = contend(&["0.25", "0.75"], &args, 5.0);
    assert_shares("graphs", &got, &[0.25, 0.75]);
}

#[test]
fn launch_ex_is_held_to_its_share() {
    let _serial = serial();
    let args = ["--kernel-us", "500", "--launch", "ex", "--depth", "4"];
    let got = contend(&["0.25", "0.75"], &args, 5.0);
    assert_shares("cuLaunchKernelEx", &got, &[0.25, 0.75]);
}

#[test]
fn a_slice_of_two_processes_shares_one_share() {
    let _serial = serial();
    let w = World::new(1, "8Gi");
    let args = ["--kernel-us", "1000", "--seconds", "5", "--depth", "4"];
    let half = [("GPUSLICE_COMPUTE", "0.5")];
    let ddp: Vec<Tenant> = (0..2).map(|_| spawn(&w, "ddp", &half, &args)).collect();
    let other = spawn(&w, "other", &half, &args);
    let ddp: Vec<f64> = ddp
        .into_iter()
        .map(|t| fraction_between(&finish(t), 1.0, 4.5))
        .collect();
    let o = finish(other);
    let other_f = fraction_between(&o, 1.0, 4.5);
    let together = ddp[0] + ddp[1];
    // The neighbour's guarantee holds. The two processes of one slice on one device launch in
    // the same turns and each pays for its own launches, including the time its kernels wait
    // behind its sibling's, so their slice gets somewhat less than its share, not more.
    assert!(
        other_f >= 0.5 - 0.08 && (0.5 - 0.15..=0.5 + 0.08).contains(&together),
        "slice of two processes got {together:.3} ({ddp:?}), the other slice {other_f:.3}"
    );
}

#[test]
fn a_cap_holds_when_alone() {
    let _serial = serial();
    let w = World::new(1, "8Gi");
    let t = spawn(
        &w,
        "capped",
        &[("GPUSLICE_COMPUTE_CAP", "0.3")],
        &["--kernel-us", "1000", "--seconds", "4", "--depth", "4"],
    );
    let r = finish(t);
    let f = fraction_between(&r, 0.5, 3.5);
    assert_near("cap 0.3 alone", f, 0.3, &r);
}

#[test]
fn a_share_alone_borrows_the_whole_device() {
    let _serial = serial();
    let w = World::new(1, "8Gi");
    let t = spawn(
        &w,
        "alone",
        &[("GPUSLICE_COMPUTE", "0.25")],
        &["--kernel-us", "1000", "--seconds", "3", "--depth", "4"],
    );
    let r = finish(t);
    let f = r.report["gpu_fraction"].as_f64().unwrap();
    assert!(f >= 0.85, "share 0.25 alone got {f:.3}; {:?}", r.report);
}

#[test]
fn a_killed_tenant_gives_its_time_back_within_a_second() {
    let _serial = serial();
    let w = World::new(1, "8Gi");
    let args = ["--kernel-us", "1000", "--seconds", "6", "--depth", "4"];
    let stays = spawn(&w, "stays", &[("GPUSLICE_COMPUTE", "0.5")], &args);
    let mut dies = spawn(&w, "dies", &[("GPUSLICE_COMPUTE", "0.5")], &args);
    std::thread::sleep(Duration::from_millis(2500));
    // SIGKILL at a random point of its launch loop: it may hold the lease, or be waiting.
    dies.child.kill().expect("kill");
    let _ = dies.child.wait();
    let r = finish(stays);
    let before = fraction_between(&r, 1.0, 2.5);
    let after = fraction_between(&r, 3.5, 5.5);
    assert!(before < 0.7, "both were launching, yet one got {before:.3}");
    assert!(
        after >= 0.85,
        "alone after its neighbour died it got only {after:.3}: {:?}",
        r.intervals
    );
}

#[test]
fn an_idle_neighbour_lends_its_time_and_gets_it_back() {
    let _serial = serial();
    let w = World::new(1, "8Gi");
    let long = spawn(
        &w,
        "long",
        &[("GPUSLICE_COMPUTE", "0.5")],
        &["--kernel-us", "1000", "--seconds", "6", "--depth", "4"],
    );
    let short = spawn(
        &w,
        "short",
        &[("GPUSLICE_COMPUTE", "0.5")],
        &["--kernel-us", "1000", "--seconds", "2.5", "--depth", "4"],
    );
    let s = finish(short);
    let l = finish(long);
    let shared = fraction_between(&l, 0.5, 2.0);
    let alone = fraction_between(&l, 3.5, 5.5);
    assert_near("half while both launch", shared, 0.5, &l);
    assert!(
        alone >= 0.85,
        "alone it got only {alone:.3}: {:?} / {:?}",
        l.intervals,
        s.intervals
    );
}

#[test]
fn status_reports_compute_used() {
    let _serial = serial();
    let w = World::new(1, "8Gi");
    let t = spawn(
        &w,
        "seen",
        &[("GPUSLICE_COMPUTE_CAP", "0.5")],
        &["--kernel-us", "1000", "--seconds", "3", "--depth", "4"],
    );
    std::thread::sleep(Duration::from_millis(2000));
    let out = w
        .gpuslice()
        .args(["status", "--json"])
        .output()
        .expect("gpuslice status");
    let _ = finish(t);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let s = v["slices"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == "seen"))
        .unwrap_or_else(|| panic!("slice 'seen' missing from status: {v:#}"));
    let used = s["compute_used"].as_f64().unwrap_or(-1.0);
    assert!(
        (0.3..=0.7).contains(&used),
        "compute_used {used} for a slice capped at 0.5: {s:#}"
    );
}
