//! Compute shares through real processes: `gpuslice-burn` under the shim on the fake GPU, whose
//! one execution engine per device is shared by every process of the test's world. Shares are
//! read from burn's own measure (completed kernels × kernel time, per interval), so the
//! scheduler's bookkeeping is not trusted to grade itself. Bounds are loose (±8 points, the
//! issue's), and each figure is taken over the middle of a run, when every tenant is launching.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpuslice_e2e::node::slice_named;
use gpuslice_e2e::World;
use serde_json::Value;

/// Held by each test: shares are measured in real time on a small machine, so the tests of this
/// file run one at a time (each still has its own fake GPU and ledger).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`serial`], and a new world of one 8 GiB device.
fn serial_world() -> (std::sync::MutexGuard<'static, ()>, World) {
    (serial(), World::new(1, "8Gi"))
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

/// One saturating tenant (`secs` seconds, with `env`) alone in a new world, run to its end.
fn alone(name: &str, env: (&str, &str), secs: &str) -> Ran {
    let (_serial, w) = serial_world();
    finish(spawn(&w, name, &[env], &saturating(secs)))
}

/// The interval lines of a tenant as `(start, end, gpu_seconds)` on CLOCK_MONOTONIC (burn's
/// `mono`), so tenants that started at different moments are compared over the same time.
fn spans(r: &Ran) -> Vec<(f64, f64, f64)> {
    let mut out = Vec::new();
    let mut prev: Option<f64> = None;
    for v in &r.intervals {
        let (t, mono) = (v["t"].as_f64().unwrap(), v["mono"].as_f64().unwrap());
        let start = prev.unwrap_or(mono - t);
        out.push((start, mono, v["gpu_seconds"].as_f64().unwrap()));
        prev = Some(mono);
    }
    out
}

/// The wall-clock window in which every tenant was launching: from the latest start plus
/// `warm` seconds to the earliest end minus `cool`.
fn all_ran(rs: &[&Ran], warm: f64, cool: f64) -> (f64, f64) {
    let from = rs
        .iter()
        .map(|r| spans(r).first().map_or(f64::MAX, |s| s.0))
        .fold(f64::MIN, f64::max);
    let to = rs
        .iter()
        .map(|r| spans(r).last().map_or(f64::MIN, |s| s.1))
        .fold(f64::MAX, f64::min);
    (from + warm, to - cool)
}

/// GPU fraction of a tenant over its intervals that lie inside `[from, to]` (CLOCK_MONOTONIC).
fn fraction_in(r: &Ran, from: f64, to: f64) -> f64 {
    let (mut gpu, mut first, mut last) = (0.0, None, 0.0);
    for (a, b, g) in spans(r) {
        if a >= from - 1e-6 && b <= to + 1e-6 {
            gpu += g;
            first.get_or_insert(a);
            last = b;
        }
    }
    let span = last - first.unwrap_or(last);
    assert!(
        span > 0.0,
        "no interval between {from} and {to}: {:?}",
        r.intervals
    );
    gpu / span
}

/// GPU fraction over the intervals that end inside `[from, to]` seconds of the tenant's own
/// run (for a tenant alone, or phases of one tenant's run).
fn fraction_between(r: &Ran, from: f64, to: f64) -> f64 {
    let start = spans(r).first().map_or(0.0, |s| s.0);
    fraction_in(r, start + from, start + to)
}

fn assert_near(what: &str, got: f64, want: f64, r: &Ran) {
    assert_within(what, got, want, 0.08, r)
}

fn assert_within(what: &str, got: f64, want: f64, tol: f64, r: &Ran) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got:.3}, want {want:.3} ± {tol}\nintervals: {:?}\nstderr: {}",
        r.intervals
            .iter()
            .map(|v| v["gpu_fraction"].as_f64().unwrap_or(0.0))
            .collect::<Vec<_>>(),
        r.stderr
    );
}

/// burn's arguments for a tenant that keeps the device busy for `secs` seconds: 1 ms kernels,
/// four in flight.
fn saturating(secs: &str) -> [&str; 6] {
    ["--kernel-us", "1000", "--seconds", secs, "--depth", "4"]
}

/// Tenants with `shares`, all saturating for `secs`; each one's fraction over the window in
/// which all of them ran (less a warm-up second and the last half second).
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
    let ran: Vec<Ran> = tenants.into_iter().map(finish).collect();
    let (from, to) = all_ran(&ran.iter().collect::<Vec<_>>(), 1.0, 0.5);
    ran.into_iter()
        .map(|r| (fraction_in(&r, from, to), r))
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

