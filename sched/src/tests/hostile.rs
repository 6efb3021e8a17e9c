//! Issue 20's hostile tenants, on the time-sliced engine (the hardware's and the fake's: a
//! context keeps the engine while it has work, and hands it on every 2 ms while another has
//! work too), in personal and node mode. t1's 0.25 slice tries to take more than its share
//! from t2's one-process 0.75 slice; t2 must keep at least 0.71 of the device, and t1's slices
//! together at most 0.29, while t2 has work queued.

use super::*;

/// t2's one process: 1 ms kernels, two in flight (gpuslice-burn's defaults).
fn t2(id: u32) -> Tenant {
    Tenant {
        depth: 2,
        learn: true,
        ..tenant(id, 1000)
    }
}

/// Over `(a, b]`: t2 (slice `victim`) got at least 0.71 of the device and the others together
/// at most 0.29; what it got otherwise is added to `failed`.
fn victim_keeps_its_share(
    failed: &mut Vec<String>,
    r: &Ran,
    victim: u32,
    a: u64,
    b: u64,
    what: &str,
) {
    let got = r.slice_fraction(victim, a, b);
    let others: f64 = (0..r.tenants.len())
        .filter(|&i| r.tenants[i].id != victim)
        .map(|i| r.fraction(i, a, b))
        .sum();
    // The figures of docs/benchmarks.md (`-- --nocapture`).
    eprintln!("{what}: 0.75 slice {got:.3}, attacker {others:.3}");
    if got < 0.71 || others > 0.29 {
        failed.push(format!(
            "{what}: over {:.1}..{:.1} s the 0.75 slice got {got:.3}, the attacker {others:.3}",
            a as f64 / 1e9,
            b as f64 / 1e9
        ));
    }
}

