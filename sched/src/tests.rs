//! The scheduler's unit tests. Most run simulated processes on the deterministic machine of
//! `sim/` (simulated time, one engine), so each gives the same result on every run however
//! loaded the host is; the bad cases of issue 14 (late joiner, descheduled or SIGSTOPped
//! holder, a waiter that cannot run, tenants starting in the same microsecond) are among them.
//! The rest drive one client with fixed estimates on the real clock.

use super::sim::{Cpu, Engine, Process, Queue, World};
use super::*;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use gpuslice_quantity::{Cap, Share, PPM};
use std::sync::Mutex;

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// The slices of one device: (record, share ppm, cap ppm).
pub(super) struct Table(pub Vec<(SchedSlice, AtomicU32, AtomicU32)>);

impl Table {
    pub fn new(slices: &[(f64, f64)]) -> Table {
        Table(
            slices
                .iter()
                .map(|&(share, cap)| {
                    (
                        SchedSlice::default(),
                        AtomicU32::new((share * 1e6) as u32),
                        AtomicU32::new((cap * 1e6) as u32),
                    )
                })
                .collect(),
        )
    }
}

impl Tenants for Table {
    fn each(&self, f: &mut dyn FnMut(super::Tenant<'_>)) {
        for id in 1..=self.0.len() as u32 {
            f(self.get(id).expect("in the table"));
        }
    }
    fn get(&self, id: u32) -> Option<super::Tenant<'_>> {
        let (s, share, cap) = self.0.get(id.checked_sub(1)? as usize)?;
        Some(super::Tenant {
            id,
            sched: s,
            share: Share::from_ppm(share.load(Relaxed)),
            cap: Cap::from_ppm(cap.load(Relaxed)),
        })
    }
}

/// One simulated tenant process: a launch loop like gpuslice-burn's.
#[derive(Clone)]
struct Tenant {
    /// Slice id (index in the table + 1).
    id: u32,
    kernel_ns: u64,
    /// Launches in flight before the program waits for the oldest.
    depth: usize,
    start_ns: u64,
    /// Stops launching here (default: the end of the run).
    stop_ns: Option<u64>,
    /// CPU time of one launch.
    launch_cpu_ns: u64,
    /// The shim's estimate of one launch (default: exact).
    est_ns: Option<u64>,
    /// (at, for): the process does not run for `for` from its first launch after `at`
    /// (descheduled, SIGSTOPped), whatever it holds.
    pauses: Vec<(u64, u64)>,
    /// Intervals in which the process cannot run however it is woken.
    stalls: Vec<(u64, u64)>,
    /// Delay from a futex wake-up to running.
    wake_latency_ns: u64,
    /// Learns its estimate from completions, like the shim (default: the exact figure).
    learn: bool,
    /// Request/response: bursts of this many kernels, waiting for each burst to complete,
    /// then thinking for the second figure (ns) before the next.
    burst: Option<(usize, u64)>,
    /// Priority class of its slice.
    class: u32,
    /// Dies (SIGKILL) right after its first launch past this time: no release, no exit path.
    dies_ns: Option<u64>,
}

fn tenant(id: u32, kernel_us: u64) -> Tenant {
    Tenant {
        id,
        kernel_ns: kernel_us * 1000,
        depth: 4,
        start_ns: 0,
        stop_ns: None,
        launch_cpu_ns: 5_000,
        est_ns: None,
        pauses: Vec::new(),
        stalls: Vec::new(),
        wake_latency_ns: 50_000,
        dies_ns: None,
        learn: false,
        burst: None,
        class: CLASS_NORMAL,
    }
}

/// What a run did: each tenant's kernel completion times and engine time.
struct Ran {
    ends: Vec<Vec<u64>>,
    /// Each tenant's stretches of engine time.
    runs: Vec<Vec<(u64, u64)>>,
    /// Each bursty tenant's burst latencies (first launch asked to last kernel done).
    bursts: Vec<Vec<u64>>,
    tenants: Vec<Tenant>,
    end_ns: u64,
    /// Per slice id (index id - 1): the most engine time its processes' queued work together
    /// still needed, sampled at each of their launches from [`BACKLOG_FROM_NS`] on.
    backlog: Vec<u64>,
}

/// Backlogs are sampled from here on (past the start, when every slice may run alone).
const BACKLOG_FROM_NS: u64 = S;

impl Ran {
    /// Fraction of the device tenant `i`'s kernels used in `(a, b]`.
    fn fraction(&self, i: usize, a: u64, b: u64) -> f64 {
        let ns: u64 = self.runs[i]
            .iter()
            .map(|&(f, t)| t.min(b).saturating_sub(f.max(a)))
            .sum();
        ns as f64 / (b - a) as f64
    }

    /// What the tenants of slice `id` got together in `(a, b]`.
    fn slice_fraction(&self, id: u32, a: u64, b: u64) -> f64 {
        (0..self.tenants.len())
            .filter(|&i| self.tenants[i].id == id)
            .map(|i| self.fraction(i, a, b))
            .sum()
    }

    /// Longest stretch in `[a, b]` in which none of tenant `i`'s kernels completed.
    fn max_gap(&self, i: usize, a: u64, b: u64) -> u64 {
        let mut last = a;
        let mut gap = 0;
        for &e in self.ends[i].iter().filter(|&&e| e > a && e <= b) {
            gap = gap.max(e - last);
            last = e;
        }
        gap.max(b - last)
    }

    /// The window in which every tenant was launching.
    fn all_ran(&self) -> (u64, u64) {
        let from = self.tenants.iter().map(|t| t.start_ns).max().unwrap_or(0);
        let to = self
            .tenants
            .iter()
            .map(|t| t.stop_ns.unwrap_or(self.end_ns))
            .min()
            .unwrap_or(self.end_ns);
        (from, to)
    }
}

/// How a simulation runs.
#[derive(Clone, Copy)]
struct Mode {
    /// The engine time-slices contexts every this many ns (the hardware's and the fake's
    /// scheduler); 0: kernels of every process in submission order.
    slice_ns: u64,
    /// Node mode: a simulated monitor grants the turns ([`DeviceTurns`]), the tenants are
    /// [`Granted`] clients.
    node: bool,
    /// The monitor cannot run in the stretches [`busy_host`] draws from this seed (0: it
    /// always can), like a process on a host whose CPUs other work keeps busy.
    monitor_busy_host: u64,
}