/// The pair 0.25/0.75 through each way of launching: plain launches, graphs, `cuLaunchKernelEx`.
#[test]
fn each_way_of_launching_is_held_to_its_share() {
    let _serial = serial();
    for (what, args) in [
        (
            "plain launches",
            &["--kernel-us", "1000", "--depth", "4"][..],
        ),
        (
            "graphs",
            &["--kernel-us", "200", "--graph", "8", "--depth", "2"],
        ),
        (
            "cuLaunchKernelEx",
            &["--kernel-us", "500", "--launch", "ex", "--depth", "4"],
        ),
    ] {
        let got = contend(&["0.25", "0.75"], args, 5.0);
        assert_shares(what, &got, &[0.25, 0.75]);
    }
}

#[test]
fn a_slice_of_two_processes_shares_one_share() {
    let (_serial, w) = serial_world();
    let args = saturating("11.5");
    let half = [("GPUSLICE_COMPUTE", "0.5")];
    let ddp: Vec<Tenant> = (0..2).map(|_| spawn(&w, "ddp", &half, &args)).collect();
    let other = spawn(&w, "other", &half, &args);
    let ddp: Vec<Ran> = ddp.into_iter().map(finish).collect();
    let o = finish(other);
    let (from, to) = all_ran(&[&ddp[0], &ddp[1], &o], 1.0, 0.5);
    let f: Vec<f64> = ddp.iter().map(|r| fraction_in(r, from, to)).collect();
    let other_f = fraction_in(&o, from, to);
    let together = f[0] + f[1];
    // Charged by slice: the two processes' launches run in the same turns, and together they
    // pay at most the turn, so their slice gets its share over the 10 s, not less.
    let part = together / (together + other_f);
    eprintln!("slice of two processes: {together:.3} ({f:?}), other {other_f:.3}: part {part:.3}");
    assert!(
        (part - 0.5).abs() <= 0.04,
        "over {:.1} s the slice of two processes got {together:.3} ({f:?}), the other slice \
         {other_f:.3}: part {part:.3}",
        to - from
    );
}

/// Personal mode bounds what a slice's processes queue together, not each on its own
/// (`SchedSlice::queue_in_turn`): eight processes of a 0.25 slice, each keeping 16 launches of
/// 1 ms in flight, next to one 0.75 process. Each process bounding only its own queue, the
/// slice could have eight turns' work queued at every hand-over, running on into the other
/// slice's turns; together they keep the 0.75 slice's part of the GPU time at its share.
#[test]
fn many_processes_of_a_slice_queue_one_turn_together() {
    let (_serial, w) = serial_world();
    let deep = ["--kernel-us", "1000", "--seconds", "11.5", "--depth", "16"];
    let quarter = [("GPUSLICE_COMPUTE", "0.25")];
    let many: Vec<Tenant> = (0..8).map(|_| spawn(&w, "many", &quarter, &deep)).collect();
    let one = spawn(
        &w,
        "one",
        &[("GPUSLICE_COMPUTE", "0.75")],
        &saturating("11.5"),
    );
    let many: Vec<Ran> = many.into_iter().map(finish).collect();
    let one = finish(one);
    let mut all: Vec<&Ran> = many.iter().collect();
    all.push(&one);
    let (from, to) = all_ran(&all, 1.0, 0.5);
    let t1: f64 = many.iter().map(|r| fraction_in(r, from, to)).sum();
    let t2 = fraction_in(&one, from, to);
    let part = t2 / (t1 + t2);
    // The figures of docs/benchmarks/2026-12-01.md (`-- --nocapture`).
    eprintln!(
        "eight processes x 16 deep at 0.25: {t1:.3}; one at 0.75: {t2:.3}; its part {part:.3}"
    );
    assert!(
        part >= 0.71,
        "over {:.1} s the 0.75 slice got {part:.3} of the GPU time ({t2:.3} of the device), the \
         eight processes of the 0.25 slice {t1:.3}",
        to - from
    );
}

