//! A deterministic machine for the scheduler's unit tests: simulated time, a simulated CPU that
//! runs one simulated process at a time, a futex, and a GPU with one execution engine.
//!
//! Each simulated process is a real thread, but only one runs at any moment, and only until
//! it reads the clock, sleeps or waits on the futex: then the thread whose wake-up time is
//! earliest runs next (ties in the order they blocked), and the clock jumps to that time.
//! Reading the clock costs [`World::new`]'s `cpu_ns` of simulated time, so two processes
//! reading it in turn interleave exactly as two CPUs would at that granularity, the same way
//! on every run. A process can be *stalled* (it cannot run between two instants, however it
//! is woken: a descheduled or SIGSTOPped process) and can wake late from a futex wake-up.
//!
//! The GPU: kernels of every process run one after another in submission order on one engine
//! ([`Engine`]); [`Queue`] is one process's view of its queued work, built like the shim's
//! event ring (it knows only the launches it tracked, estimates their end from the measured
//! kernel time, and sees a completion only once it happened).

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

use super::client::{Os, Work};

const NONE: usize = usize::MAX;

struct Thread {
    /// Blocked until this simulated time.
    wake_at: u64,
    /// Order of blocking, for ties.
    order: u64,
    /// Futex word waited on (its address), 0 for none.
    futex: usize,
    blocked: bool,
    done: bool,
    /// Intervals `[from, to)` in which the process cannot run.
    stalls: Vec<(u64, u64)>,
    /// Delay between a futex wake-up and the process running.
    wake_latency: u64,
}

struct St {
    now: u64,
    running: usize,
    threads: Vec<Thread>,
    order: u64,
    cpu_ns: u64,
}

/// The simulated machine.
pub struct World {
    st: Mutex<St>,
    cv: Condvar,
}

/// One simulated process's CPU: its clock, sleep and futex (the scheduler's [`Os`]).
pub struct Cpu<'w> {
    world: &'w World,
    id: usize,
}

/// What a simulated process is: when it starts, when it cannot run, and its program.
pub struct Process<'s> {
    /// Simulated time it starts at.
    pub start_ns: u64,
    /// Intervals `[from, to)` in which it cannot run.
    pub stalls: Vec<(u64, u64)>,
    /// Delay from a futex wake-up to running.
    pub wake_latency_ns: u64,
    /// The program.
    pub body: Box<dyn FnOnce(&Cpu) + Send + 's>,
}