/// Stretches up to `end` in which a process on a busy host cannot run, drawn from `seed`
/// (the same on every run): after 1-12 ms of running, 0.1-2.5 ms without a CPU, as a process
/// waits its turn on a 2-vCPU host with four or five runnable threads beside it (the real
/// pair's host at load 4-6: `docs/benchmarks/2026-12-02.md`, "Issue 20, round 3").
fn busy_host(seed: u64, end: u64) -> Vec<(u64, u64)> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |lo: u64, hi: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        lo + x % (hi - lo)
    };
    let mut v = Vec::new();
    let mut at = next(0, 12 * MS);
    while at < end {
        let d = next(100_000, 2_500_000);
        v.push((at, at + d));
        at += d + next(MS, 12 * MS);
    }
    v
}

/// The engine of every test before issue 20: submission order, personal mode.
const FIFO: Mode = Mode {
    slice_ns: 0,
    node: false,
    monitor_busy_host: 0,
};
/// The fake's engine (2 ms time slices), personal mode.
const PERSONAL: Mode = Mode {
    slice_ns: 2 * MS,
    node: false,
    monitor_busy_host: 0,
};
/// The fake's engine, node mode.
const NODE: Mode = Mode {
    slice_ns: 2 * MS,
    node: true,
    monitor_busy_host: 0,
};

/// Run `tenants` on table `t` until simulated second `secs`.
fn simulate(t: &Table, tenants: &[Tenant], secs: f64) -> Ran {
    simulate_in(FIFO, t, tenants, secs)
}

/// [`simulate`] in `mode`.
fn simulate_in(mode: Mode, t: &Table, tenants: &[Tenant], secs: f64) -> Ran {
    run_sim(
        mode,
        t,
        tenants,
        secs,
        &SchedDevice::default(),
        |_, _, _, _| {},
    )
}

/// [`simulate`] with the device record given, and a controller process that runs
/// `control(cpu, table)` alongside the tenants (live changes, a reaper).
fn simulate_with(
    t: &Table,
    tenants: &[Tenant],
    secs: f64,
    dev: &SchedDevice,
    control: impl FnOnce(&Cpu, &Table, &[SchedProc], &[AtomicBool]) + Send,
) -> Ran {
    run_sim(FIFO, t, tenants, secs, dev, control)
}

/// The simulated monitor of node mode: passes of [`DeviceTurns::step`] over the live tenants'
/// words, sleeping on the bell in between, as `monitor/src/turns.rs` runs them.
fn monitor(
    cpu: &Cpu,
    dev: &SchedDevice,
    t: &Table,
    node: &Node,
    tenants: &[Tenant],
    alive: &[AtomicBool],
    end: u64,
) {
    let mut dt = DeviceTurns::default();
    let mut rings = crate::Rings::default();
    loop {
        let now = cpu.now_ns();
        if now >= end || alive.iter().all(|a| !a.load(Relaxed)) && now > MS {
            return;
        }
        beat(&node.beat, now);
        let members: Vec<Member> = tenants
            .iter()
            .enumerate()
            .filter(|(i, _)| alive[*i].load(Relaxed))
            .map(|(i, ten)| Member {
                slot: i,
                slice: ten.id,
                words: &node.words[i],
            })
            .collect();
        rings.pass(&mut node.words.iter().map(Some));
        let next = dt.step(cpu, dev, t, &members, now);
        let now2 = cpu.now_ns();
        if rings.missed(&mut node.words.iter().map(Some)) {
            // A ring in the pass woke nobody: pass again (the monitor's MIN_PASS_NS).
            cpu.sleep((now + 50_000).saturating_sub(now2));
            continue;
        }
        if next > now2 {
            cpu.futex_wait(&node.bell, node.bell.load(SeqCst), next - now2);
            // At most one pass per 50 µs however often rung (the monitor's MIN_PASS_NS).
            let since = cpu.peek().saturating_sub(now2);
            if since < 50_000 {
                cpu.sleep(50_000 - since);
            }
        }
    }
}

/// Node mode's shared words: the monitor's heartbeat and bell, each process's region words.
struct Node {
    beat: AtomicU64,
    bell: AtomicU32,
    words: Vec<GrantProc>,
    /// Each slice's words in its region.
    regions: Vec<SchedSlice>,
}

