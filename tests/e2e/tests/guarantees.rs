//! Compute guarantees between tenants who do not trust each other (issue #20, docs/security.md
//! "Compute in node mode"): a root monitor in node mode, one fake device, user t1
//! (`TENANT_A`) with a 0.25 slice and whatever else it likes, user t2 (`TENANT_B`) with one
//! process in a 0.75 slice. Each test is one of the attacks by t1; in each, t2 must get
//! at least 0.71 of the device's busy time over 10 s, and t1's slices together at most 0.29 of
//! the device in every second of those 10 s.
//!
//! Measured from the fake GPU's own books (engine time per process, `fakegpu_engine_ns`,
//! sampled every 100 ms by `gpuslice-e2e-helper engine-ns` running as root), never from
//! gpuslice's figures. The tests hold one lock (they measure in real time) and are meant to
//! pass with every CPU busy: t2's figure is its part of the time the two users got together
//! (how much the device idles depends on whether the launchers get a CPU); where an attack
//! idles the device (a stopped holder), t2 is compared with what it got beside the same tenant
//! just before, side by side. t1's ceiling holds per second while t2 has work queued: a host
//! that keeps t2's one launcher off a CPU lends its turns to t1 (rightly: t2 has nothing queued
//! and does not ask), so a second's ceiling is raised by t2's share of the part of it t2's
//! threads waited for a CPU (their run-queue time, `/proc/PID/task/*/schedstat`), the rule the
//! PyTorch tenants' test uses to tell a starved tenant from a refused one. Traced with two and
//! three busy loops (docs/benchmarks.md, "Issue 20, round 3 (h7/ceiling)"): in every second
//! over 0.29, every turn of t1's was granted while t2's one process neither waited nor had work
//! queued, and t2's threads waited for a CPU 0.30-0.32 of that second (0.1-0.2 in others).

use gpuslice_e2e::node::*;
use gpuslice_e2e::{artifact, need_root};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// t2's slice must get at least this part of what the two users got.
const T2_FLOOR: f64 = 0.71;
/// t1's slices together may get at most this fraction of the device in any one second in
/// which t2 had work queued.
const T1_CEILING: f64 = 0.29;
/// t2's share: of a second in which its launcher had no CPU, this much is lent to t1.
const T2_SHARE: f64 = 0.75;
/// Seconds over which the guarantee is measured, after t2's first second.
const WINDOW_S: f64 = 10.0;
/// A reading of the books that took longer than this is not used as a point of the series.
const MAX_READING_S: f64 = 0.005;

static COMPUTE: Mutex<()> = Mutex::new(());

/// The node of one test (one 80 GiB device: room for the CUDA contexts of up to 65 processes,
/// 512 MiB each, charged inside their slices' quotas, docs/fakegpu.md; the monitor in node mode; `gpuslice-e2e-helper` runnable by
/// every user), the compute lock held while it lives; `None` without root.
fn compute_node() -> Option<(std::sync::MutexGuard<'static, ()>, Node)> {
    compute_node_of("80Gi")
}

/// [`compute_node`] with one device of `memory`.
fn compute_node_of(memory: &str) -> Option<(std::sync::MutexGuard<'static, ()>, Node)> {
    need_root!(None);
    let serial = COMPUTE.lock().unwrap_or_else(|e| e.into_inner());
    let n = Node::new(1, memory, &[]);
    let helper = n.bin.join("gpuslice-e2e-helper");
    std::fs::copy(artifact("gpuslice-e2e-helper"), &helper).unwrap();
    chmod(&helper, 0o755);
    Some((serial, n))
}

/// Whose a process is.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Who {
    T1,
    T2,
}

/// The fake GPU's books, read by `gpuslice-e2e-helper engine-ns` (root, no shim).
struct Books {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Books {
    fn open(n: &Node) -> Books {
        let mut child = n
            .world
            .command(artifact("gpuslice-e2e-helper"))
            .arg("engine-ns")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // The observer must not queue for a CPU behind the tenants' dozens of processes, or
        // its readings come too seldom (and too slowly) to judge a second. It costs a few
        // microseconds per 100 ms; root may raise it, a refusal leaves it as it was.
        // SAFETY: setpriority on our own child's pid; no memory is passed.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, child.id() as libc::id_t, -10) };
        Books {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
        }
    }