/// A contended launch carries events only on a sample of launches (`shim/src/compute/events.rs`),
/// not an event pair each: in the fake's trace of a tenant held to half the device by a
/// neighbour, event records are burn's own one per launch plus a few, not three per launch.
#[test]
fn contended_launches_record_events_on_a_sample() {
    let (_serial, w) = serial_world();
    let half = ("GPUSLICE_COMPUTE", "0.5");
    let traced = spawn(
        &w,
        "traced",
        &[half, ("FAKEGPU_DEBUG", "2")],
        &["--kernel-us", "20", "--seconds", "3", "--depth", "4"],
    );
    let other = spawn(&w, "other", &[half], &saturating("3.5"));
    let t = finish(traced);
    let o = finish(other);
    let calls = |name: &str| {
        let line = format!("fakegpu: trace: {name}");
        t.stderr.lines().filter(|l| *l == line).count()
    };
    let (launches, records) = (calls("cuLaunchKernel"), calls("cuEventRecord"));
    let (from, to) = all_ran(&[&t, &o], 0.5, 0.5);
    let part = fraction_in(&t, from, to);
    assert!(
        part < 0.75,
        "the traced tenant was not held back by its neighbour ({part:.3} of the device)"
    );
    eprintln!("{launches} launches, {records} event records, {part:.3} of the device");
    assert!(launches > 1000, "only {launches} launches traced");
    // gpuslice-burn records one event after each launch itself; the gate adds a fence per
    // 500 µs of estimated work or so (two events when measured): under one more per launch,
    // where an event pair per launch makes three in all.
    assert!(
        records < 2 * launches,
        "{records} event records for {launches} launches"
    );
}

/// A latency slice that saturates the device (not the request/response pattern priority is for)
/// still gets its share, not more: past its lead it waits for turns like any slice.
#[test]
fn a_saturating_latency_slice_keeps_to_its_share() {
    let (_serial, w) = serial_world();
    let args = saturating("6");
    let lat = spawn(
        &w,
        "lat",
        &[
            ("GPUSLICE_COMPUTE", "0.25"),
            ("GPUSLICE_PRIORITY", "latency"),
        ],
        &args,
    );
    let normal = spawn(&w, "normal", &[("GPUSLICE_COMPUTE", "0.75")], &args);
    let (l, n) = (finish(lat), finish(normal));
    let (from, to) = all_ran(&[&l, &n], 1.0, 0.5);
    let got = vec![
        (fraction_in(&l, from, to), l),
        (fraction_in(&n, from, to), n),
    ];
    eprintln!(
        "latency 0.25: {:.3}, normal 0.75: {:.3}",
        got[0].0, got[1].0
    );
    assert_shares("a saturating latency slice", &got, &[0.25, 0.75]);
}

#[test]
fn a_cap_holds_when_alone() {
    let r = alone("capped", ("GPUSLICE_COMPUTE_CAP", "0.3"), "4");
    let f = fraction_between(&r, 0.5, 3.5);
    assert_near("cap 0.3 alone", f, 0.3, &r);
}

#[test]
fn a_share_alone_borrows_the_whole_device() {
    let r = alone("alone", ("GPUSLICE_COMPUTE", "0.25"), "3");
    let f = r.report["gpu_fraction"].as_f64().unwrap();
    assert!(f >= 0.85, "share 0.25 alone got {f:.3}; {:?}", r.report);
}

#[test]
fn a_killed_tenant_gives_its_time_back_within_a_second() {
    let (_serial, w) = serial_world();
    let args = saturating("6");
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
    let (_serial, w) = serial_world();
    let long = spawn(&w, "long", &[("GPUSLICE_COMPUTE", "0.5")], &saturating("6"));
    let short = spawn(
        &w,
        "short",
        &[("GPUSLICE_COMPUTE", "0.5")],
        &saturating("2.5"),
    );
    let s = finish(short);
    let l = finish(long);
    let (from, to) = all_ran(&[&l, &s], 0.5, 0.3);
    let shared = fraction_in(&l, from, to);
    // Alone from half a second after the neighbour's last interval (on the same clock, so a
    // neighbour that started late on a busy host does not count as present).
    let end = |r: &Ran| spans(r).last().map_or(0.0, |x| x.1);
    let alone = fraction_in(&l, end(&s) + 0.5, end(&l));
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
    let (_serial, w) = serial_world();
    let t = spawn(
        &w,
        "seen",
        &[("GPUSLICE_COMPUTE_CAP", "0.5")],
        &saturating("3"),
    );
    std::thread::sleep(Duration::from_millis(2000));
    let v = w.status();
    let _ = finish(t);
    let s = slice_named(&v, "seen");
    let used = s["compute_used"].as_f64().unwrap_or(-1.0);
    assert!(
        (0.3..=0.7).contains(&used),
        "compute_used {used} for a slice capped at 0.5: {s:#}"
    );
}