fn run_sim(
    mode: Mode,
    t: &Table,
    tenants: &[Tenant],
    secs: f64,
    dev: &SchedDevice,
    control: impl FnOnce(&Cpu, &Table, &[SchedProc], &[AtomicBool]) + Send,
) -> Ran {
    let world = World::new(200);
    let engine = if mode.slice_ns == 0 {
        Engine::fifo()
    } else {
        Engine::sliced(mode.slice_ns)
    };
    let end = (secs * 1e9) as u64;
    let procs: Vec<SchedProc> = tenants.iter().map(|_| SchedProc::default()).collect();
    let ctxs: Vec<AtomicUsize> = tenants
        .iter()
        .map(|_| AtomicUsize::new(usize::MAX))
        .collect();
    let dead: Vec<AtomicBool> = tenants.iter().map(|_| AtomicBool::new(false)).collect();
    let alive: Vec<AtomicBool> = tenants.iter().map(|_| AtomicBool::new(false)).collect();
    let bursts: Vec<Mutex<Vec<u64>>> = tenants.iter().map(|_| Mutex::new(Vec::new())).collect();
    let backlog: Vec<AtomicU64> = t.0.iter().map(|_| AtomicU64::new(0)).collect();
    // The slice's backlog on the engine, after a launch of one of its processes.
    let sample = |id: u32, now: u64| {
        if now < BACKLOG_FROM_NS {
            return;
        }
        let mine: Vec<usize> = (0..tenants.len())
            .filter(|&j| tenants[j].id == id)
            .map(|j| ctxs[j].load(Relaxed))
            .collect();
        backlog[id as usize - 1].fetch_max(engine.backlog(&mine, now), Relaxed);
    };
    let node = Node {
        beat: AtomicU64::new(0),
        bell: AtomicU32::new(0),
        words: tenants.iter().map(|_| GrantProc::default()).collect(),
        regions: t.0.iter().map(|_| SchedSlice::default()).collect(),
    };
    if mode.node {
        // The class is the policy's (the operator's) in node mode.
        for ten in tenants {
            if let Some(super::Tenant { sched: s, .. }) = t.get(ten.id) {
                s.class.store(ten.class, Relaxed);
            }
        }
    }
    let mut ps: Vec<Process> = Vec::new();
    for (i, ten) in tenants.iter().enumerate() {
        let (engine, proc, ctx, dead, alive) = (&engine, &procs[i], &ctxs[i], &dead[i], &alive[i]);
        let (lat, node, sample) = (&bursts[i], &node, &sample);
        let stop = ten.stop_ns.unwrap_or(end).min(end);
        ps.push(Process {
            start_ns: ten.start_ns,
            stalls: ten.stalls.clone(),
            wake_latency_ns: ten.wake_latency_ns,
            body: Box::new(move |cpu: &Cpu| {
                let mut c = if mode.node {
                    let s = t.get(ten.id).unwrap().sched;
                    let w = GrantWords {
                        dev,
                        beat: &node.beat,
                        bell: &node.bell,
                        class: &s.class,
                        shared: &node.regions[ten.id as usize - 1],
                        me: &node.words[i],
                    };
                    Scheduler::Granted(Granted::new(w, ten.id, cpu).unwrap())
                } else {
                    let c = Client::new(dev, 0, t, ten.id, proc, cpu).unwrap();
                    c.set_class(ten.class);
                    Scheduler::Tenant(c)
                };
                alive.store(true, Relaxed);
                let mut q = Queue::new(cpu, engine, ten.est_ns.unwrap_or(ten.kernel_ns));
                ctx.store(q.ctx, Relaxed);
                q.learn = ten.learn;
                if let Some((n, think)) = ten.burst {
                    let mut lats = Vec::new();
                    while cpu.peek() < stop {
                        let t0 = cpu.peek();
                        let mut last = 0;
                        for _ in 0..n {
                            let tracked = if c.solo() {
                                false
                            } else {
                                c.acquire(&mut q);
                                !c.solo()
                            };
                            last = q.launch(ten.kernel_ns, tracked);
                            cpu.sleep(ten.launch_cpu_ns);
                        }
                        let done = q.wait(last);
                        q.all.clear();
                        lats.push(done - t0);
                        cpu.sleep(think);
                    }
                    c.release(&mut q);
                    alive.store(false, Relaxed);
                    *lat.lock().unwrap() = lats;
                    return;
                }
                let mut pauses = ten.pauses.iter().copied().peekable();
                loop {
                    let now = cpu.peek();
                    if now >= stop {
                        break;
                    }
                    if let Some((_, d)) = pauses.next_if(|&(at, _)| now >= at) {
                        cpu.sleep(d);
                        continue;
                    }
                    // The shim's gate: the solo fast path, else the scheduler; a launch admitted
                    // under an ordinary lease is tracked with events.
                    let tracked = if c.solo() {
                        false
                    } else {
                        c.acquire(&mut q);
                        !c.solo()
                    };
                    q.launch(ten.kernel_ns, tracked);
                    sample(ten.id, cpu.peek());
                    if ten.dies_ns.is_some_and(|d| cpu.peek() >= d) {
                        dead.store(true, Relaxed);
                        alive.store(false, Relaxed);
                        return; // killed: nothing more runs, nothing is released
                    }
                    cpu.sleep(ten.launch_cpu_ns);
                    if q.all.len() >= ten.depth {
                        q.wait_oldest();
                    }
                }
                // Exit like a process whose context is destroyed.
                c.release(&mut q);
                alive.store(false, Relaxed);
            }),
        });
    }
    ps.push(Process {
        start_ns: 0,
        stalls: if mode.monitor_busy_host == 0 {
            Vec::new()
        } else {
            busy_host(mode.monitor_busy_host, end)
        },
        wake_latency_ns: 0,
        body: Box::new({
            let (procs, dead, alive, node) = (&procs, &dead, &alive, &node);
            move |cpu: &Cpu| {
                if mode.node {
                    monitor(cpu, dev, t, node, tenants, alive, end);
                }
                control(cpu, t, procs, dead)
            }
        }),
    });
    let end_ns = world.run(ps).min(end);
    let ctx = |i: usize| ctxs[i].load(Relaxed);
    Ran {
        ends: (0..tenants.len())
            .map(|i| engine.ends(ctx(i), end_ns))
            .collect(),
        runs: (0..tenants.len())
            .map(|i| engine.runs(ctx(i), end_ns))
            .collect(),
        bursts: bursts
            .into_iter()
            .map(|m| m.into_inner().unwrap())
            .collect(),
        tenants: tenants.to_vec(),
        end_ns,
        backlog: backlog.iter().map(|b| b.load(Relaxed)).collect(),
    }
}

/// Over `(a, b]`, each tenant's part of what they got together is `want` ± `tol`, and together
/// they kept the engine busy.
fn assert_split(r: &Ran, a: u64, b: u64, want: &[f64], tol: f64) {
    let f: Vec<f64> = (0..want.len()).map(|i| r.fraction(i, a, b)).collect();
    let total: f64 = f.iter().sum();
    assert!(total >= 0.9, "the engine idled over {a}..{b}: {f:?}");
    for (got, w) in f.iter().zip(want) {
        assert!(
            (got / total - w).abs() <= tol,
            "over {:.2}..{:.2} s: {f:?}, want {want:?} ± {tol}",
            a as f64 / 1e9,
            b as f64 / 1e9
        );
    }
}

/// No tenant waited longer than `limit` for a completion over `(a, b]`.
fn assert_no_gap(r: &Ran, a: u64, b: u64, limit: u64) {
    for i in 0..r.tenants.len() {
        let g = r.max_gap(i, a, b);
        assert!(
            g <= limit,
            "tenant {} got nothing for {:.3} s between {:.2} and {:.2} s",
            r.tenants[i].id,
            g as f64 / 1e9,
            a as f64 / 1e9,
            b as f64 / 1e9
        );
    }
}

#[test]
fn two_tenants_get_their_shares() {
    let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
    let r = simulate(&t, &[tenant(1, 200), tenant(2, 200)], 3.0);
    assert_split(&r, S / 2, 3 * S, &[0.25, 0.75], 0.02);
}

#[test]
fn three_tenants_with_mixed_kernels() {
    let t = Table::new(&[(0.2, 0.0), (0.5, 0.0), (0.3, 0.0)]);
    let r = simulate(&t, &[tenant(1, 50), tenant(2, 1000), tenant(3, 300)], 3.0);
    assert_split(&r, S / 2, 3 * S, &[0.2, 0.5, 0.3], 0.03);
}

#[test]
fn surplus_is_split_by_share() {
    // 0.2 and 0.4 guaranteed, 0.4 unreserved: both saturating get 1/3 and 2/3.
    let t = Table::new(&[(0.2, 0.0), (0.4, 0.0)]);
    let r = simulate(&t, &[tenant(1, 200), tenant(2, 200)], 3.0);
    assert_split(&r, S / 2, 3 * S, &[1.0 / 3.0, 2.0 / 3.0], 0.02);
}

#[test]
fn cap_holds_alone() {
    let t = Table::new(&[(0.0, 0.3)]);
    let r = simulate(&t, &[tenant(1, 200)], 3.0);
    let f = r.fraction(0, S / 2, 3 * S);
    assert!((f - 0.3).abs() < 0.02, "{f}");
}

