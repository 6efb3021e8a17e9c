//! Compute in node mode (issue #10, docs/security.md "Compute in node mode"): turns granted by
//! the root monitor to slices of unprivileged users, on the fake GPU. Shares are read from
//! burn's own measure (completed kernels × kernel time, per half-second interval) over the
//! wall-clock window in which the tenants all ran, never from the scheduler's bookkeeping. The
//! tests hold one lock (they measure in real time on a small machine) and live in their own
//! binary, away from `tenants.rs`'s many-process tests.

use gpuslice_e2e::need_root;
use gpuslice_e2e::node::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Held by the compute tests: shares are measured in real time on a small machine, so they do
/// not run beside each other.
static COMPUTE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn compute_serial() -> std::sync::MutexGuard<'static, ()> {
    COMPUTE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A compute test's node (one 16 GiB device, the node's monitor), the compute lock held while
/// it lives; `None` without root (the test passes vacuously, saying why).
fn compute_node() -> Option<(std::sync::MutexGuard<'static, ()>, Node)> {
    need_root!(None);
    let serial = compute_serial();
    Some((serial, Node::new(1, "16Gi", &[])))
}

/// `c`, a `gpuslice-burn`, saturating the device for `secs` (1 ms kernels, 4 deep) with an
/// interval line every half second; its output piped, for [`ran`].
fn saturating<'c>(c: &'c mut Command, secs: &str) -> &'c mut Command {
    c.args(["--seconds", secs, "--kernel-us", "1000", "--depth", "4"])
        .args(["--json", "--report-interval", "0.5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
}

/// A compute tenant: `gpuslice-burn` saturating the device for `secs` with interval lines.
fn compute_tenant(n: &Node, uid: u32, slice: &str, share: &str, secs: &str) -> Child {
    let mut c = n.burn(uid);
    saturating(&mut c, secs)
        .env("GPUSLICE_SLICE", slice)
        .env("GPUSLICE_COMPUTE", share);
    // A slice name starting with "be-" has no memory quota: its processes charge into their
    // user's best-effort allowance, whose region is where they ask for turns.
    if !slice.starts_with("be-") {
        c.env("GPUSLICE_MEMORY", "1Gi");
    }
    c.spawn().unwrap()
}

/// The pair most tests here run: a 0.25 slice of `TENANT_A` (`{prefix}q`) and a 0.75 slice of
/// `TENANT_B` (`{prefix}tq`), each saturating the device for `secs`.
fn quarter_pair(n: &Node, prefix: &str, secs: &str) -> (Child, Child) {
    (
        compute_tenant(n, TENANT_A, &format!("{prefix}q"), "0.25", secs),
        compute_tenant(n, TENANT_B, &format!("{prefix}tq"), "0.75", secs),
    )
}

/// A finished compute tenant: `(start, end, gpu_seconds)` per interval on CLOCK_MONOTONIC.
struct Ran {
    spans: Vec<(f64, f64, f64)>,
    stderr: String,
}

fn ran(c: Child) -> Ran {
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let mut spans = vec![];
    let mut prev: Option<f64> = None;
    for v in out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "interval")
    {
        let (t, mono) = (v["t"].as_f64().unwrap(), v["mono"].as_f64().unwrap());
        let start = prev.unwrap_or(mono - t);
        spans.push((start, mono, v["gpu_seconds"].as_f64().unwrap()));
        prev = Some(mono);
    }
    assert!(!spans.is_empty(), "no interval lines: {}", text(&o));
    Ran {
        spans,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// The window in which every tenant ran, less `warm` seconds at the start and half a second at
/// the end.
fn all_ran(rs: &[&Ran], warm: f64) -> (f64, f64) {
    let from = rs.iter().map(|r| r.spans[0].0).fold(f64::MIN, f64::max);
    let to = rs
        .iter()
        .map(|r| r.spans.last().unwrap().1)
        .fold(f64::MAX, f64::min);
    (from + warm, to - 0.5)
}

/// A tenant's GPU fraction over its intervals inside `[from, to]`.
fn fraction_in(r: &Ran, from: f64, to: f64) -> f64 {
    let inside: Vec<_> = r
        .spans
        .iter()
        .filter(|s| s.0 >= from - 1e-6 && s.1 <= to + 1e-6)
        .collect();
    assert!(
        !inside.is_empty(),
        "no interval in [{from}, {to}]: {:?}",
        r.spans
    );
    let span = inside.last().unwrap().1 - inside[0].0;
    inside.iter().map(|s| s.2).sum::<f64>() / span
}

/// Both tenants' fractions of the device inside `[from, to]`, and the first one's part of what
/// the two got.
fn parts(a: &Ran, b: &Ran, from: f64, to: f64) -> (f64, f64, f64) {
    let (fa, fb) = (fraction_in(a, from, to), fraction_in(b, from, to));
    (fa, fb, fa / (fa + fb))
}

/// Now on CLOCK_MONOTONIC, in seconds (burn's `mono`).
fn mono() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn per_interval(r: &Ran) -> Vec<String> {
    r.spans
        .iter()
        .map(|s| format!("{:.2}", s.2 / (s.1 - s.0)))
        .collect()
}

/// Slices 0.25 and 0.75 of two users in node mode: each gets its share of the GPU time the two
/// got together within 4 points over 10 s, and the turns are the monitor's (tenants cannot
/// write the lease: the policy is read-only to them).
#[test]
fn node_mode_compute_shares_are_granted_by_the_monitor() {
    let Some((_serial, n)) = compute_node() else {
        return;
    };
    let (a, b) = quarter_pair(&n, "", "11.5");
    let (a, b) = (ran(a), ran(b));
    let (from, to) = all_ran(&[&a, &b], 1.0);
    assert!(
        to - from >= 9.5,
        "the tenants ran together {:.1} s only",
        to - from
    );
    let (fa, fb, part) = parts(&a, &b, from, to);
    println!(
        "node mode 0.25/0.75 over {:.1} s: {fa:.3} + {fb:.3} of the device, part {part:.3}",
        to - from
    );
    assert!(
        (part - 0.25).abs() <= 0.04,
        "0.25 slice got {part:.3} of the GPU time ({fa:.3} vs {fb:.3} of the device)\n\
         a: {:?}\nb: {:?}\n{}\n{}",
        per_interval(&a),
        per_interval(&b),
        a.stderr,
        n.monitor_log()
    );
    // And neither got much less than its share of the whole device (the absolute figure also
    // depends on whether the launching processes got a CPU: the floor of compute.rs).
    for (f, w) in [(fa, 0.25), (fb, 0.75)] {
        assert!(
            f >= w - 0.15,
            "share {w} got only {f:.3} of the device ({fa:.3} + {fb:.3})"
        );
    }
    assert!(
        !a.stderr.contains("unthrottled") && !b.stderr.contains("unthrottled"),
        "{}{}",
        a.stderr,
        b.stderr
    );
}

/// Slices without a memory quota (best-effort memory: their processes' region is their user's
/// pool, shared by that user's best-effort slices) get their compute shares the same way.
#[test]
fn best_effort_memory_slices_get_their_compute_shares() {
    let Some((_serial, n)) = compute_node() else {
        return;
    };
    let (a, b) = quarter_pair(&n, "be-", "6.5");
    let (a, b) = (ran(a), ran(b));
    let (from, to) = all_ran(&[&a, &b], 1.0);
    let (fa, fb, part) = parts(&a, &b, from, to);
    println!("best-effort memory, 0.25/0.75: {fa:.3} + {fb:.3}, part {part:.3}");
    assert!(
        (part - 0.25).abs() <= 0.04,
        "{part:.3}\na: {:?}\nb: {:?}",
        per_interval(&a),
        per_interval(&b)
    );
}

/// A tenant that scribbles its own turn words all the time (waiting forever, the longest turn,
/// busy forever, bogus hand-backs) in every slot of its region, beside its own saturating
/// process: it gets no more than its share, and the other tenant is never stalled.
#[test]
fn a_tenant_scribbling_its_turn_words_gets_no_more_than_its_share() {
    let Some((_serial, n)) = compute_node() else {
        return;
    };
    let a = compute_tenant(&n, TENANT_A, "hostile", "0.25", "9.5");
    wait_for_slice(&n, "hostile", 1);
    let scribbler = n
        .child(TENANT_A, "scribble-turns")
        .env("SCRIBBLE_SECONDS", "9")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let b = compute_tenant(&n, TENANT_B, "honest", "0.75", "9");
    let (a, b) = (ran(a), ran(b));
    let o = scribbler.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let (from, to) = all_ran(&[&a, &b], 1.0);
    let (fa, fb, part) = parts(&a, &b, from, to);
    let detail = format!(
        "a: {:?}\nb: {:?}\nscribbler: {}",
        per_interval(&a),
        per_interval(&b),
        text(&o)
    );
    println!("beside a scribbler: it {fa:.3}, the honest one {fb:.3}");
    // Of the GPU time the two got, the scribbler's slice got no more than its share (4 points),
    // and the honest one no less than its own; neither below its share less 0.15 of the device.
    assert!(
        part <= 0.25 + 0.04,
        "the scribbler's slice got {part:.3} of it\n{detail}"
    );
    assert!(
        fb >= 0.75 - 0.15,
        "the honest slice got {fb:.3} of the device\n{detail}"
    );
    // Never stalled: in every half second of the window the honest tenant ran (a stall is an
    // interval with next to nothing; a busy CPU alone makes a low one).
    for s in b.spans.iter().filter(|s| s.0 >= from && s.1 <= to) {
        let f = s.2 / (s.1 - s.0);
        assert!(
            f >= 0.2,
            "the honest tenant got {f:.2} in one interval\n{detail}"
        );
    }
}

/// A holder stopped in the middle of its turns (SIGSTOP) costs the other tenant about a lease:
/// the monitor grants the next turn when the lease ends, and the stopped slice stops competing.
#[test]
fn a_stopped_compute_holder_costs_the_other_about_a_lease() {
    let Some((_serial, n)) = compute_node() else {
        return;
    };
    let a = compute_tenant(&n, TENANT_A, "stopped", "0.5", "30");
    let b = compute_tenant(&n, TENANT_B, "goes-on", "0.5", "6");
    wait_for_slice(&n, "goes-on", 1);
    std::thread::sleep(Duration::from_secs(2));
    let pid = a.id() as i32;
    // SAFETY: our child (setpriv exec'd into the burn, same pid).
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let stopped_at = mono();
    let b = ran(b);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = a.wait_with_output();
    // From the first interval that began after the stop, B has the device.
    let after: Vec<_> = b.spans.iter().filter(|s| s.0 >= stopped_at).collect();
    assert!(after.len() >= 4, "{:?}", b.spans);
    let fr: Vec<f64> = after[..after.len() - 1]
        .iter()
        .map(|s| s.2 / (s.1 - s.0))
        .collect();
    let mean = fr.iter().sum::<f64>() / fr.len() as f64;
    // B has the device, not the half it had beside A: on average well above its share, and in
    // no interval held to it (measured 0.98-1.00 on an idle machine; with every CPU busy the
    // fake engine's own hand-offs cost B up to a third of an interval now and then).
    assert!(
        mean >= 0.75 && fr.iter().all(|&f| f > 0.5),
        "beside a stopped holder B got {mean:.2} on average: {:?}\n{}",
        per_interval(&b),
        n.monitor_log()
    );
    // The interval in which A stopped: B lost at most about a lease (5 ms) plus a few polls
    // against what it had before (about half the device).
    let during = b
        .spans
        .iter()
        .find(|s| s.0 < stopped_at && s.1 > stopped_at)
        .expect("an interval across the stop");
    let f = during.2 / (during.1 - during.0);
    println!("beside a stopped holder: {:?}", per_interval(&b));
    assert!(f >= 0.45, "{f:.2}: {:?}", per_interval(&b));
}

/// While the monitor is down nobody grants turns: within about a second (`MONITOR_STALE_NS`)
/// both tenants launch unthrottled rather than freeze, and a restarted monitor grants turns
/// again, the shares back from its first second.
#[test]
fn compute_goes_unthrottled_while_the_monitor_is_down_and_shares_come_back() {
    let Some((_serial, mut n)) = compute_node() else {
        return;
    };
    let (a, b) = quarter_pair(&n, "", "10");
    wait_for_slice(&n, "q", 1);
    wait_for_slice(&n, "tq", 1);
    std::thread::sleep(Duration::from_secs(2));
    let down = mono();
    n.stop_monitor();
    std::thread::sleep(Duration::from_secs(4));
    let up = mono();
    n.start_monitor();
    let (a, b) = (ran(a), ran(b));
    let detail = format!("a: {:?}\nb: {:?}", per_interval(&a), per_interval(&b));
    // Nobody froze for long: without grants, waiting tenants go on after MONITOR_STALE_NS
    // (0.5 s); no two half-second intervals in a row without work.
    for r in [&a, &b] {
        for w in r.spans[..r.spans.len() - 1].windows(2) {
            let f = |s: &(f64, f64, f64)| s.2 / (s.1 - s.0);
            assert!(f(&w[0]) > 0.05 || f(&w[1]) > 0.05, "frozen\n{detail}");
        }
    }
    let part = |from: f64, to: f64| parts(&a, &b, from, to).2;
    // Unthrottled: the fake engine splits about evenly between the two.
    let unthrottled = part(down + 1.5, up);
    // Granted again: the quarter.
    let granted = part(
        up + 1.0,
        a.spans.last().unwrap().1.min(b.spans.last().unwrap().1) - 0.5,
    );
    println!("monitor down: part {unthrottled:.3}; back: {granted:.3}");
    assert!(
        unthrottled > 0.35,
        "still throttled without a monitor: {unthrottled:.3}\n{detail}"
    );
    assert!(
        (granted - 0.25).abs() <= 0.08,
        "after the restart: {granted:.3}\n{detail}"
    );
}

/// A slice alone and uncapped holds a solo lease: its launches cost one load of the policy's
/// lease word, and the monitor grants nothing while it runs.
#[test]
fn a_solo_slice_in_node_mode_launches_on_the_fast_path() {
    let Some((_serial, n)) = compute_node() else {
        return;
    };
    let a = compute_tenant(&n, TENANT_A, "alone", "0.25", "3");
    wait_for_slice(&n, "alone", 1);
    std::thread::sleep(Duration::from_millis(500));
    let l = gpuslice_ledger::Ledger::open(&n.world.runtime_dir()).unwrap();
    let dev = &l.devices()[0].sched;
    let lease = gpuslice_sched::Lease::unpack(dev.lease.load(std::sync::atomic::Ordering::SeqCst));
    let leases = dev.leases_total.load(std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(1));
    let later = dev.leases_total.load(std::sync::atomic::Ordering::SeqCst);
    let a = ran(a);
    let s = l.snapshot();
    let si = s.slices.iter().find(|x| x.name == "alone");
    assert!(lease.solo, "{lease:?} {si:?}");
    assert_eq!(later, leases, "grants while solo");
    let f = fraction_in(&a, a.spans[0].0 + 0.5, a.spans.last().unwrap().1);
    assert!(f >= 0.9, "alone it got {f:.3}: {:?}", per_interval(&a));
}

/// A cap holds in node mode too: a slice alone at `GPUSLICE_COMPUTE_CAP=0.3` gets about 0.3 of
/// the device (never a solo lease: its budget is the monitor's).
#[test]
fn a_capped_slice_alone_is_held_to_its_cap_in_node_mode() {
    let Some((_serial, n)) = compute_node() else {
        return;
    };
    let a = saturating(&mut n.burn(TENANT_A), "5")
        .envs(in_slice("capped", "1Gi"))
        .env("GPUSLICE_COMPUTE_CAP", "0.3")
        .spawn()
        .unwrap();
    let a = ran(a);
    let f = fraction_in(&a, a.spans[0].0 + 1.0, a.spans.last().unwrap().1 - 0.5);
    println!("capped at 0.3, alone: {f:.3}");
    // A ceiling: never above it; below only by what a busy CPU costs the launcher (a turn is
    // charged by its span, filled or not), never starved.
    assert!(
        (0.3 - 0.1..=0.3 + 0.05).contains(&f),
        "{f:.3}: {:?}",
        per_interval(&a)
    );
}

/// `GPUSLICE_PRIORITY=latency` in node mode: carried by the admission request, the monitor sets
/// the class of the tenant's own slice (the policy's word, which the turns read); an operator's
/// slice keeps its own class.
#[test]
fn a_tenant_sets_its_own_slices_priority_in_node_mode() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let o = n.cli(0, &["slice", "create", "op", "--memory", "1Gi"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = |slice: &str| {
        let [s, m] = in_slice(slice, "1Gi");
        holder(
            &n,
            TENANT_A,
            &[s, m, ("GPUSLICE_PRIORITY", "latency")],
            "1Mi",
            "3",
        )
    };
    let (a, b) = (run("mine"), run("op"));
    wait_for_slice(&n, "mine", 1);
    wait_for_slice(&n, "op", 1);
    let s = n.status();
    assert_eq!(slice_named(&s, "mine")["priority"], "latency", "{s:#}");
    assert_eq!(slice_named(&s, "op")["priority"], "normal", "{s:#}");
    for c in [a, b] {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
    }
}

/// The same pair (0.25 / 0.75, `--kernel-us 1000 --depth 4`, 6 s) in personal mode (the
/// tenant-run scheduler) and in node mode (the monitor's turns), alternately, `TURNS_BENCH_ROUNDS`
/// times (default 3): the device time both got over the window they ran together, the turns
/// granted per second, and the device time lost per turn (hand-over cost). A measurement for
/// docs/benchmarks.md, not a test: `cargo test -p gpuslice-e2e --test turns -- --ignored
/// --nocapture handover_cost`.
#[test]
#[ignore = "a benchmark (docs/benchmarks.md): run with --ignored --nocapture handover_cost"]
fn handover_cost_personal_vs_node() {
    need_root!();
    let _serial = compute_serial();
    use std::sync::atomic::Ordering::SeqCst;
    let rounds: usize = std::env::var("TURNS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let measure = |a: Ran, b: Ran, leases: u64| {
        let (from, to) = all_ran(&[&a, &b], 1.0);
        let used = fraction_in(&a, from, to) + fraction_in(&b, from, to);
        let secs = a.spans.last().unwrap().1 - a.spans[0].0;
        let per_s = leases as f64 / secs;
        (used, per_s, (1.0 - used).max(0.0) / per_s * 1e6)
    };
    let mut rows: Vec<(&str, (f64, f64, f64))> = vec![];
    for _ in 0..rounds {
        let w = gpuslice_e2e::World::new(1, "16Gi");
        let t = |slice: &str, share: &str| {
            saturating(&mut w.wrapped_burn(), "6")
                .env("GPUSLICE_SLICE", slice)
                .env("GPUSLICE_COMPUTE", share)
                .spawn()
                .unwrap()
        };
        let (a, b) = (t("q", "0.25"), t("tq", "0.75"));
        let (a, b) = (ran(a), ran(b));
        let l = gpuslice_ledger::Ledger::open(&w.runtime_dir()).unwrap();
        rows.push((
            "personal",
            measure(a, b, l.devices()[0].sched.leases_total.load(SeqCst)),
        ));
        let n = Node::new(1, "16Gi", &[]);
        let (a, b) = quarter_pair(&n, "", "6");
        let (a, b) = (ran(a), ran(b));
        let l = gpuslice_ledger::Ledger::open(&n.world.runtime_dir()).unwrap();
        rows.push((
            "node",
            measure(a, b, l.devices()[0].sched.leases_total.load(SeqCst)),
        ));
    }
    for mode in ["personal", "node"] {
        let mut r: Vec<(f64, f64, f64)> =
            rows.iter().filter(|x| x.0 == mode).map(|x| x.1).collect();
        let each: Vec<String> = r
            .iter()
            .map(|x| format!("{:.3}/{:.0}/{:.0}", x.0, x.1, x.2))
            .collect();
        r.sort_by(|x, y| x.2.total_cmp(&y.2));
        let m = r[r.len() / 2];
        println!(
            "{mode}: device used / turns per s / µs lost per turn, each run: {}; median run: {:.3} / {:.0} / {:.0}",
            each.join(", "),
            m.0,
            m.1,
            m.2
        );
    }
}

/// A measurement for docs/benchmarks.md, not a test: how long a newcomer's first kernel takes
/// (its first grant, the holder's last work, its own 100 µs kernel) while another slice holds
/// the device solo, in node mode. `cargo test -p gpuslice-e2e --test turns -- --ignored
/// --nocapture first_grant`.
#[test]
#[ignore = "a benchmark (docs/benchmarks.md): run with --ignored --nocapture first_grant"]
fn first_grant_latency_in_node_mode() {
    let Some((_serial, n)) = compute_node() else {
        return;
    };
    let holder = compute_tenant(&n, TENANT_A, "holder", "0.5", "14");
    wait_for_slice(&n, "holder", 1);
    std::thread::sleep(Duration::from_millis(500));
    let mut ms: Vec<f64> = (0..20)
        .map(|_| {
            let o = n
                .burn(TENANT_B)
                .args(["--kernels", "1", "--kernel-us", "100", "--json"])
                .envs(in_slice("newcomer", "1Gi"))
                .env("GPUSLICE_COMPUTE", "0.5")
                .output()
                .unwrap();
            std::thread::sleep(Duration::from_millis(200));
            burn_json(&o)["wall_seconds"].as_f64().unwrap() * 1e3
        })
        .collect();
    let _ = ran(holder);
    let each: Vec<String> = ms.iter().map(|m| format!("{m:.1}")).collect();
    ms.sort_by(f64::total_cmp);
    println!(
        "first kernel of a newcomer next to a solo holder, ms: {}; median {:.1}, p90 {:.1}",
        each.join(", "),
        ms[ms.len() / 2],
        ms[ms.len() * 9 / 10]
    );
}

/// The request/response latency scenario of `gpuslice-bench latency`
/// (docs/benchmarks/2026-12-01.md, "Compute shares: issue 14"), in personal mode and in node
/// mode side by side: a client
/// (`gpuslice-bench burst-loop`: bursts of 20 kernels of 50 µs, each burst waited for, 10 ms
/// apart; share 0.2) alone, next to a trainer (`gpuslice-burn`, 2 ms kernels 16 deep, share
/// 0.6), and next to it with `GPUSLICE_PRIORITY=latency`; the client's p50/p99 burst latency
/// and the trainer's GPU fraction (burn's own count, from 1 s after its start to the client's
/// end). In node mode the trainer and the client are two unprivileged users and the monitor
/// grants the turns. `TURNS_BENCH_ROUNDS` rounds (default 3), `LATENCY_BENCH_SECONDS` per
/// client run (default 5), `LATENCY_BENCH_SHARE` the client's share (default 0.2; at most 0.4). A measurement for docs/benchmarks.md, not a test: `cargo test -p
/// gpuslice-e2e --test turns -- --ignored --nocapture latency_personal_vs_node`.
#[test]
#[ignore = "a benchmark (docs/benchmarks.md): run with --ignored --nocapture latency_personal_vs_node"]
fn latency_personal_vs_node() {
    need_root!();
    let _serial = compute_serial();
    let env_or = |k: &str, d: f64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let rounds = env_or("TURNS_BENCH_ROUNDS", 3.0) as usize;
    let secs = env_or("LATENCY_BENCH_SECONDS", 5.0);
    let share = env_or("LATENCY_BENCH_SHARE", 0.2).to_string();
    let client_exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_gpuslice-bench"));
    let trainer_args = |c: &mut std::process::Command| {
        c.args(["--kernel-us", "2000", "--depth", "16", "--launch", "plain"])
            .args(["--seconds", &(secs + 1.0).to_string()])
            .args(["--json", "--report-interval", "0.5"])
            .env("GPUSLICE_SLICE", "trainer")
            .env("GPUSLICE_COMPUTE", "0.6")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    };
    let client_args = |c: &mut std::process::Command, case: &str| {
        c.args(["burst-loop", &secs.to_string(), "50"])
            .env("GPUSLICE_SLICE", "server")
            .env("GPUSLICE_COMPUTE", &share);
        if case.ends_with("latency") {
            c.env("GPUSLICE_PRIORITY", "latency");
        }
    };
    // One run: the client to completion (and the trainer's), with the slices' charged device
    // fractions (`compute_used` in `gpuslice status`) read halfway through.
    let measure = |client: &mut std::process::Command,
                   trainer: Option<Child>,
                   status: &dyn Fn() -> serde_json::Value| {
        let c = client
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs_f64(secs * 0.6));
        let st = status();
        let used = |slice: &str| {
            slices_named(&st, slice)
                .next()
                .and_then(|x| x["compute_used"].as_f64())
                .unwrap_or(f64::NAN)
        };
        let charged = (used("server"), used("trainer"));
        let o = c.wait_with_output().unwrap();
        let v = burn_json(&o);
        let trainer = trainer.map_or(f64::NAN, |t| {
            let r = ran(t);
            let s0 = r.spans[0].0;
            fraction_in(&r, s0 + 1.0, s0 + secs)
        });
        let f = |k: &str| v[k].as_f64().unwrap();
        LatencyRun {
            p50: f("p50_ms"),
            p99: f("p99_ms"),
            trainer,
            first_p50: f("admit_p50_ms"),
            first_p99: f("admit_p99_ms"),
            charged,
        }
    };
    const CASES: [&str; 3] = ["alone", "colocated, normal", "colocated, latency"];
    let mut rows: Vec<(&str, &str, LatencyRun)> = vec![];
    for _ in 0..rounds {
        for case in CASES {
            let w = gpuslice_e2e::World::new(1, "16Gi");
            let trainer = (case != "alone").then(|| {
                let mut c = w.wrapped_burn();
                trainer_args(&mut c);
                c.spawn().unwrap()
            });
            std::thread::sleep(Duration::from_millis(500));
            let mut c = w.wrapped(&client_exe);
            client_args(&mut c, case);
            let status = || {
                let o = w.gpuslice().args(["status", "--json"]).output().unwrap();
                serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
            };
            rows.push(("personal", case, measure(&mut c, trainer, &status)));

            let n = Node::new(1, "16Gi", &[]);
            let exe = n.bin.join("gpuslice-bench");
            std::fs::copy(&client_exe, &exe).unwrap();
            chmod(&exe, 0o755);
            let trainer = (case != "alone").then(|| {
                let mut c = n.burn(TENANT_A);
                trainer_args(&mut c);
                c.env("GPUSLICE_MEMORY", "1Gi").spawn().unwrap()
            });
            if trainer.is_some() {
                wait_for_slice(&n, "trainer", 1);
            }
            std::thread::sleep(Duration::from_millis(500));
            let mut c = n.command(TENANT_B, "gpuslice-bench");
            c.env("LD_PRELOAD", n.bin.join("libgpuslice.so"))
                .env("GPUSLICE_MEMORY", "1Gi");
            client_args(&mut c, case);
            rows.push(("node", case, measure(&mut c, trainer, &|| n.status())));
        }
    }
    println!(
        "burst latency (20 x 50 us kernels) p50 / p99 ms, trainer's GPU fraction (burn's count), \
         first launch call p50 / p99 ms, device fraction charged to client / trainer halfway; \
         {rounds} runs each, side by side:"
    );
    for case in CASES {
        for mode in ["personal", "node"] {
            let r: Vec<&LatencyRun> = rows
                .iter()
                .filter(|x| x.0 == mode && x.1 == case)
                .map(|x| &x.2)
                .collect();
            let each: Vec<String> = r
                .iter()
                .map(|x| {
                    format!(
                        "{:.2}/{:.2}/{:.3} first {:.2}/{:.2} charged {:.3}/{:.3}",
                        x.p50, x.p99, x.trainer, x.first_p50, x.first_p99, x.charged.0, x.charged.1
                    )
                })
                .collect();
            let med = |f: fn(&LatencyRun) -> f64| {
                let mut v: Vec<f64> = r.iter().map(|x| f(x)).collect();
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            println!(
                "{case:<20} {mode:<8} each run: {}; medians: p50 {:.2} ms, p99 {:.2} ms, trainer \
                 {:.3}, first launch p50 {:.2} ms, p99 {:.2} ms",
                each.join(", "),
                med(|x| x.p50),
                med(|x| x.p99),
                med(|x| x.trainer),
                med(|x| x.first_p50),
                med(|x| x.first_p99)
            );
        }
    }
}

/// One run of [`latency_personal_vs_node`].
struct LatencyRun {
    p50: f64,
    p99: f64,
    /// The trainer's GPU fraction (burn's own count); NaN alone.
    trainer: f64,
    /// The burst's first launch call (mostly the wait to be admitted).
    first_p50: f64,
    first_p99: f64,
    /// Device fraction charged to the client's and the trainer's slices (`compute_used`).
    charged: (f64, f64),
}

/// Child modes of this binary (see `gpuslice_e2e::node`); without `TENANTS_CHILD` it returns at once.
#[test]
fn tenant_child() {
    serve_child(&[("scribble-turns", scribble_turns)]);
}

/// Child mode `scribble-turns`, in the node's runtime directory `dir`.
fn scribble_turns(dir: &Path) {
    // Join the tenant's own slice (same user, same name) and write the worst into
    // every process slot's turn words of its region, for a while; and try to reach the
    // lease, which is the policy's (read-only).
    use std::sync::atomic::Ordering::SeqCst;
    let region = admitted_region(dir, Some("hostile"), Some(1 << 30), 250_000);
    let l = gpuslice_ledger::Ledger::open(dir).unwrap();
    assert!(!l.writable());
    let secs: f64 = std::env::var("SCRIBBLE_SECONDS").unwrap().parse().unwrap();
    let t0 = Instant::now();
    let mut k = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        k += 1;
        for w in region.procs() {
            w.grant.want_ns.store(u64::MAX - k % 2, SeqCst);
            w.grant.need_ns.store(u64::MAX, SeqCst);
            w.grant.busy_until_ns.store(u64::MAX, SeqCst);
            w.grant.done_turn.store(k, SeqCst);
            w.grant.solo_gpu_ns.store(u64::MAX, SeqCst);
            w.sched.waiting_mask.store(u32::MAX, SeqCst);
        }
        let h = &region.header().sched;
        h.waiters.store(u32::MAX, SeqCst);
        h.vt.store(0, SeqCst);
        h.want_ns.store(u64::MAX, SeqCst);
        std::thread::sleep(Duration::from_micros(200));
    }
}