/// `compute_used` is a slice's part of the device's busy time over the last second: with
/// several slices busy at once (2 ms kernels 8 deep, so the work a turn queued runs into the
/// next turn), a device's slices never sum over 1, in `status --json`, the `status` table and
/// the metrics alike (issue 20: 26.8% + 81.6% before), and the busy device shows near 1.
#[test]
fn compute_used_of_busy_slices_never_sums_over_one() {
    let (_serial, w) = serial_world();
    let args = ["--kernel-us", "2000", "--depth", "8", "--seconds", "7"];
    let tenants: Vec<Tenant> = [("u1", "0.25"), ("u2", "0.25"), ("u3", "0.5"), ("u4", "")]
        .iter()
        .map(|(name, share)| {
            let env: &[(&str, &str)] = if share.is_empty() {
                &[]
            } else {
                &[("GPUSLICE_COMPUTE", share)]
            };
            spawn(&w, name, env, &args)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(2000));
    let mut busiest: f64 = 0.0;
    for _ in 0..8 {
        let v = w.status();
        let json: f64 = v["slices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["compute_used"].as_f64().unwrap())
            .sum();
        let out = w.gpuslice().arg("metrics").output().unwrap();
        let metrics: f64 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("gpuslice_slice_compute_used_ratio{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        let table = w.cli_ok(&["status"]);
        let shown = compute_used_column(&table);
        assert_eq!(shown.len(), 4, "{table}");
        let percent: f64 = shown.iter().sum();
        println!("compute_used summed: json {json:.4}, metrics {metrics:.4}, table {percent:.1}%");
        assert!(json <= 1.0 + 1e-9, "slices sum to {json}: {v:#}");
        assert!(metrics <= 1.0 + 1e-6, "metrics sum to {metrics}");
        // Each figure is rounded to a tenth of a point.
        assert!(percent <= 100.0 + 0.05 * 4.0, "{table}");
        busiest = busiest.max(json);
        std::thread::sleep(Duration::from_millis(400));
    }
    for t in tenants {
        let _ = finish(t);
    }
    assert!(
        busiest >= 0.8,
        "four busy slices shown using {busiest:.3} of the device"
    );
}

/// The COMPUTE USED column of the slices table in `gpuslice status`, in percent (the column is
/// right-aligned under its header, `COMPUTE USED (1 s)`).
fn compute_used_column(table: &str) -> Vec<f64> {
    let mut lines = table.lines().skip_while(|l| !l.starts_with("SLICE "));
    let header = lines
        .next()
        .unwrap_or_else(|| panic!("no slices table: {table}"));
    let at = header.find("COMPUTE USED").unwrap();
    let end = at + header[at..].find("  ").unwrap_or(header.len() - at);
    lines
        // The rows end at a blank line or at the legend under the table.
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("COMPUTE SHARE:"))
        .map(|l| {
            let cell = l[..end].split_whitespace().last().unwrap();
            cell.trim_end_matches('%')
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("{l}"))
        })
        .collect()
}

/// The longest time in `[from, to]` (CLOCK_MONOTONIC) in which a tenant completed nothing,
/// seen through its interval lines (a line with no kernels extends the gap).
fn longest_gap(r: &Ran, from: f64, to: f64) -> f64 {
    let mut last = from;
    let mut gap: f64 = 0.0;
    for (v, (_, b, _)) in r.intervals.iter().zip(spans(r)) {
        if b < from || b > to {
            continue;
        }
        if v["kernels"].as_u64().unwrap_or(0) > 0 {
            gap = gap.max(b - last);
            last = b;
        }
    }
    gap.max(to - last)
}

/// Issue 14's freeze, through real processes: the pair 0.25/0.75 (1 ms kernels, depth 2, as
/// the issue ran it) started together and up to 300 ms apart. Neither may go 1.2 s without a
/// completed kernel, and the split holds within 4 points over every 5 s window. (The 50 runs
/// are `scripts/bench.sh freeze`; this is a few of them.)
#[test]
fn a_pair_started_together_or_apart_never_freezes() {
    let _serial = serial();
    for delay_ms in [0u64, 150, 300] {
        let w = World::new(1, "8Gi");
        let args = [
            "--kernel-us",
            "1000",
            "--depth",
            "2",
            "--seconds",
            "6.5",
            "--json",
            "--report-interval",
            "0.2",
        ];
        let spawn_one = |name: &str, share: &str| {
            let mut c: Command = w.wrapped_burn();
            c.args(args)
                .env("GPUSLICE_SLICE", name)
                .env("GPUSLICE_COMPUTE", share)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            Tenant {
                child: c.spawn().expect("spawn gpuslice-burn"),
                name: name.into(),
            }
        };
        let a = spawn_one("quarter", "0.25");
        std::thread::sleep(Duration::from_millis(delay_ms));
        let b = spawn_one("three-quarters", "0.75");
        let (a, b) = (finish(a), finish(b));
        let (from, to) = all_ran(&[&a, &b], 0.3, 0.2);
        for (r, name) in [(&a, "0.25"), (&b, "0.75")] {
            let g = longest_gap(r, from, to);
            assert!(
                g <= 1.2,
                "delay {delay_ms} ms: tenant {name} completed nothing for {g:.2} s: {:?}",
                r.intervals
            );
        }
        let (mut w0, mut windows) = (from, 0);
        while w0 + 5.0 <= to + 1e-6 {
            windows += 1;
            let (fa, fb) = (fraction_in(&a, w0, w0 + 5.0), fraction_in(&b, w0, w0 + 5.0));
            let part = fa / (fa + fb);
            assert_within(
                &format!(
                    "delay {delay_ms} ms, 5 s from {:.1} s: part of 0.25",
                    w0 - from
                ),
                part,
                0.25,
                0.04,
                &a,
            );
            w0 += 0.5;
        }
        assert!(
            windows >= 1,
            "delay {delay_ms} ms: both ran only {:.1} s, no 5 s window to check",
            to - from
        );
    }
}

/// Shares hold with every CPU busy: the test runs a busy loop per CPU itself (nice 0, like any
/// CPU-heavy neighbour on a GPU node) while the pair 0.25/0.75 runs; within 4 points over 10 s.
#[test]
fn shares_hold_with_every_cpu_busy() {
    let _serial = serial();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let loops: Vec<_> = (0..cpus)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    let got = contend(
        &["0.25", "0.75"],
        &["--kernel-us", "1000", "--depth", "4"],
        11.5,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in loops {
        let _ = l.join();
    }
    let total: f64 = got.iter().map(|g| g.0).sum();
    eprintln!(
        "CPUs busy ({cpus} busy loops): parts {:.3} / {:.3} of {total:.3}",
        got[0].0 / total,
        got[1].0 / total
    );
    for ((f, r), w) in got.iter().zip([0.25, 0.75]) {
        assert_within(
            &format!("CPUs busy, share {w}: part of the GPU time"),
            f / total,
            w,
            0.04,
            r,
        );
    }
}

/// `gpuslice slice set` on running tenants: 0.25/0.75 swapped to 0.75/0.25 after 2.5 s. The
/// tenants' own throughput shows the new split from 1 s after the change on (within 8 points),
/// and `status` shows the new shares at once.
#[test]
fn slice_set_changes_running_shares_within_a_second() {
    let (_serial, w) = serial_world();
    let args = saturating("7");
    let a = spawn(&w, "t0", &[("GPUSLICE_COMPUTE", "0.25")], &args);
    let b = spawn(&w, "t1", &[("GPUSLICE_COMPUTE", "0.75")], &args);
    std::thread::sleep(Duration::from_millis(2500));
    let set = |name: &str, change: &[&str]| {
        w.cli_ok(&[&["slice", "set", name][..], change].concat());
    };
    // Lower first, so the raise is admitted (guarantees never sum past 1).
    set("t1", &["--compute", "0.25"]);
    set("t0", &["--compute", "0.75"]);
    let changed = gpuslice_sched::now_ns() as f64 / 1e9;
    let v = w.status();
    let share_of = |n: &str| slice_named(&v, n)["compute_share"].as_f64().unwrap_or(-1.0);
    assert!(
        (share_of("t0") - 0.75).abs() < 1e-6 && (share_of("t1") - 0.25).abs() < 1e-6,
        "status does not show the new shares: {v:#}"
    );
    assert_eq!(slice_named(&v, "t0")["priority"], "normal", "{v:#}");
    // The class too is shown at once (and set back: this test is about shares).
    for class in ["latency", "normal"] {
        set("t1", &["--priority", class]);
        let v2 = w.status();
        assert_eq!(slice_named(&v2, "t1")["priority"], class, "{v2:#}");
    }
    // Refused with both figures: raising past what the device has left.
    let out = w
        .gpuslice()
        .args(["slice", "set", "t1", "--compute", "0.5"])
        .output()
        .expect("gpuslice slice set");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("requested 0.50, available 0.25"),
        "{err}"
    );
    let (a, b) = (finish(a), finish(b));
    let (_, to) = all_ran(&[&a, &b], 0.0, 0.5);
    let (fa, fb) = (
        fraction_in(&a, changed + 1.0, to),
        fraction_in(&b, changed + 1.0, to),
    );
    assert_within("t0 after slice set to 0.75", fa / (fa + fb), 0.75, 0.08, &a);
}