#[test]
fn share_alone_takes_the_whole_device_solo() {
    let t = Table::new(&[(0.25, 0.0)]);
    let r = simulate(&t, &[tenant(1, 200)], 2.0);
    let f = r.fraction(0, S / 10, 2 * S);
    assert!(f >= 0.97, "{f}");
    assert_eq!(
        t.0[0].0.gpu_ns_total.load(Relaxed),
        0,
        "solo launches are not charged"
    );
}

#[test]
fn idle_tenant_lends_its_time() {
    let t = Table::new(&[(0.5, 0.0), (0.5, 0.0)]);
    let quitter = Tenant {
        stop_ns: Some(S / 2),
        ..tenant(2, 200)
    };
    let r = simulate(&t, &[tenant(1, 200), quitter], 2.0);
    assert_split(&r, S / 10, S / 2, &[0.5, 0.5], 0.03);
    let after = r.fraction(0, S / 2 + 20 * MS, 2 * S);
    assert!(after >= 0.97, "{after}");
    assert!(t.0[1].0.throttled_ns_total.load(Relaxed) > 0);
}

#[test]
fn best_effort_gets_only_the_leftovers() {
    let t = Table::new(&[(0.5, 0.0), (0.0, 0.0)]);
    let r = simulate(&t, &[tenant(1, 200), tenant(2, 200)], 2.0);
    let (a, b) = (r.fraction(0, S / 2, 2 * S), r.fraction(1, S / 2, 2 * S));
    assert!(a >= 0.95 && b <= 0.03, "{a} {b}");
}

#[test]
fn lease_word_round_trips() {
    for l in [
        Lease::FREE,
        Lease {
            holder: 1,
            solo: true,
            end_ns: 0,
        },
        Lease {
            holder: MAX_SLICE_ID,
            solo: false,
            end_ns: 123_456_789_000,
        },
    ] {
        assert_eq!(Lease::unpack(l.pack()), l);
    }
    assert_eq!(Lease::FREE.pack(), 0, "an all-zero ledger is a free device");
    assert_eq!(
        Lease::unpack(
            Lease {
                holder: 3,
                solo: false,
                end_ns: 1_500
            }
            .pack()
        )
        .end_ns,
        2_000
    );
}

#[test]
fn stats_report_recent_use() {
    let dev = SchedDevice::default();
    let s = SchedSlice::default();
    let t0 = 10 * WINDOW_NS;
    charge(
        &dev,
        &s,
        Share::from_ppm(250_000),
        Cap::NONE,
        t0,
        t0 + WINDOW_NS / 4,
        u64::MAX,
    );
    let st = slice_stats(&dev, &s, t0 + WINDOW_NS / 2);
    assert!((st.used_fraction - 0.25).abs() < 1e-6, "{st:?}");
    assert_eq!(st.gpu_ns_total, WINDOW_NS / 4);
    assert_eq!(s.vt.load(Relaxed), WINDOW_NS); // 0.25 s held at share 0.25
                                               // Half a window later the old bucket still counts for half; two windows on, nothing.
    let st = slice_stats(&dev, &s, t0 + WINDOW_NS + WINDOW_NS / 2);
    assert!((st.used_fraction - 0.125).abs() < 1e-6, "{st:?}");
    assert_eq!(slice_stats(&dev, &s, t0 + 3 * WINDOW_NS).used_fraction, 0.0);
    assert!((dev.window.fraction(t0 + WINDOW_NS / 2) - 0.25).abs() < 1e-6);
}

/// `compute_used` is a share of the device's busy time: when the slices' charges overlap (each
/// turn charged work that ran into the next), they are scaled to the device's, so a device's
/// slices never sum over 1; below that each is its plain fraction of the window.
#[test]
fn compute_used_of_a_devices_slices_never_sums_over_one() {
    let dev = SchedDevice::default();
    let (a, b, c) = (
        SchedSlice::default(),
        SchedSlice::default(),
        SchedSlice::default(),
    );
    let t0 = 10 * WINDOW_NS;
    // 0.27 + 0.82 of the window charged (issue 20's status: 26.8% and 81.6%).
    charge(
        &dev,
        &a,
        Share::from_ppm(250_000),
        Cap::NONE,
        t0,
        t0 + WINDOW_NS,
        WINDOW_NS * 27 / 100,
    );
    charge(
        &dev,
        &b,
        Share::from_ppm(750_000),
        Cap::NONE,
        t0,
        t0 + WINDOW_NS,
        WINDOW_NS * 82 / 100,
    );
    let now = t0 + WINDOW_NS + WINDOW_NS / 3;
    let (ua, ub) = (
        slice_stats(&dev, &a, now).used_fraction,
        slice_stats(&dev, &b, now).used_fraction,
    );
    assert!(ua + ub <= 1.0 + 1e-12, "{ua} + {ub}");
    assert!((ua / (ua + ub) - 27.0 / 109.0).abs() < 1e-9, "{ua} {ub}");
    assert!((ua + ub - 1.0).abs() < 1e-9, "{ua} + {ub}");
    // Under the window: each its own fraction.
    let later = t0 + 3 * WINDOW_NS + WINDOW_NS / 2;
    charge(
        &dev,
        &c,
        Share::from_ppm(0),
        Cap::NONE,
        later - WINDOW_NS / 2,
        later,
        WINDOW_NS / 10,
    );
    assert!((slice_stats(&dev, &c, later).used_fraction - 0.1).abs() < 1e-6);
    assert_eq!(slice_stats(&dev, &a, later).used_fraction, 0.0);
    // A slice charged in a bucket its device does not show yet reads at most 1.
    assert!(used_fraction(5.0 * WINDOW_NS as f64, 0.0) <= 1.0);
}

#[test]
fn admission_keeps_guarantees_within_the_device() {
    assert!(admits(750_000, Share::from_ppm(250_000)));
    assert!(!admits(750_000, Share::from_ppm(250_001)));
    assert!(admits(0, Share::WHOLE));
}

/// Queued work whose estimates are whatever a test says (a driver may measure anything).
struct Fixed {
    queued: u64,
    next: u64,
    left: u64,
}

impl Fixed {
    fn new(queued: u64, next: u64, left: u64) -> Fixed {
        Fixed { queued, next, left }
    }
}

/// A device and its slices, for the tests that drive one client's `acquire` by hand.
struct Hand {
    t: Table,
    dev: SchedDevice,
    proc: SchedProc,
}

impl Hand {
    fn new(slices: &[(f64, f64)]) -> Hand {
        Hand {
            t: Table::new(slices),
            dev: SchedDevice::default(),
            proc: SchedProc::default(),
        }
    }

