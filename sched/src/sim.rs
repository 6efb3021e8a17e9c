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
//! The GPU ([`Engine`]): each simulated process is a context with its own queue. In the
//! time-sliced model (the hardware's scheduler, and the fake's, `FAKEGPU_TIMESLICE_US`) a
//! context keeps the engine while it has work, and hands it on round-robin after a time slice
//! while another context has work too, mid-kernel if need be: queued work runs past a turn,
//! several contexts' kernels interleave, and a stopped process's queue keeps running. The older
//! model runs every kernel in submission order. [`Queue`] is one process's view of its queued
//! work, built like the shim's event ring (it knows only the launches it tracked, estimates
//! their end from the measured kernel time, measures a kernel from when its stream reached it,
//! other contexts' slices included, and sees a completion only once it happened).

use core::sync::atomic::{AtomicU32, Ordering::*};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

use super::sys::Os;
use super::work::Work;

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

/// A kernel submitted to the [`Engine`].
pub type KernelId = usize;

struct Kernel {
    ctx: usize,
    submitted: u64,
    /// When its context's stream reached it: its submission, or the end of the context's
    /// previous kernel (where the shim's start event fires).
    reached: u64,
    end: Option<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Kernels of every context one after another in submission order (no preemption).
    Fifo,
    /// Contexts time-sliced round-robin, like the hardware's (and the fake's) scheduler: a
    /// context keeps the engine while it has work, and hands it on after this many ns when
    /// another context has work too, mid-kernel if need be.
    Sliced(u64),
}

/// The engine's queued work and where it stands: small (only what is queued), so a projection
/// can run a copy forward.
#[derive(Clone)]
struct Sched {
    mode: Mode,
    /// Simulated time the engine has been run up to.
    t: u64,
    /// Per context, its queued kernels in order, with the engine time each still needs.
    queues: Vec<VecDeque<(KernelId, u64)>>,
    /// The context of every queued kernel in submission order ([`Mode::Fifo`]).
    fifo: VecDeque<usize>,
    cur: usize,
    /// Since when `cur` has run while another context had work.
    slice_from: u64,
}

impl Sched {
    fn contended(&self, me: usize) -> bool {
        self.queues
            .iter()
            .enumerate()
            .any(|(c, q)| c != me && !q.is_empty())
    }

    /// The context the engine runs at `self.t`, and until when at most (`None`: idle).
    fn running(&mut self) -> Option<(usize, u64)> {
        match self.mode {
            Mode::Fifo => self.fifo.front().map(|&c| (c, u64::MAX)),
            Mode::Sliced(ts) => {
                let n = self.queues.len();
                if self.queues.get(self.cur).is_none_or(|q| q.is_empty())
                    || (self.contended(self.cur) && self.t >= self.slice_from + ts)
                {
                    // Round-robin to the next context with work.
                    self.cur = (1..=n)
                        .map(|i| (self.cur + i) % n)
                        .find(|&c| !self.queues[c].is_empty())?;
                    self.slice_from = self.t;
                }
                if !self.contended(self.cur) {
                    // Alone: its slice counts from when another context shows up.
                    self.slice_from = self.t;
                    return Some((self.cur, u64::MAX));
                }
                Some((self.cur, self.slice_from + ts))
            }
        }
    }

    /// Run up to `to`: `ran(ctx, from, to)` for each stretch of engine time, `ended(kernel,
    /// ctx, at)` for each completion, which returns whether to stop there.
    fn advance(
        &mut self,
        to: u64,
        ran: &mut dyn FnMut(usize, u64, u64),
        ended: &mut dyn FnMut(KernelId, usize, u64) -> bool,
    ) {
        while self.t < to {
            let Some((ctx, until)) = self.running() else {
                self.t = to;
                return;
            };
            let (k, left) = self.queues[ctx][0];
            let run_to = to.min(until).min(self.t + left);
            ran(ctx, self.t, run_to);
            self.queues[ctx][0].1 -= run_to - self.t;
            self.t = run_to;
            if self.queues[ctx][0].1 == 0 {
                self.queues[ctx].pop_front();
                if self.mode == Mode::Fifo {
                    self.fifo.pop_front();
                }
                if ended(k, ctx, self.t) {
                    return;
                }
            }
        }
    }
}

struct EngineState {
    sched: Sched,
    kernels: Vec<Kernel>,
    /// Per context, the intervals the engine ran its work.
    runs: Vec<Vec<(u64, u64)>>,
}