impl World {
    /// A machine whose clock reads cost `cpu_ns` of simulated time.
    pub fn new(cpu_ns: u64) -> World {
        World {
            st: Mutex::new(St {
                now: 0,
                running: NONE,
                threads: Vec::new(),
                order: 0,
                cpu_ns,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `procs` to completion; returns the simulated time at the end.
    pub fn run(&self, procs: Vec<Process<'_>>) -> u64 {
        {
            let mut st = self.lock();
            for p in &procs {
                let order = st.order;
                st.order += 1;
                st.threads.push(Thread {
                    wake_at: p.start_ns,
                    order,
                    futex: 0,
                    blocked: true,
                    done: false,
                    stalls: p.stalls.clone(),
                    wake_latency: p.wake_latency_ns,
                });
            }
        }
        let base = self.lock().threads.len() - procs.len();
        std::thread::scope(|sc| {
            for (i, p) in procs.into_iter().enumerate() {
                let cpu = Cpu {
                    world: self,
                    id: base + i,
                };
                sc.spawn(move || {
                    cpu.wait_turn();
                    let _exit = Exit(&cpu);
                    (p.body)(&cpu);
                });
            }
            let mut st = self.lock();
            dispatch(&mut st);
            self.cv.notify_all();
            while !st.threads.iter().all(|t| t.done) {
                st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        });
        self.lock().now
    }
}

/// Marks its process done when it returns or panics, so the others go on.
struct Exit<'a, 'w>(&'a Cpu<'w>);

impl Drop for Exit<'_, '_> {
    fn drop(&mut self) {
        let mut st = self.0.world.lock();
        st.threads[self.0.id].done = true;
        dispatch(&mut st);
        self.0.world.cv.notify_all();
    }
}

/// When thread `t` can run if it is due at `at`: after any stall covering that time.
fn effective(t: &Thread, mut at: u64) -> u64 {
    loop {
        match t.stalls.iter().find(|&&(f, to)| at >= f && at < to) {
            Some(&(_, to)) => at = to,
            None => return at,
        }
    }
}

/// Let the blocked process due earliest run, advancing the clock to its time.
fn dispatch(st: &mut St) {
    let next = st
        .threads
        .iter()
        .enumerate()
        .filter(|(_, t)| t.blocked && !t.done)
        .min_by_key(|(_, t)| (effective(t, t.wake_at), t.order))
        .map(|(i, t)| (i, effective(t, t.wake_at)));
    match next {
        None => st.running = NONE,
        Some((i, at)) => {
            st.now = st.now.max(at);
            let t = &mut st.threads[i];
            t.blocked = false;
            t.futex = 0;
            st.running = i;
        }
    }
}

impl Cpu<'_> {
    fn wait_turn(&self) {
        let mut st = self.world.lock();
        while st.running != self.id {
            st = self.world.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Block until `at` (or a futex wake-up on `futex`, when not 0), letting others run.
    fn block(&self, mut st: MutexGuard<'_, St>, at: u64, futex: usize) {
        let order = st.order;
        st.order += 1;
        let t = &mut st.threads[self.id];
        t.wake_at = at;
        t.order = order;
        t.futex = futex;
        t.blocked = true;
        dispatch(&mut st);
        if st.running == self.id {
            return;
        }
        self.world.cv.notify_all();
        while st.running != self.id {
            st = self.world.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The simulated time, without spending any (for the models, not the code under test).
    pub fn peek(&self) -> u64 {
        self.world.lock().now
    }

    /// Sleep until simulated time `at`.
    pub fn sleep_until(&self, at: u64) {
        let st = self.world.lock();
        let at = at.max(st.now);
        self.block(st, at, 0);
    }

    /// Sleep `ns` of simulated time (a process busy on its CPU, or descheduled).
    pub fn sleep(&self, ns: u64) {
        let st = self.world.lock();
        let at = st.now + ns;
        self.block(st, at, 0);
    }
}

impl Os for Cpu<'_> {
    fn now_ns(&self) -> u64 {
        let st = self.world.lock();
        let at = st.now + st.cpu_ns;
        self.block(st, at, 0);
        self.world.lock().now
    }

    fn futex_wait(&self, word: &AtomicU32, val: u32, timeout_ns: u64) {
        let st = self.world.lock();
        if word.load(SeqCst) != val {
            return;
        }
        let at = st.now.saturating_add(timeout_ns);
        self.block(st, at, word.as_ptr() as usize);
    }

    fn futex_wake(&self, word: &AtomicU32) {
        let mut st = self.world.lock();
        let now = st.now;
        let addr = word.as_ptr() as usize;
        for t in st.threads.iter_mut() {
            if t.blocked && t.futex == addr {
                t.futex = 0;
                t.wake_at = t.wake_at.min(now + t.wake_latency);
            }
        }
    }
}

/// The GPU's one execution engine: kernels of every process in submission order.
#[derive(Default)]
pub struct Engine {
    free_at: AtomicU64,
}

impl Engine {
    /// Queue a kernel of `ns` submitted at `now`; returns when it completes.
    pub fn launch(&self, now: u64, ns: u64) -> u64 {
        let start = self
            .free_at
            .fetch_update(SeqCst, SeqCst, |f| Some(f.max(now) + ns))
            .unwrap_or(0);
        start.max(now) + ns
    }
}

/// What pending work counts for once its estimated end has passed (the shim's figure).
const MIN_PENDING_NS: u64 = 10_000;

/// One process's queued work, as the shim's event ring sees it (the scheduler's [`Work`]).
pub struct Queue<'a, 'w> {
    cpu: &'a Cpu<'w>,
    engine: &'a Engine,
    /// Completion times of every launch in flight (what the program paces itself on).
    pub all: VecDeque<u64>,
    /// (submitted, completes) of the tracked launches (admitted off the solo path).
    tracked: VecDeque<(u64, u64)>,
    /// Learn the estimate from completions, as the shim does from its events: a launch's
    /// measured time runs from when its stream reached it (its submission, or the process's
    /// previous kernel's end) to its end, so it includes time queued behind other processes.
    pub learn: bool,
    /// Completion of this process's previous launch.
    last_end: u64,
    /// The estimate of one launch.
    pub est_ns: u64,
    /// Estimated end of the tracked work.
    tail_end: u64,
}

impl<'a, 'w> Queue<'a, 'w> {
    /// An empty queue whose launches are estimated at `est_ns`.
    pub fn new(cpu: &'a Cpu<'w>, engine: &'a Engine, est_ns: u64) -> Queue<'a, 'w> {
        Queue {
            cpu,
            engine,
            all: VecDeque::new(),
            tracked: VecDeque::new(),
            learn: false,
            last_end: 0,
            est_ns,
            tail_end: 0,
        }
    }

    /// Launch a kernel of `ns` now (`tracked`: admitted by the scheduler, so the shim records
    /// events around it); returns its completion time.
    pub fn launch(&mut self, ns: u64, tracked: bool) -> u64 {
        let now = self.cpu.peek();
        let end = self.engine.launch(now, ns);
        self.all.push_back(end);
        let reached = now.max(self.last_end);
        self.last_end = end;
        if tracked {
            self.tracked.push_back((reached, end));
            self.tail_end = self.tail_end.max(now) + self.est_ns;
        }
        end
    }

    /// Retire completed tracked launches; whether any is still pending.
    fn poll(&mut self) -> bool {
        let now = self.cpu.peek();
        while let Some(&(reached, end)) = self.tracked.front().filter(|t| t.1 <= now) {
            self.tracked.pop_front();
            if self.learn {
                self.est_ns = (3 * self.est_ns + (end - reached)) / 4;
            }
        }
        !self.tracked.is_empty()
    }
}

impl Work for Queue<'_, '_> {
    fn outstanding_ns(&mut self) -> u64 {
        if !self.poll() {
            self.tail_end = 0;
            return 0;
        }
        self.tail_end
            .saturating_sub(self.cpu.peek())
            .max(MIN_PENDING_NS)
    }

    fn next_ns(&mut self) -> u64 {
        self.est_ns
    }

    fn drain(&mut self) -> u64 {
        while self.poll() {
            let last = self.tracked.back().expect("pending").1;
            self.cpu.sleep_until(last);
        }
        self.cpu.peek()
    }

    fn pending(&mut self) -> usize {
        self.poll();
        self.tracked.len()
    }

    fn wait_pending(&mut self, n: usize) {
        self.poll();
        if self.tracked.len() > n {
            let at = self.tracked[self.tracked.len() - 1 - n].1;
            self.cpu.sleep_until(at);
            self.poll();
        }
    }

    fn wait_below(&mut self, ns: u64) -> u64 {
        let t0 = self.cpu.peek();
        loop {
            if !self.poll() {
                self.tail_end = 0;
                return 0;
            }
            let now = self.cpu.peek();
            let left = self.tail_end.saturating_sub(now);
            if (left > 0 && left <= ns) || now.saturating_sub(t0) > 1_000_000_000 {
                return left.max(MIN_PENDING_NS);
            }
            let nap = if left > ns {
                left - ns
            } else {
                2 * MIN_PENDING_NS
            };
            self.cpu.sleep(nap.min(1_000_000));
        }
    }
}