    /// Slice 1's client, on the real clock.
    fn client(&self) -> Client<'_> {
        Client::new(&self.dev, 0, &self.t, 1, &self.proc, &SYSTEM).unwrap()
    }
}

impl Work for Fixed {
    fn outstanding_ns(&mut self) -> u64 {
        self.queued
    }
    fn next_ns(&mut self) -> u64 {
        self.next
    }
    fn drain(&mut self) -> u64 {
        now_ns()
    }
    fn wait_below(&mut self, _ns: u64) -> u64 {
        self.left
    }
    fn pending(&mut self) -> usize {
        usize::from(self.queued > 0)
    }
    fn wait_pending(&mut self, _n: usize) {}
}

/// `c` holds a turn that starts a second ahead of the clock (where its previous charge ended,
/// a handoff lead that ran long); returns the clock.
fn held_from_ahead(c: &mut Client) -> u64 {
    let now = now_ns();
    c.charged_until = now + 1_000_000_000;
    c.held_since = Some(c.charged_until);
    now
}

fn ordinary(dev: &SchedDevice, holder: u32, end_ns: u64) -> u64 {
    let w = Lease {
        holder,
        solo: false,
        end_ns,
    }
    .pack();
    dev.lease.store(w, Release);
    w
}

#[test]
fn a_turn_starting_ahead_of_the_clock_charges_nothing_and_does_not_panic() {
    // The e2e panic: `held_since` (where the previous charge ended, ahead of the clock) was
    // later than `now` when another process of the slice renewed the lease.
    let h = Hand::new(&[(0.5, 1.0), (0.5, 1.0)]);
    let (t, dev) = (&h.t, &h.dev);
    let mut c = h.client();
    let now = held_from_ahead(&mut c);
    c.held_turn = 12345; // not the current turn: a renewal by another process
    c.busy_until = now;
    ordinary(dev, 1, now + LEASE_NS);
    let mut w = Fixed::new(0, 1000, 0);
    c.acquire(&mut w);
    assert_eq!(
        t.0[0].0.gpu_ns_total.load(Relaxed),
        0,
        "nothing was held yet"
    );
    assert!(c.held_since.unwrap() >= c.charged_until);
    // And settling at a moment before the turn began charges nothing either.
    c.settle(now);
    assert_eq!(t.0[0].0.gpu_ns_total.load(Relaxed), 0);
}

#[test]
fn a_lease_taken_over_while_ahead_of_the_clock_does_not_panic() {
    // Slice 1 held a turn starting ahead of the clock; slice 2 took the lease over, and its
    // end is already past its grace: slice 1 pays nothing and takes the lease back.
    let h = Hand::new(&[(0.5, 1.0), (0.5, 1.0)]);
    let (t, dev) = (&h.t, &h.dev);
    let mut c = h.client();
    let now = held_from_ahead(&mut c);
    c.busy_until = now + 2_000_000_000;
    ordinary(dev, 2, 1000); // ended long ago
    c.acquire(&mut Fixed::new(0, 1000, 0));
    assert_eq!(t.0[0].0.gpu_ns_total.load(Relaxed), 0);
    assert_eq!(Lease::unpack(dev.lease.load(Acquire)).holder, 1);
}

#[test]
fn huge_estimates_saturate() {
    // A measurement can be anything (an f32 of ms saturated into u64): admitting, stretching
    // the lease, draining and charging must not overflow.
    let h = Hand::new(&[(0.5, 1.0)]);
    let (t, dev) = (&h.t, &h.dev);
    let mut c = h.client();
    let now = now_ns();
    ordinary(dev, 1, now + LEASE_NS);
    c.acquire(&mut Fixed::new(0, u64::MAX, 0));
    let l = Lease::unpack(dev.lease.load(Acquire));
    assert!(l.end_ns <= now_ns() + MAX_LEASE_NS + 1000, "{l:?}");
    assert!(t.0[0].0.busy_until_ns.load(Relaxed) <= now_ns() + MAX_LEASE_NS);
    c.acquire(&mut Fixed::new(u64::MAX, u64::MAX, u64::MAX));
    // Alone and uncapped: the handoff renewed the lease to itself, solo.
    assert!(c.solo());
    assert!(c.charged_until <= now_ns() + MAX_LEASE_NS);
    assert!(t.0[0].0.gpu_ns_total.load(Relaxed) <= MAX_LEASE_NS + 1_000_000_000);
}

#[test]
fn a_lease_already_over_hands_over_at_once() {
    let h = Hand::new(&[(0.5, 1.0)]);
    let dev = &h.dev;
    let mut c = h.client();
    ordinary(dev, 1, 1000);
    c.acquire(&mut Fixed::new(0, 1000, 0));
    assert!(c.solo());
}

#[test]
fn charging_tolerates_zero_shares_and_any_values() {
    let dev = SchedDevice::default();
    let s = SchedSlice::default();
    // Share 0 is best effort; cap 0 is no cap.
    charge(&dev, &s, Share::NONE, Cap::from_ppm(0), 1_000, 2_000, 500);
    assert_eq!(s.vt.load(Relaxed), 500 * PPM as u64 / BEST_EFFORT_PPM);
    assert_eq!(s.cap_tat_ns.load(Relaxed), 0);
    // An end before the start charges nothing.
    charge(&dev, &s, Share::NONE, Cap::from_ppm(1), 2_000, 1_000, 500);
    assert_eq!(s.gpu_ns_total.load(Relaxed), 500);
    // Values no sane process writes: saturate.
    s.cap_tat_ns.store(u64::MAX, Relaxed);
    s.window.start_ns.store(u64::MAX, Relaxed);
    dev.window.start_ns.store(u64::MAX - 1, Relaxed);
    charge(
        &dev,
        &s,
        Share::from_ppm(1),
        Cap::from_ppm(1),
        0,
        u64::MAX,
        u64::MAX,
    );
    assert_eq!(s.cap_tat_ns.load(Relaxed), u64::MAX);
    let _ = slice_stats(&dev, &s, 0);
    let _ = dev.window.fraction(u64::MAX);
    assert!(!admits(u64::MAX, Share::from_ppm(1)));
}

#[test]
fn takeover_and_recheck_tolerate_any_estimate() {
    let t = Table::new(&[(0.5, 1.0), (0.5, 1.0)]);
    let now = now_ns();
    t.0[0].0.busy_until_ns.store(u64::MAX, Relaxed);
    let live = Lease {
        holder: 1,
        solo: false,
        end_ns: now + LEASE_NS,
    };
    assert!(!takeover_due(&t, live, now));
    let over = Lease {
        end_ns: 1000,
        ..live
    };
    assert!(takeover_due(&t, over, now), "a lease past its grace is due");
    for l in [live, over] {
        let at = recheck_at(&t, &t.0[1].0, l, now);
        assert!((now + 50_000..=now + MAX_SLEEP_NS).contains(&at));
    }
    // A holder whose estimate lies ahead of a waiter's clock is not idle.
    t.0[0].0.busy_until_ns.store(now + 1_000_000, Relaxed);
    assert!(!takeover_due(&t, live, now));
    t.0[1].0.cap_tat_ns.store(u64::MAX, Relaxed);
    let at = recheck_at(&t, &t.0[1].0, Lease::FREE, now);
    assert_eq!(at, now + MAX_SLEEP_NS);
}