impl EngineState {
    fn advance(&mut self, to: u64) {
        let (kernels, runs) = (&mut self.kernels, &mut self.runs);
        let mut ended_at: Vec<(KernelId, usize, u64)> = Vec::new();
        self.sched.advance(
            to,
            &mut |ctx, from, to| match runs[ctx].last_mut() {
                Some(r) if r.1 == from => r.1 = to,
                _ => runs[ctx].push((from, to)),
            },
            &mut |k, ctx, at| {
                ended_at.push((k, ctx, at));
                false
            },
        );
        for (k, ctx, at) in ended_at {
            kernels[k].end = Some(at);
            if let Some(&(n, _)) = self.sched.queues[ctx].front() {
                let nk = &mut kernels[n];
                nk.reached = nk.submitted.max(at);
            }
        }
    }
}

/// The GPU's execution engine, shared by every simulated process (each its own context). Run
/// lazily: whoever looks at it runs it up to the simulated time (which only moves forward).
pub struct Engine {
    st: Mutex<EngineState>,
}

impl Engine {
    fn with(mode: Mode) -> Engine {
        Engine {
            st: Mutex::new(EngineState {
                sched: Sched {
                    mode,
                    t: 0,
                    queues: Vec::new(),
                    fifo: VecDeque::new(),
                    cur: 0,
                    slice_from: 0,
                },
                kernels: Vec::new(),
                runs: Vec::new(),
            }),
        }
    }

    /// Kernels of every context one after another in submission order.
    pub fn fifo() -> Engine {
        Engine::with(Mode::Fifo)
    }

    /// Contexts time-sliced round-robin every `slice_ns` while several have work (a real GPU's
    /// and the fake's scheduler: `FAKEGPU_TIMESLICE_US`, 2 ms by default).
    pub fn sliced(slice_ns: u64) -> Engine {
        Engine::with(Mode::Sliced(slice_ns))
    }

    fn lock(&self) -> MutexGuard<'_, EngineState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new context (a process's).
    pub fn context(&self) -> usize {
        let mut st = self.lock();
        st.sched.queues.push(VecDeque::new());
        st.runs.push(Vec::new());
        st.runs.len() - 1
    }

    /// Queue a kernel of `ns` on context `ctx` at `now`.
    pub fn submit(&self, ctx: usize, now: u64, ns: u64) -> KernelId {
        let mut st = self.lock();
        st.advance(now);
        let id = st.kernels.len();
        // Reached at once on an idle stream, else when the previous kernel ends (set then).
        let reached = if st.sched.queues[ctx].is_empty() {
            now
        } else {
            u64::MAX
        };
        st.kernels.push(Kernel {
            ctx,
            submitted: now,
            reached,
            end: None,
        });
        st.sched.queues[ctx].push_back((id, ns.max(1)));
        if st.sched.mode == Mode::Fifo {
            st.sched.fifo.push_back(ctx);
        }
        id
    }

    /// When kernel `k` completed, if it did by `now`.
    pub fn done(&self, k: KernelId, now: u64) -> Option<u64> {
        let mut st = self.lock();
        st.advance(now);
        st.kernels[k].end
    }

    /// The time from when its context's stream reached kernel `k` to its end (what the shim's
    /// events measure), once it completed.
    pub fn measured(&self, k: KernelId) -> Option<u64> {
        let st = self.lock();
        let k = &st.kernels[k];
        k.end.map(|e| e - k.reached.min(e))
    }

    /// When kernel `k` completes if nothing more is submitted (a lower bound: later submissions
    /// of other contexts can only delay it).
    pub fn projected_end(&self, k: KernelId, now: u64) -> u64 {
        let mut st = self.lock();
        st.advance(now);
        if let Some(e) = st.kernels[k].end {
            return e;
        }
        let mut copy = st.sched.clone();
        let mut at = u64::MAX;
        copy.advance(u64::MAX, &mut |_, _, _| {}, &mut |done, _, t| {
            if done == k {
                at = t;
            }
            done == k
        });
        at
    }

    /// The engine time the work queued on contexts `ctxs` still needs at `now`, together.
    pub fn backlog(&self, ctxs: &[usize], now: u64) -> u64 {
        let mut st = self.lock();
        st.advance(now);
        ctxs.iter()
            .filter_map(|&c| st.sched.queues.get(c))
            .flat_map(|q| q.iter().map(|&(_, left)| left))
            .sum()
    }

    /// The stretches of engine time context `ctx` ran, up to `now`.
    pub fn runs(&self, ctx: usize, now: u64) -> Vec<(u64, u64)> {
        let mut st = self.lock();
        st.advance(now);
        st.runs.get(ctx).cloned().unwrap_or_default()
    }

    /// Completion times of context `ctx`'s kernels that completed by `now`.
    pub fn ends(&self, ctx: usize, now: u64) -> Vec<u64> {
        let mut st = self.lock();
        st.advance(now);
        st.kernels
            .iter()
            .filter(|k| k.ctx == ctx && ctx != usize::MAX)
            .filter_map(|k| k.end)
            .collect()
    }
}

