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
//!
//! The parts: the machine here, the engine in `engine.rs`, a process's view of its queue in
//! `queue.rs`.

mod engine;
mod queue;

pub use engine::Engine;
pub use queue::Queue;

use core::sync::atomic::{AtomicU32, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::sys::Os;

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
    /// Signalled when this process is the one to run: only it wakes (a wake-up of every
    /// thread at each switch made the 66-process tests cost a minute of system time).
    cv: Arc<Condvar>,
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
    /// Signalled when the last process is done.
    all_done: Condvar,
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
            all_done: Condvar::new(),
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
                    cv: Arc::new(Condvar::new()),
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
            while !st.threads.iter().all(|t| t.done) {
                st = self.all_done.wait(st).unwrap_or_else(|e| e.into_inner());
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
        if st.threads.iter().all(|t| t.done) {
            self.0.world.all_done.notify_all();
        }
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
            t.cv.notify_one();
            st.running = i;
        }
    }
}

impl Cpu<'_> {
    fn wait_turn(&self) {
        let st = self.world.lock();
        self.wait_running(st);
    }

    /// Sleep until this process is the one running.
    fn wait_running(&self, mut st: MutexGuard<'_, St>) {
        let cv = st.threads[self.id].cv.clone();
        while st.running != self.id {
            st = cv.wait(st).unwrap_or_else(|e| e.into_inner());
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
        self.wait_running(st);
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