/// Runs `case` in personal and node mode, each adding what failed to the list; asserts none did.
fn in_both_modes(case: impl Fn(Mode, &mut Vec<String>)) {
    let mut failed = Vec::new();
    for mode in [PERSONAL, NODE] {
        case(mode, &mut failed);
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// A saturating process of slice `id`: 1 ms kernels, two in flight.
fn saturating(id: u32) -> Tenant {
    Tenant {
        depth: 2,
        ..tenant(id, 1000)
    }
}

/// (a) Many processes in one slice, each with deep queues of long kernels: every process's
/// first launch of a turn went, and what they queued outlasted the turn by far (t2 got 0.05-0.07
/// of the device in node mode on main).
#[test]
fn many_processes_in_one_slice_do_not_take_the_device() {
    in_both_modes(|mode, failed| {
        for (n, kernel_us) in [(16, 8000), (32, 1000)] {
            let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
            let mut ts: Vec<Tenant> = (0..n)
                .map(|_| Tenant {
                    depth: 2,
                    learn: true,
                    ..tenant(1, kernel_us)
                })
                .collect();
            ts.push(t2(2));
            let r = simulate_in(mode, &t, &ts, 4.0);
            let what = format!("{n} processes x {kernel_us} us, node {}", mode.node);
            victim_keeps_its_share(failed, &r, 2, S, 4 * S, &what);
            // And the attacker keeps its own guarantee: its slice saturates, so it is owed
            // 0.25 (node mode charged it the engine time its leftovers shared with t2's turns,
            // and it got 0.21 of the device, before the next grant waited for them).
            let own = r.slice_fraction(1, S, 4 * S);
            if own < 0.24 {
                failed.push(format!("{what}: the 0.25 slice itself got {own:.3}"));
            }
        }
    });
}

/// (a) again with t1's slice in the latency class (a tenant sets its own slice's class): its
/// turns preempt t2's (paid in full, like any span granted); t2 keeps its share, per second
/// too. Node mode only: in personal mode the tenants are one
/// user's, and a latency slice there launches beside the holder, paying as it goes.
#[test]
fn many_processes_in_a_latency_slice_do_not_take_the_device() {
    let mut failed = Vec::new();
    {
        let (mode, failed) = (NODE, &mut failed);
        for (n, kernel_us) in [(16, 8000), (32, 1000), (1, 1000)] {
            let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
            let mut ts: Vec<Tenant> = (0..n)
                .map(|_| Tenant {
                    depth: 2,
                    learn: true,
                    class: CLASS_LATENCY,
                    ..tenant(1, kernel_us)
                })
                .collect();
            ts.push(t2(2));
            let r = simulate_in(mode, &t, &ts, 4.0);
            for s in 1..4 {
                let what = format!(
                    "latency class, {n} processes x {kernel_us} us, node {}, second {s}",
                    mode.node
                );
                victim_keeps_its_share(failed, &r, 2, s * S, (s + 1) * S, &what);
            }
            // It pays for what it uses: its turns, granted by preempting t2's, are charged like
            // any turn (they were charged from the end of t2's work left queued, which ran beside
            // them: about nothing).
            let got = r.slice_fraction(1, 0, 4 * S);
            let charged = t.0[0].0.gpu_ns_total.load(Relaxed) as f64 / (4 * S) as f64;
            eprintln!("latency class, {n} x {kernel_us} us: got {got:.3}, charged {charged:.3}");
            if charged < got - 0.03 {
                failed.push(format!(
                    "latency class, {n} x {kernel_us} us: got {got:.3} of the device over 4 s, \
                     charged {charged:.3}"
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// (b) The virtual-time-floor pump: t1's two best-effort slices (whose virtual time runs 100x
/// faster than the time they get) share the device for 3 s while its 0.25 slice launches one
/// 1 µs kernel every 100 ms (never stale, low virtual time), then saturates; t2's new 0.75
/// slice joins then. On main it started at the floor the best-effort slices had raised, and
/// got no turn for seconds.
#[test]
fn the_virtual_time_floor_cannot_be_pumped() {
    in_both_modes(|mode, failed| {
        let t = Table::new(&[(0.25, 0.0), (0.0, 0.0), (0.0, 0.0), (0.75, 0.0)]);
        let join = 3 * S;
        let light = Tenant {
            burst: Some((1, 100 * MS)),
            stop_ns: Some(join),
            ..tenant(1, 1)
        };
        let saturate = Tenant {
            start_ns: join,
            depth: 2,
            learn: true,
            ..tenant(1, 1000)
        };
        let be = saturating;
        let late = Tenant {
            start_ns: join,
            ..t2(4)
        };
        let r = simulate_in(mode, &t, &[light, saturate, be(2), be(3), late], 6.0);
        let what = format!("pump, node {}", mode.node);
        victim_keeps_its_share(failed, &r, 4, join + 200 * MS, 6 * S, &what);
    });
}

/// (c) 64 best-effort slices of one process each next to t1's 0.25 slice: each weighed 1%
/// (0.64 together), and cut t2 to 0.44.
#[test]
fn many_best_effort_slices_share_only_what_is_not_guaranteed() {
    in_both_modes(|mode, failed| {
        let mut slices = vec![(0.25, 0.0), (0.75, 0.0)];
        slices.extend((0..64).map(|_| (0.0, 0.0)));
        let t = Table::new(&slices);
        let mut ts = vec![saturating(1), t2(2)];
        ts.extend((0..64).map(|i| saturating(3 + i)));
        let r = simulate_in(mode, &t, &ts, 3.0);
        let what = format!("64 best-effort slices, node {}", mode.node);
        victim_keeps_its_share(failed, &r, 2, S, 3 * S, &what);
    });
}

/// (d) t1's process stopped 190 ms and continued 10 ms, over and over: it left its queue
/// running when stopped, and was charged for less than it used.
#[test]
fn stop_continue_cycling_takes_nothing() {
    in_both_modes(|mode, failed| {
        let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
        let cycling = Tenant {
            depth: 8,
            learn: true,
            stalls: (0..30)
                .map(|k| (k * 200 * MS + 10 * MS, (k + 1) * 200 * MS))
                .collect(),
            ..tenant(1, 1000)
        };
        let r = simulate_in(mode, &t, &[cycling, t2(2)], 5.0);
        let what = format!("SIGSTOP/SIGCONT 190/10 ms, node {}", mode.node);
        victim_keeps_its_share(failed, &r, 2, S / 2, 5 * S, &what);
    });
}

/// (e) The headline pair, 0.25 / 0.75, 1 ms kernels at depth 1, 2 and 8, estimates learned from
/// events as the shim does: the 0.25 tenant gets 0.24-0.26 over 10 s (0.22 on main).
#[test]
fn the_headline_pair_gets_its_guarantee() {
    in_both_modes(|mode, failed| {
        for depth in [1, 2, 8] {
            let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
            let ten = |id| Tenant {
                depth,
                learn: true,
                ..tenant(id, 1000)
            };
            let r = simulate_in(mode, &t, &[ten(1), ten(2)], 10.5);
            let (a, b) = (S / 2, 10 * S + S / 2);
            let f = r.fraction(0, a, b);
            let g = r.fraction(1, a, b);
            eprintln!("pair, node {} depth {depth}: {f:.3} / {g:.3}", mode.node);
            if !(0.24..=0.26).contains(&f) || f + g < 0.97 {
                failed.push(format!("node {} depth {depth}: {f:.3} / {g:.3}", mode.node));
            }
        }
    });
}

/// The pair on a busy host: every process (the monitor's too) loses its CPU for 0.1-2.5 ms
/// every 1-12 ms ([`busy_host`]). Each hand-over waits for the holder to wake and hand back,
/// the monitor to grant, and the next holder to wake and launch; with node mode's hand-over
/// lead at 0.5 ms the device idled 4.5 points more than under one launcher alone (0.955 busy at
/// depth 8, the 0.25 tenant 0.239), as on the fake at load 4-6 (docs/benchmarks/2026-12-02.md,
/// "Issue 20, round 3"). Read against a control in the same simulation: one launcher at the
/// same depth alone, stalled the same way. Node mode only: personal mode's figures are printed
/// (its split at depth 8 on a busy host is a known miss, docs/benchmarks/2026-12-02.md).
#[test]
fn the_pair_keeps_the_device_busy_on_a_busy_host() {
    let mut failed = Vec::new();
    for node in [false, true] {
        let mode = Mode {
            monitor_busy_host: if node { 99 } else { 0 },
            ..if node { NODE } else { PERSONAL }
        };
        for depth in [2, 8] {
            let ten = |id, seed| Tenant {
                depth,
                learn: true,
                stalls: busy_host(seed, 11 * S),
                ..tenant(id, 1000)
            };
            let (a, b) = (S / 2, 10 * S + S / 2);
            let alone = simulate_in(mode, &Table::new(&[(1.0, 0.0)]), &[ten(1, 7)], 10.5);
            let lone = alone.fraction(0, a, b);
            let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
            let r = simulate_in(mode, &t, &[ten(1, 7), ten(2, 8)], 10.5);
            let (f, g) = (r.fraction(0, a, b), r.fraction(1, a, b));
            let charged = |id| t.get(id).map_or(0, |t| t.sched.gpu_ns_total.load(Relaxed));
            let (c1, c2) = (charged(1), charged(2));
            eprintln!(
                "busy host, pair, node {node} depth {depth}: {f:.3} / {g:.3}, busy {:.3}, one \
                 launcher alone {lone:.3}; the 0.25 slice {:.3} of the charges",
                f + g,
                c1 as f64 / (c1 + c2).max(1) as f64
            );
            // Within a point of its share of what one launcher keeps busy, and the device
            // idling at most 2.5 points more than under that launcher.
            if node && (f < 0.25 * lone - 0.01 || f > 0.26 || f + g < lone - 0.025) {
                failed.push(format!(
                    "node {node} depth {depth}: {f:.3} / {g:.3} (alone {lone:.3})"
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