/// What pending work counts for once its estimated end has passed (the shim's figure).
const MIN_PENDING_NS: u64 = 10_000;

/// One process's queued work, as the shim's event ring sees it (the scheduler's [`Work`]).
pub struct Queue<'a, 'w> {
    cpu: &'a Cpu<'w>,
    engine: &'a Engine,
    /// The process's context on the engine.
    pub ctx: usize,
    /// Every launch in flight (what the program paces itself on).
    pub all: VecDeque<KernelId>,
    /// The tracked launches (admitted off the solo path).
    tracked: VecDeque<KernelId>,
    /// Learn the estimate from completions, as the shim does from its events: a launch's
    /// measured time runs from when its stream reached it (its submission, or the process's
    /// previous kernel's end) to its end, so it includes time other contexts held the engine.
    pub learn: bool,
    /// The estimate of one launch.
    pub est_ns: u64,
    /// The least recent measurement of one launch ([`crate::work::least_of`]).
    least_ns: u64,
    /// Estimated end of the tracked work.
    tail_end: u64,
    /// The latest tracked launch.
    last_tracked: Option<KernelId>,
}

impl<'a, 'w> Queue<'a, 'w> {
    /// An empty queue (a new context) whose launches are estimated at `est_ns`.
    pub fn new(cpu: &'a Cpu<'w>, engine: &'a Engine, est_ns: u64) -> Queue<'a, 'w> {
        Queue {
            cpu,
            engine,
            ctx: engine.context(),
            all: VecDeque::new(),
            tracked: VecDeque::new(),
            learn: false,
            est_ns,
            least_ns: est_ns,
            tail_end: 0,
            last_tracked: None,
        }
    }

    /// Launch a kernel of `ns` now (`tracked`: admitted by the scheduler, so the shim records
    /// events around it).
    pub fn launch(&mut self, ns: u64, tracked: bool) -> KernelId {
        let now = self.cpu.peek();
        let k = self.engine.submit(self.ctx, now, ns);
        self.all.push_back(k);
        if tracked {
            self.tracked.push_back(k);
            self.last_tracked = Some(k);
            self.tail_end = self.tail_end.max(now) + self.est_ns;
        }
        k
    }

    /// Sleep until kernel `k` completed (as a synchronizing call does); returns when.
    pub fn wait(&self, k: KernelId) -> u64 {
        loop {
            let now = self.cpu.peek();
            if let Some(e) = self.engine.done(k, now) {
                return e;
            }
            let at = self.engine.projected_end(k, now).max(now + 1);
            self.cpu.sleep_until(at);
        }
    }

    /// Sleep until the oldest launch in flight completed (a program's bounded queue).
    pub fn wait_oldest(&mut self) {
        if let Some(k) = self.all.pop_front() {
            self.wait(k);
        }
    }

    /// Retire completed tracked launches; whether any is still pending.
    fn poll(&mut self) -> bool {
        let now = self.cpu.peek();
        while let Some(&k) = self.tracked.front() {
            if self.engine.done(k, now).is_none() {
                break;
            }
            self.tracked.pop_front();
            if self.learn {
                let m = self.engine.measured(k).unwrap_or(self.est_ns);
                self.est_ns = (3 * self.est_ns + m) / 4;
                self.least_ns = crate::work::least_of(self.least_ns, m);
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

    fn next_least_ns(&mut self) -> u64 {
        self.least_ns.min(self.est_ns)
    }

    fn drain(&mut self) -> u64 {
        if let Some(&k) = self.tracked.back() {
            self.wait(k);
        }
        self.poll();
        self.cpu.peek()
    }

    fn finished_at(&mut self) -> Option<u64> {
        if self.poll() {
            return None;
        }
        self.engine.done(self.last_tracked?, self.cpu.peek())
    }

    fn pending(&mut self) -> usize {
        self.poll();
        self.tracked.len()
    }

    fn wait_pending(&mut self, n: usize) {
        self.poll();
        if self.tracked.len() > n {
            let k = self.tracked[self.tracked.len() - 1 - n];
            self.wait(k);
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