    /// The CLOCK_MONOTONIC seconds before and after the reading, and the engine ns the fake
    /// charged each of `pids` (None: the process is gone, or not attached yet).
    fn read(&mut self, pids: &[u32]) -> ((f64, f64), Vec<Option<u64>>) {
        let line: Vec<String> = pids.iter().map(u32::to_string).collect();
        writeln!(self.stdin, "{}", line.join(" ")).unwrap();
        let mut reply = String::new();
        self.stdout.read_line(&mut reply).unwrap();
        let mut w = reply.split_whitespace();
        let mut time = || {
            let t = w.next().and_then(|v| v.parse::<u64>().ok());
            t.unwrap_or_else(|| panic!("engine-ns answered {reply:?}")) as f64 / 1e9
        };
        let (from, to) = (time(), time());
        ((from, to), w.map(|v| v.parse().ok()).collect())
    }
}

impl Drop for Books {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One reading of the books: each user's engine time so far, seconds; and how long t2's threads
/// have waited for a CPU so far, seconds (summed over its threads).
#[derive(Clone, Copy, Debug)]
struct Sample {
    t: f64,
    t1: f64,
    t2: f64,
    t2_cpu_wait: f64,
}

/// Nanoseconds the threads of process `pid` have spent runnable but not running (the second
/// field of `/proc/PID/task/TID/schedstat`), summed; None once the process is gone.
fn run_queue_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut sum = 0;
    for t in tasks.flatten() {
        let stat = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        sum += stat
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(sum)
}

/// A thread that reads the books every 100 ms for the processes registered with [`Meter::add`]
/// (a process that is gone counts with its last reading).
struct Meter {
    pids: Arc<Mutex<Vec<(Who, u32)>>>,
    /// Each process's engine time at the latest reading.
    last: Arc<Mutex<std::collections::HashMap<u32, u64>>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Sample>>,
}

impl Meter {
    fn start(n: &Node) -> Meter {
        let mut books = Books::open(n);
        let pids: Arc<Mutex<Vec<(Who, u32)>>> = Arc::default();
        let last: Arc<Mutex<std::collections::HashMap<u32, u64>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (p, l, s) = (pids.clone(), last.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            // As the reader's (`Books::open`).
            // SAFETY: setpriority on this thread's own id; no memory is passed.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, -10) };
            let mut samples = vec![];
            // Each t2 process's run-queue time at its latest reading.
            let mut waited: std::collections::HashMap<u32, u64> = Default::default();
            while !s.load(SeqCst) {
                let now: Vec<(Who, u32)> = p.lock().unwrap().clone();
                let ids: Vec<u32> = now.iter().map(|x| x.1).collect();
                let ((from, to), ns) = books.read(&ids);
                let mut sum = [0u64; 2];
                let mut last = l.lock().unwrap();
                for ((who, pid), ns) in now.iter().zip(ns) {
                    let v = last.entry(*pid).or_insert(0);
                    *v = ns.unwrap_or(*v).max(*v);
                    sum[(*who == Who::T2) as usize] += *v;
                }
                drop(last);
                let mut t2_wait = 0;
                for (_, pid) in now.iter().filter(|x| x.0 == Who::T2) {
                    let v = waited.entry(*pid).or_insert(0);
                    *v = run_queue_ns(*pid).unwrap_or(*v).max(*v);
                    t2_wait += *v;
                }
                // A reading the reader was descheduled in the middle of has no one time: it
                // updates the last values, but is no point of the series.
                if to - from <= MAX_READING_S {
                    samples.push(Sample {
                        t: (from + to) / 2.0,
                        t1: sum[0] as f64 / 1e9,
                        t2: sum[1] as f64 / 1e9,
                        t2_cpu_wait: t2_wait as f64 / 1e9,
                    });
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        });
        Meter {
            pids,
            last,
            stop,
            thread,
        }
    }

    fn add(&self, who: Who, c: &Child) {
        self.pids.lock().unwrap().push((who, c.id()));
    }

    /// Wait (60 s at most) until every process of `children` has had the engine, then one
    /// second more: the attack runs in full before t2 comes (16 launchers on a busy host take a
    /// while to start).
    fn wait_running(&self, children: &[Child]) {
        let t0 = std::time::Instant::now();
        let running = || {
            let last = self.last.lock().unwrap();
            children
                .iter()
                .all(|c| last.get(&c.id()).is_some_and(|&ns| ns > 0))
        };
        while !running() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "t1's processes did not all get the engine within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_secs(1));
    }

    fn finish(self) -> Vec<Sample> {
        self.stop.store(true, SeqCst);
        self.thread.join().unwrap()
    }
}

/// The memory quota of a slice of `procs` processes here: a CUDA context each (512 MiB on the
/// fake, charged inside the quota) and 64 MiB (65 one-process slices fit).
fn quota(procs: usize) -> String {
    format!("{}Mi", procs * 512 + 64)
}

/// `gpuslice-burn` as `uid` in slice `slice` (memory quota `memory`, empty: none, its user's
/// best-effort memory; compute share `share`, None: best effort), launching `kernel_us`
/// kernels for `secs`.
fn burn_in(
    n: &Node,
    uid: u32,
    (slice, memory): (&str, &str),
    share: Option<&str>,
    kernel_us: u64,
    secs: f64,
) -> Child {
    let mut c = n.burn(uid);
    c.args(["--kernel-us", &kernel_us.to_string()])
        .args(["--seconds", &secs.to_string(), "--json"])
        .env("GPUSLICE_SLICE", slice)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(share) = share {
        c.env("GPUSLICE_COMPUTE", share);
    }
    if !memory.is_empty() {
        c.env("GPUSLICE_MEMORY", memory);
    }
    c.spawn().unwrap()
}

/// [`burn_in`] a one-process slice.
fn burn(n: &Node, uid: u32, slice: &str, share: Option<&str>, kernel_us: u64, secs: f64) -> Child {
    burn_in(n, uid, (slice, &quota(1)), share, kernel_us, secs)
}

/// t2's tenant: one process in a 0.75 slice, 1 ms kernels (burn's default depth 2, as the
/// issue ran it), for `secs`; registered with the meter. The guarantee's window is 11 s from
/// t2's first reading with engine time: `secs` leaves room for its start-up and that reading
/// on a busy host (12.5: 11.5 once left the readings ending 0.1 s short).
fn t2(n: &Node, m: &Meter, secs: f64) -> Child {
    let c = burn(n, TENANT_B, "t2", Some("0.75"), 1000, secs);
    m.add(Who::T2, &c);
    c
}

/// Wait for a finished tenant, which must have succeeded.
fn finished(c: Child) {
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

/// What each user got over a window.
#[derive(Debug)]
struct Got {
    /// The window, CLOCK_MONOTONIC seconds.
    from: f64,
    to: f64,
    /// Fractions of the device.
    t1: f64,
    t2: f64,
    /// t2's part of what the two got.
    part: f64,
    /// The most t1 got in any second of the window (1 s windows, every 0.5 s).
    t1_worst: f64,
    /// The second furthest over its ceiling ([`T1_CEILING`] plus what t2 lent in it): (t1's
    /// fraction, the part t2's threads waited for a CPU, how far over; <= 0: none over).
    t1_over: (f64, f64, f64),
    /// Per judged second: (t1's fraction, the part of it t2's threads waited for a CPU, summed
    /// over them: a launcher short of CPU lends its turns, which the ceiling cannot tell apart
    /// from a refusal).
    seconds: Vec<(f64, f64)>,
    /// Per half second: (t1, t2) fractions of the device.
    halves: Vec<(f64, f64)>,
    /// Seconds (of 19) for which t1's ceiling was judged.
    judged: usize,
    /// Readings in the window, and the longest time between two of them (s).
    readings: usize,
    gap: f64,
}

/// The first sample at or after `t`.
fn sample_at(s: &[Sample], t: f64) -> Sample {
    *s.iter().find(|x| x.t >= t - 1e-9).unwrap_or_else(|| {
        panic!(
            "no reading at {t:.2}: the last is at {:.2}",
            s[s.len() - 1].t
        )
    })
}

/// Each user's fraction of the device between the readings at `from` and at `to` (NaN when
/// one reading covers both: the reader did not get a CPU in between).
fn between(s: &[Sample], from: f64, to: f64) -> (f64, f64) {
    let (a, b) = (sample_at(s, from), sample_at(s, to));
    let dt = b.t - a.t;
    if dt <= 0.0 {
        return (f64::NAN, f64::NAN);
    }
    ((b.t1 - a.t1) / dt, (b.t2 - a.t2) / dt)
}

/// The guarantee's window: from 1 s after t2's process first got engine time, [`WINDOW_S`]
/// long, or `from` given.
fn got(s: &[Sample], from: Option<f64>) -> Got {
    let from = from.unwrap_or_else(|| {
        s.iter()
            .find(|x| x.t2 > 0.0)
            .expect("t2 never got the engine")
            .t
            + 1.0
    });
    let to = from + WINDOW_S;
    assert!(
        s.last().unwrap().t >= to,
        "the readings end at {:.2}, before the window's end {to:.2}",
        s.last().unwrap().t
    );
    let (t1, t2) = between(s, from, to);
    let mut t1_worst: f64 = 0.0;
    let mut t1_over = (0.0, 0.0, f64::NEG_INFINITY);
    let mut seconds = vec![];
    let mut judged = 0;
    let mut halves = vec![];
    let mut w = from;
    while w + 1.0 <= to + 1e-6 {
        // Only where readings bound the second closely (a reader without a CPU for a while
        // leaves a gap, and a rate over a longer span is no figure for one second).
        let (a, b) = (sample_at(s, w), sample_at(s, w + 1.0));
        if a.t - w <= 0.2 && b.t - (w + 1.0) <= 0.2 {
            let t1 = between(s, w, w + 1.0).0;
            let starved = ((b.t2_cpu_wait - a.t2_cpu_wait) / (b.t - a.t)).clamp(0.0, 1.0);
            t1_worst = t1_worst.max(t1);
            let over = t1 - (T1_CEILING + T2_SHARE * starved);
            if over > t1_over.2 {
                t1_over = (t1, starved, over);
            }
            seconds.push((t1, starved));
            judged += 1;
        }
        w += 0.5;
    }
    let mut w = from;
    while w + 0.5 <= to + 1e-6 {
        halves.push(between(s, w, w + 0.5));
        w += 0.5;
    }
    let inside: Vec<f64> = s
        .iter()
        .map(|x| x.t)
        .filter(|&t| t >= from && t <= to)
        .collect();
    Got {
        judged,
        readings: inside.len(),
        gap: inside.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max),
        from,
        to,
        t1,
        t2,
        part: t2 / (t1 + t2),
        t1_worst,
        t1_over,
        seconds,
        halves,
    }
}

fn show(g: &Got) -> String {
    let h: Vec<String> = g
        .halves
        .iter()
        .map(|(a, b)| format!("{a:.2}/{b:.2}"))
        .collect();
    let sec: Vec<String> = g
        .seconds
        .iter()
        .map(|(a, w)| format!("{a:.2}/{w:.2}"))
        .collect();
    format!(
        "t1 {:.3}, t2 {:.3} of the device (t2's part {:.3}), t1's worst second {:.3}, the \
         second furthest over its ceiling {:.3} with t2 {:.2} without a CPU ({:+.3}) (of {} \
         judged); {} readings, {:.2} s apart at most; per 0.5 s t1/t2: {}; per second t1 / \
         part t2's threads waited for a CPU: {}",
        g.t1,
        g.t2,
        g.part,
        g.t1_worst,
        g.t1_over.0,
        g.t1_over.1,
        g.t1_over.2,
        g.judged,
        g.readings,
        g.gap,
        h.join(" "),
        sec.join(" ")
    )
}

/// The guarantee: t2's part at least [`T2_FLOOR`], t1 at most [`T1_CEILING`] in every second,
/// plus what t2 lent in it for want of a CPU.
fn assert_guarantee(case: &str, g: &Got, n: &Node) {
    println!("{case}: {}", show(g));
    let log = || {
        let l = n.monitor_log();
        l[l.len().saturating_sub(4000)..].to_string()
    };
    assert!(
        g.part >= T2_FLOOR,
        "{case}: t2's 0.75 slice got {:.3} of the device's busy time ({:.3} of the device) over \
         {:.1} s: {}\n{}",
        g.part,
        g.t2,
        g.to - g.from,
        show(g),
        log()
    );
    assert!(
        g.judged >= 10,
        "{case}: the books were read too seldom to judge t1 second by second ({} of 19 \
         seconds): {}",
        g.judged,
        show(g)
    );
    let (t1, starved, over) = g.t1_over;
    assert!(
        over <= 0.0,
        "{case}: t1's slices got {t1:.3} of the device in one second while t2 had work queued \
         (its threads waited for a CPU {starved:.2} of that second, which lends t1 at most \
         {:.3}): {}\n{}",
        T2_SHARE * starved,
        show(g),
        log()
    );
}

/// t1 runs `procs` processes in its 0.25 slice, each launching `kernel_us` kernels, for the
/// whole of t2's run; t2 joins once they all run.
fn many_processes_in_one_slice(case: &str, procs: usize, kernel_us: u64) {
    let Some((_serial, n)) = compute_node() else {
        return;
    };
    let m = Meter::start(&n);
    let mut t1: Vec<Child> = (0..procs)
        .map(|_| {
            let t1 = ("t1", quota(procs));
            let c = burn_in(&n, TENANT_A, (t1.0, &t1.1), Some("0.25"), kernel_us, 17.0);
            m.add(Who::T1, &c);
            c
        })
        .collect();
    wait_for_slice(&n, "t1", procs);
    m.wait_running(&t1);
    let b = t2(&n, &m, 12.5);
    // What the monitor charged each slice over a second, halfway: beside the fake's books it
    // tells a slice charged for more than it got from one that did not get the engine.
    std::thread::sleep(Duration::from_secs(6));
    let st = n.status();
    let used = |slice: &str| {
        slices_named(&st, slice)
            .next()
            .and_then(|x| x["compute_used"].as_f64())
            .unwrap_or(f64::NAN)
    };
    let charged = (used("t1"), used("t2"));
    finished(b);
    let s = m.finish();
    kill_all(&mut t1);
    println!(
        "{case}: charged by the monitor halfway (compute_used): t1 {:.3}, t2 {:.3}",
        charged.0, charged.1
    );
    assert_guarantee(case, &got(&s, None), &n);
}

/// (a) 16 processes of 8 ms kernels in t1's 0.25 slice (on main: t2 got 0.053-0.072).
#[test]
fn sixteen_processes_of_8ms_kernels_in_a_quarter_slice_take_no_more_than_it() {
    many_processes_in_one_slice("16 x 8 ms", 16, 8000);
}

/// (b) 32 processes of 1 ms kernels in t1's 0.25 slice (on main: t2 got 0.604; before the
/// monitor held the next grant for a slice's leftover work, t1 0.277, t2 0.708, t1's worst
/// second 0.292 on an idle host: its processes' kernels queued past a turn ran beside t2's and
/// were charged to neither).
#[test]
fn thirty_two_processes_of_1ms_kernels_in_a_quarter_slice_take_no_more_than_it() {
    many_processes_in_one_slice("32 x 1 ms", 32, 1000);
}

/// (c) The virtual-time-floor pump: for 9.5 s t1 runs two best-effort slices on the otherwise
/// idle device while its 0.25 slice launches one 1 µs kernel every 100 ms; then that slice
/// saturates too, and t2 starts a new 0.75 slice (on main: 0 turns in 8 s, 0.001 of the device
/// over 15 s).
#[test]
fn a_pumped_virtual_time_floor_does_not_lock_out_a_newcomer() {
    let Some((_serial, n)) = compute_node() else {
        return;
    };
    let m = Meter::start(&n);
    let mut t1: Vec<Child> = ["be1", "be2"]
        .iter()
        .map(|slice| {
            let c = burn(&n, TENANT_A, slice, None, 1000, 25.0);
            m.add(Who::T1, &c);
            c
        })
        .collect();
    let pulse = n
        .command(TENANT_A, "gpuslice-e2e-helper")
        .args(["pulse", "1", "100", "25"])
        .env("LD_PRELOAD", n.bin.join("libgpuslice.so"))
        .env("GPUSLICE_COMPUTE", "0.25")
        .envs(in_slice("t1", &quota(2)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    m.add(Who::T1, &pulse);
    t1.push(pulse);
    wait_for_slice(&n, "t1", 1);
    std::thread::sleep(Duration::from_millis(9500));
    let sat = burn_in(&n, TENANT_A, ("t1", &quota(2)), Some("0.25"), 1000, 15.0);
    m.add(Who::T1, &sat);
    t1.push(sat);
    wait_for_slice(&n, "t1", 2);
    std::thread::sleep(Duration::from_millis(300));
    let b = t2(&n, &m, 12.5);
    finished(b);
    let s = m.finish();
    kill_all(&mut t1);
    assert_guarantee("vt pump", &got(&s, None), &n);
}

/// (d) 64 best-effort slices of one process each beside t1's saturating 0.25 slice (on main:
/// t2 got 0.437-0.454).
#[test]
fn sixty_four_best_effort_slices_take_nothing_guaranteed() {
    let Some((_serial, n)) = compute_node() else {
        return;
    };
    let m = Meter::start(&n);
    let q = burn(&n, TENANT_A, "t1", Some("0.25"), 1000, 30.0);
    m.add(Who::T1, &q);
    let mut t1 = vec![q];
    wait_for_slice(&n, "t1", 1);
    // Eight at a time, each eight admitted before the next: 64 processes asking at once on a
    // busy 2-CPU host can outwait the admission's time-out.
    for i in 0..64 {
        let c = burn(&n, TENANT_A, &format!("be{i}"), None, 1000, 30.0);
        m.add(Who::T1, &c);
        t1.push(c);
        if i % 8 == 7 {
            for j in i - 7..=i {
                wait_for_slice(&n, &format!("be{j}"), 1);
            }
        }
    }
    // Only the 0.25 slice is waited for: a best-effort slice gets the device only while no
    // guaranteed slice competes (docs/architecture/compute.md), so beside t1's saturating
    // slice the 64 may never get the engine at all; on an idle host they did not in 60 s.
    m.wait_running(&t1[..1]);
    let b = t2(&n, &m, 12.5);
    finished(b);
    let s = m.finish();
    kill_all(&mut t1);
    assert_guarantee("64 best effort", &got(&s, None), &n);
}

/// (e) t1's one process in its 0.25 slice stopped 190 ms and continued 10 ms, over and over
/// (on main: t2 got 0.586-0.598; only 7.4 of 9.5 s were charged to anyone). A stopped holder
/// idles the device, so besides the guarantee t2 must get about what it got beside the same
/// tenant running normally, measured in the 4 s just before (at least 0.95 of it).
///
/// The fake passes over a stopped holder of its engine within about a time slice, as the
/// hardware's time slicing does (`tests/fakegpu/src/exec/engine.rs`); with the fake's former
/// 200 ms limit, longer than the stop, this test failed (t2 at 0.72 of before).
#[test]
fn a_stop_continue_cycling_tenant_costs_the_other_nothing() {
    let Some((_serial, n)) = compute_node() else {
        return;
    };
    let m = Meter::start(&n);
    let a = burn(&n, TENANT_A, "t1", Some("0.25"), 1000, 30.0);
    m.add(Who::T1, &a);
    wait_for_slice(&n, "t1", 1);
    let b = t2(&n, &m, 17.0);
    wait_for_slice(&n, "t2", 1);
    std::thread::sleep(Duration::from_millis(5000));
    let cycling = gpuslice_sched::now_ns() as f64 / 1e9;
    let pid = a.id() as i32;
    let done = cycling + WINDOW_S + 1.0;
    while (gpuslice_sched::now_ns() as f64 / 1e9) < done {
        // SAFETY: our child (setpriv exec'd into the burn, same pid), not yet reaped.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::sleep(Duration::from_millis(190));
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        std::thread::sleep(Duration::from_millis(10));
    }
    finished(b);
    let s = m.finish();
    let mut a = a;
    kill_all([&mut a]);
    let before = between(&s, cycling - 4.0, cycling);
    let g = got(&s, Some(cycling + 0.5));
    assert_guarantee("SIGSTOP/SIGCONT 190/10 ms", &g, &n);
    println!(
        "before the cycling: t1 {:.3}, t2 {:.3}; while cycling t2 {:.3} ({:.2} of before)",
        before.0,
        before.1,
        g.t2,
        g.t2 / before.1
    );
    assert!(
        g.t2 >= 0.95 * before.1,
        "beside a stop/continue cycling tenant t2 got {:.3} of the device, {:.3} beside the \
         same tenant running just before: {}",
        g.t2,
        before.1,
        show(&g)
    );
}

/// Issue #34 (b): on a 16 GiB device (512 MiB contexts) t1 starts 64 one-process best-effort
/// slices (no compute share, no memory quota: their contexts are charged to t1's best-effort
/// memory, held to what the monitor grants it) beside its saturating 0.25 slice, after t2's
/// 0.75 slice of 1 GiB was made for it. The device cannot hold 64 contexts: t1's processes past
/// what its memory allows are refused at context creation, and t2's process starts (its
/// reservation and context are its own) and gets its part. On main t1's contexts were nobody's:
/// they filled the device and t2's process never started.
#[test]
fn sixty_four_best_effort_contexts_leave_a_reserved_slice_its_start() {
    let Some((_serial, n)) = compute_node_of("16Gi") else {
        return;
    };
    let o = n.cli(
        0,
        &[
            "slice",
            "create",
            "t2",
            "--memory",
            "1Gi",
            "--compute",
            "0.75",
            "--owner",
            &TENANT_B.to_string(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let m = Meter::start(&n);
    let q = burn(&n, TENANT_A, "t1", Some("0.25"), 1000, 30.0);
    m.add(Who::T1, &q);
    let mut t1 = vec![q];
    wait_for_slice(&n, "t1", 1);
    // Eight at a time, each settled (admitted, or gone) before the next eight.
    let mut refused = vec![];
    let mut batch: Vec<(String, Child)> = vec![];
    for i in 0..64 {
        let name = format!("be{i}");
        batch.push((
            name.clone(),
            burn_in(&n, TENANT_A, (&name, ""), None, 1000, 30.0),
        ));
        if batch.len() < 8 {
            continue;
        }
        let t0 = std::time::Instant::now();
        for (name, mut c) in batch.drain(..) {
            loop {
                if c.try_wait().unwrap().is_some() {
                    refused.push(c.wait_with_output().unwrap());
                    break;
                }
                // Admitted with its context: a process shows in `status` once admitted, and
                // its charge grows by the context only once the context was granted (one
                // refused it exits).
                let s = n.status();
                let charged = s["processes"].as_array().into_iter().flatten().any(|p| {
                    p["pid"] == c.id() && p["memory_used"].as_u64().is_some_and(|b| b > 0)
                });
                if charged
                    && slices_named(&s, &name)
                        .any(|x| x["pids"].as_array().is_some_and(|p| !p.is_empty()))
                {
                    m.add(Who::T1, &c);
                    t1.push(c);
                    break;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(120),
                    "{name} never settled"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let admitted = t1.len() - 1;
    println!(
        "64 best effort on 16 GiB: {admitted} admitted with their contexts, {} refused",
        refused.len()
    );
    assert!(admitted > 0 && !refused.is_empty(), "{admitted} admitted");
    // At most what the device has beside t2's 1 GiB, t1's slice and the monitor's context.
    assert!(admitted <= 28, "{admitted} contexts of 512 MiB");
    for o in &refused {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("cannot create a CUDA context") || burn_json(o)["error"]["code"] == 2,
            "a refused best-effort process: {}",
            text(o)
        );
    }
    m.wait_running(&t1[..1]);
    let b = t2(&n, &m, 12.5);
    finished(b);
    let s = m.finish();
    kill_all(&mut t1);
    assert_guarantee("64 best-effort contexts on 16 GiB", &got(&s, None), &n);
}