#[test]
fn zeroed_records_are_idle() {
    // SAFETY: the scheduler records are atomics and integers: all-zero is a valid value,
    // which is how a fresh ledger file creates them.
    let d: SchedDevice = unsafe { core::mem::zeroed() };
    assert_eq!(Lease::unpack(d.lease.load(Relaxed)), Lease::FREE);
}

// The bad cases of issue 14. Each checks, over the time every tenant was launching, that no
// tenant went without a completed kernel for long (the freeze) and that the split held.

/// The regression test of the freeze: a holder whose estimated queue stays short (small
/// kernels, or kernels the driver measured short) stretched its lease at every launch near its
/// end and kept the device for good, while the other tenant got nothing; before the fix this
/// pair split 1.0/0.0 from the first 25 ms on.
#[test]
fn a_shallow_queue_cannot_keep_the_device() {
    for (kernel_us, est, depth) in [(200, None, 4), (1000, Some(100_000), 2), (20, None, 2)] {
        let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
        let ten = |id| Tenant {
            est_ns: est,
            depth,
            ..tenant(id, kernel_us)
        };
        let r = simulate(&t, &[ten(1), ten(2)], 3.0);
        assert_no_gap(&r, 100 * MS, 3 * S, 100 * MS);
        for w in 0..5 {
            let a = S / 2 + w * S / 2;
            assert_split(&r, a, a + S / 2, &[0.25, 0.75], 0.04);
        }
    }
}

/// Two tenants starting in the same microsecond, or up to 300 ms apart, as the 50 runs
/// of the pair: no gap over 100 ms once both run, the split within 4 points over every second.
#[test]
fn a_pair_started_together_or_apart_never_freezes() {
    let offsets = [
        0,
        200,
        1_000,
        3_000,
        50_000,
        1_000 * 1000,
        17 * MS,
        100 * MS,
        299 * MS,
    ];
    for (k, &off) in offsets.iter().enumerate() {
        for first in [1, 2] {
            let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
            let mut a = tenant(1, 1000);
            let mut b = tenant(2, 1000);
            if first == 1 {
                b.start_ns = off;
            } else {
                a.start_ns = off;
            }
            // Vary the CPU cost of a launch so the interleavings differ between runs.
            a.launch_cpu_ns += 1_000 * k as u64;
            let r = simulate(&t, &[a, b], 3.0);
            let (from, to) = r.all_ran();
            assert_no_gap(&r, from + 50 * MS, to, 100 * MS);
            let (mut w, mut windows) = (from + 200 * MS, 0);
            while w + S <= to {
                assert_split(&r, w, w + S, &[0.25, 0.75], 0.04);
                w += S / 2;
                windows += 1;
            }
            assert!(
                windows >= 1,
                "offset {off}: no 1 s window between {from} and {to}"
            );
        }
    }
}

/// A tenant joining a second late gets its share from its first second: the solo lease of
/// the first turns into ordinary turns at once.
#[test]
fn a_late_joiner_gets_its_share_at_once() {
    let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
    let late = Tenant {
        start_ns: S,
        ..tenant(2, 1000)
    };
    let r = simulate(&t, &[tenant(1, 1000), late], 3.0);
    assert!(r.fraction(0, 100 * MS, S) >= 0.97);
    assert_no_gap(&r, S + 20 * MS, 3 * S, 50 * MS);
    assert_split(&r, S + 20 * MS, 2 * S, &[0.25, 0.75], 0.04);
    assert_split(&r, 2 * S, 3 * S, &[0.25, 0.75], 0.04);
}

/// A holder descheduled for 50-500 ms in the middle of its turn loses the turn within a few
/// ms (the other launches meanwhile), and both are back at their shares soon after it runs.
/// What the other was lent in the first [`SOLO_QUIET_NS`] of the pause (ordinary, charged
/// turns: a slice away that briefly is not idle) it pays back when the holder returns, and no
/// more: after a pause shorter than [`RETURN_NS`] it waits at most that much GPU time at the
/// returning slice's share.
#[test]
fn a_holder_descheduled_mid_turn_loses_its_turn() {
    let shares = [0.25, 0.75];
    for pause in [50 * MS, 200 * MS, 500 * MS] {
        for who in [0usize, 1] {
            let t = Table::new(&[(shares[0], 0.0), (shares[1], 0.0)]);
            let mut ts = [tenant(1, 1000), tenant(2, 1000)];
            let at = S + 1_234_567;
            ts[who].pauses = vec![(at, pause)];
            let r = simulate(&t, &ts, 3.5);
            let other = 1 - who;
            assert_no_gap(&r, 100 * MS, 3500 * MS, 100 * MS.max(pause + 50 * MS));
            let g = r.max_gap(other, S, at + pause);
            assert!(
                g <= 20 * MS,
                "pause {pause} who {who}: the other waited {g} ns"
            );
            let charged = pause.min(SOLO_QUIET_NS) as f64;
            let owed = if pause < RETURN_NS {
                charged * shares[who] / shares[other]
            } else {
                0.0
            };
            let g = r.max_gap(other, at + pause, at + pause + 300 * MS);
            assert!(
                g as f64 <= owed + 20.0 * MS as f64,
                "pause {pause} who {who}: the other waited {g} ns after it, owed {owed}"
            );
            let back = S + pause + 300 * MS;
            assert_split(&r, back, back + S, &[0.25, 0.75], 0.04);
        }
    }
}

/// A SIGSTOPped holder (stopped for 3 s with the lease) costs the other tenant a few ms, and
/// once continued it competes again at its share.
#[test]
fn a_stopped_holder_does_not_stop_the_device() {
    let t = Table::new(&[(0.5, 0.0), (0.5, 0.0)]);
    let mut stopped = tenant(1, 1000);
    stopped.pauses = vec![(S + 2_345_678, 3 * S)];
    let r = simulate(&t, &[stopped, tenant(2, 1000)], 6.0);
    assert!(r.max_gap(1, S, 4 * S) <= 20 * MS);
    assert!(r.fraction(1, S + 20 * MS, 4 * S) >= 0.97);
    assert_split(&r, 4300 * MS, 6 * S, &[0.5, 0.5], 0.04);
}

/// A waiter that cannot run for 2 s (however it is woken) stops competing; the holder keeps
/// the device meanwhile, and the waiter is back at its share within a second of running.
#[test]
fn a_waiter_that_cannot_run_for_seconds() {
    let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
    for who in [0usize, 1] {
        let mut ts = [tenant(1, 1000), tenant(2, 1000)];
        ts[who].stalls = vec![(S, 3 * S)];
        let r = simulate(&t, &ts, 5.0);
        let other = 1 - who;
        assert!(r.max_gap(other, S, 3 * S) <= 20 * MS);
        assert_no_gap(&r, 3 * S, 5 * S, 100 * MS);
        assert_split(&r, 3200 * MS, 5 * S, &[0.25, 0.75], 0.04);
    }
}

/// A holder killed while holding: the other takes the lease over within a grace period,
/// without the monitor.
#[test]
fn a_dead_holder_loses_its_turn() {
    let t = Table::new(&[(0.5, 0.0), (0.5, 0.0)]);
    let dev = SchedDevice::default();
    let dies = Tenant {
        dies_ns: Some(S),
        ..tenant(2, 1000)
    };
    let r = simulate_with(&t, &[tenant(1, 1000), dies], 2.0, &dev, |_, _, _, _| {});
    assert!(
        r.max_gap(0, S, 2 * S) <= 30 * MS,
        "{}",
        r.max_gap(0, S, 2 * S)
    );
    assert!(r.fraction(0, S + 50 * MS, 2 * S) >= 0.97);
}

/// The reaper revokes a dead process's lease at once (no grace period to wait out).
#[test]
fn the_reaper_revokes_a_dead_holder_at_once() {
    let t = Table::new(&[(0.5, 0.0), (0.5, 0.0)]);
    let dev = SchedDevice::default();
    let dies = Tenant {
        dies_ns: Some(S),
        ..tenant(2, 1000)
    };
    let devr = &dev;
    let reaped = AtomicU64::new(0);
    let holder = AtomicU32::new(0);
    let r = simulate_with(
        &t,
        &[tenant(1, 1000), dies],
        2.0,
        &dev,
        |cpu, t, procs, dead| {
            while !dead[1].load(Relaxed) {
                cpu.sleep(100_000);
            }
            on_process_dead(cpu, devr, 0, t, 2, &t.0[1].0, &procs[1]);
            reaped.store(cpu.peek(), Relaxed);
            holder.store(Lease::unpack(devr.lease.load(Relaxed)).holder, Relaxed);
        },
    );
    let at = reaped.load(Relaxed);
    // The lease is the survivor's the moment the reaper is done (a takeover would wait out the
    // dead holder's lease and grace first).
    assert_eq!(holder.load(Relaxed), 1, "not revoked at once");
    assert!(r.fraction(0, at + 10 * MS, 2 * S) >= 0.97);
    // The survivor's next kernel completes within its own kernel time after what the dead
    // process left queued (up to its depth, 4 ms, on the engine).
    assert!(
        r.max_gap(0, at, 2 * S) <= 6 * MS,
        "{}",
        r.max_gap(0, at, 2 * S)
    );
}

/// A dead solo holder's lease is freed by the reaper.
#[test]
fn the_reaper_frees_a_dead_solo_holder() {
    let t = Table::new(&[(0.5, 0.0)]);
    let dev = SchedDevice::default();
    let dies = Tenant {
        dies_ns: Some(S / 2),
        ..tenant(1, 1000)
    };
    let devr = &dev;
    simulate_with(&t, &[dies], 1.0, &dev, |cpu, t, procs, dead| {
        while !dead[0].load(Relaxed) {
            cpu.sleep(100_000);
        }
        assert!(Lease::unpack(devr.lease.load(Relaxed)).solo);
        on_process_dead(cpu, devr, 0, t, 1, &t.0[0].0, &procs[0]);
    });
    assert_eq!(Lease::unpack(dev.lease.load(Relaxed)), Lease::FREE);
}

/// A waiter the reaper wrongly took for dead (its place among the waiters dropped while it
/// waits) takes its place again and gets its turns.
#[test]
fn a_waiter_wrongly_reaped_still_competes() {
    let t = Table::new(&[(0.5, 0.0), (0.5, 0.0)]);
    let dev = SchedDevice::default();
    let devr = &dev;
    let r = simulate_with(
        &t,
        &[tenant(1, 1000), tenant(2, 1000)],
        2.0,
        &dev,
        |cpu, t, procs, _| {
            for k in 0..20 {
                cpu.sleep_until(S + k * 1_300_000);
                on_process_dead(cpu, devr, 0, t, 2, &t.0[1].0, &procs[1]);
            }
        },
    );
    assert_no_gap(&r, S, 2 * S, 50 * MS);
    assert_split(&r, 1100 * MS, 2 * S, &[0.5, 0.5], 0.04);
}

/// Charge by slice: two processes of one slice at 0.5 next to one process of another slice
/// at 0.5 get 0.5 together. Their launches measure time queued behind each other (the shim's
/// events do), which each process used to pay for on its own, leaving the slice well short.
#[test]
fn a_slice_of_two_processes_gets_its_share() {
    let learning = |id| Tenant {
        learn: true,
        ..tenant(id, 1000)
    };
    // On the time-sliced engine (the hardware's and the fake's) in both modes. Not on the
    // engine of the older tests, which runs every kernel in submission order: there the two
    // processes' launches alternate in one queue, so every measurement of either includes the
    // other's kernel, no estimate learned from events tells a launch's own time, and with the
    // slice's queue bounded together (each counting its least measurement, which is inflated
    // there too) the slice got 0.44.
    for mode in [PERSONAL, NODE] {
        let t = Table::new(&[(0.5, 0.0), (0.5, 0.0)]);
        let r = simulate_in(mode, &t, &[learning(1), learning(1), learning(2)], 10.5);
        let (a, b) = (S / 2, 10 * S + S / 2);
        let slice = r.fraction(0, a, b) + r.fraction(1, a, b);
        let other = r.fraction(2, a, b);
        assert!(slice + other >= 0.9, "{slice} {other}");
        assert!(
            (slice - 0.5).abs() <= 0.04,
            "the slice of two got {slice:.3}, the other {other:.3} (sliced {}, node {})",
            mode.slice_ns != 0,
            mode.node
        );
    }
}

/// A slice's processes together queue at most about a turn in personal mode, as in node mode
/// (`SchedSlice::queue_in_turn`): eight processes of a 0.5 slice, each keeping 16 launches of
/// 1 ms in flight, next to a one-process 0.5 slice as deep. Each bounding only its own queue by
/// the turn, the eight had 16 ms queued at once (11.7 ms on an engine that runs kernels in
/// submission order); their estimates, inflated by each other's kernels, kept it from eight
/// turns, but only while the estimates were inflated.
#[test]
fn processes_of_a_slice_queue_about_one_turn_together() {
    for mode in [PERSONAL, FIFO] {
        let t = Table::new(&[(0.5, 0.0), (0.5, 0.0)]);
        let deep = |id| Tenant {
            depth: 16,
            learn: true,
            ..tenant(id, 1000)
        };
        let mut ts: Vec<Tenant> = (0..8).map(|_| deep(1)).collect();
        ts.push(deep(2));
        let r = simulate_in(mode, &t, &ts, 3.0);
        let (most, other) = (r.backlog[0], r.backlog[1]);
        let (a, b) = (r.slice_fraction(1, S, 3 * S), r.slice_fraction(2, S, 3 * S));
        // The figures of docs/benchmarks.md (`-- --nocapture`).
        eprintln!(
            "sliced {}: the slice of eight queued at most {:.1} ms, the other {:.1} ms; \
             {a:.3} / {b:.3}",
            mode.slice_ns != 0,
            most as f64 / 1e6,
            other as f64 / 1e6
        );
        // A turn, the hand-over lead, and the kernel each of two processes had begun.
        assert!(
            most <= LEASE_NS + HANDOFF_LEAD_NS + 2 * MS,
            "sliced {}: the slice of eight had {:.1} ms queued at once (the other {:.1} ms)",
            mode.slice_ns != 0,
            most as f64 / 1e6,
            other as f64 / 1e6
        );
    }
}

fn percentile(v: &[u64], p: f64) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Priority: a request/response tenant (bursts of 20 kernels of 50 us, 10 ms apart) next to a
/// trainer saturating the device with 2 ms kernels 16 deep. Alone, its p99 burst latency is
/// about 20 kernels; colocated without priority it waits behind the trainer's queue and turn;
/// with priority its p99 is within 1.5x of alone plus one trainer kernel, and the trainer keeps
/// at least its guaranteed share.
#[test]
fn a_latency_slice_gets_the_device_at_the_next_launch() {
    latency_class_in(FIFO);
}

/// [`a_latency_slice_gets_the_device_at_the_next_launch`] in node mode, on the fake's engine:
/// the first launch of each burst waits for the monitor's grant (ring, pass, futex wake).
#[test]
fn a_latency_slice_is_granted_the_device_at_once_in_node_mode() {
    latency_class_in(NODE);
}

fn latency_class_in(mode: Mode) {
    let server = |class| Tenant {
        burst: Some((20, 10 * MS)),
        class,
        ..tenant(1, 50)
    };
    let trainer = Tenant {
        depth: 16,
        ..tenant(2, 2000)
    };
    let run = |tenants: &[Tenant]| {
        let t = Table::new(&[(0.2, 0.0), (0.6, 0.0)]);
        simulate_in(mode, &t, tenants, 6.0)
    };
    let alone = run(&[server(CLASS_NORMAL)]);
    let normal = run(&[server(CLASS_NORMAL), trainer.clone()]);
    let latency = run(&[server(CLASS_LATENCY), trainer.clone()]);
    let p = |r: &Ran| {
        let b = &r.bursts[0][5..];
        (percentile(b, 0.5), percentile(b, 0.99))
    };
    let (a50, a99) = p(&alone);
    let (n50, n99) = p(&normal);
    let (l50, l99) = p(&latency);
    let trainer_share = |r: &Ran| r.fraction(1, S / 2, 6 * S);
    eprintln!(
        "burst latency p50/p99 us: alone {}/{}, colocated {}/{} (trainer {:.3}), with priority \
         {}/{} (trainer {:.3})",
        a50 / 1000,
        a99 / 1000,
        n50 / 1000,
        n99 / 1000,
        trainer_share(&normal),
        l50 / 1000,
        l99 / 1000,
        trainer_share(&latency)
    );
    assert!(
        l99 as f64 <= 1.5 * a99 as f64 + 2.0 * MS as f64,
        "{l99} vs alone {a99}"
    );
    // Without priority it waits for the trainer's turn to end: in personal mode 4.1 ms
    // against 3.0 with priority, since the trainer no longer gets a solo lease (whose queue is
    // not bounded) between bursts 10 ms apart (`SOLO_QUIET_NS`; it waited 35 ms before); in
    // node mode 3.6 ms against 3.0. Priority never makes it worse (within the burst's own
    // kernels), nor the normal class worse than a trainer's turn.
    assert!(
        l99 <= n99 + 500_000,
        "priority made it worse: {n99} vs {l99}"
    );
    assert!(n99 <= a99 + LEASE_NS + 2 * MS, "{n99} vs alone {a99}");
    // The client's idle time between requests is lent to the trainer, not held: the device
    // idled 30 % of the time while a normal-class client kept each turn to its end (the
    // trainer at 0.615 in personal mode; 0.854 now, 0.882 in node mode).
    assert!(
        trainer_share(&normal) >= 0.8,
        "trainer beside a normal client: {}",
        trainer_share(&normal)
    );
    assert!(
        trainer_share(&latency) >= 0.6,
        "{}",
        trainer_share(&latency)
    );
}

/// A share changed while the tenants run (what `gpuslice slice set` does to the record) is in
/// force from the next turn: the new split holds from 100 ms after the change.
#[test]
fn a_share_changed_live_applies_from_the_next_turn() {
    let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
    let dev = SchedDevice::default();
    let r = simulate_with(
        &t,
        &[tenant(1, 1000), tenant(2, 1000)],
        3.0,
        &dev,
        |cpu, t, _, _| {
            cpu.sleep_until(S);
            t.0[1].1.store(250_000, Relaxed);
            t.0[0].1.store(750_000, Relaxed);
        },
    );
    assert_split(&r, S / 2, S, &[0.25, 0.75], 0.04);
    assert_split(&r, S + 100 * MS, 3 * S, &[0.75, 0.25], 0.04);
    assert_no_gap(&r, S / 2, 3 * S, 50 * MS);
}

/// A latency slice that saturates the device does not take the others' guarantees: past its
/// lead it queues like any slice, and the split is the shares'.
#[test]
fn a_saturating_latency_slice_keeps_to_its_share() {
    let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
    let hungry = Tenant {
        class: CLASS_LATENCY,
        ..tenant(1, 1000)
    };
    let r = simulate(&t, &[hungry, tenant(2, 1000)], 4.0);
    assert_split(&r, S / 2, 4 * S, &[0.25, 0.75], 0.04);
}

mod hostile;
