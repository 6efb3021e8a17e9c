//! The executor: the engine client of one process for one device. It owns the queues of every
//! stream of that device, plans their work on a simulated clock in its own thread, and is what
//! synchronizing waits on. Apart from streams (the handles clients see, and where capture
//! diverts work) and from the engine (the node-wide token it takes and hands on), because it
//! is the one place that turns queued work into simulated time.
//!
//! A kernel starts at max(cursor, its submission, the moment this process got the engine) and
//! ends `duration` later; completions and event timestamps are those simulated end times, and
//! waiters sleep until real time reaches them. The executor plans at most [`HORIZON_NS`] ahead
//! of real time and only sleeps between batches, so short kernels stay exact despite sleep
//! overshoot. While the process holds the engine uncontended with nothing queued, a launch
//! plans itself in the caller's thread ([`Executor::plan_now`]): no thread hand-off per kernel,
//! so 20 µs kernels run back to back.

use super::engine::{self, acquire, others_want, release};
use super::Op;
use crate::runtime::{rt_unchecked, CuResult};
use crate::shared::{now_ns, sleep_until};
use gpuslice_abi::*;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Condvar, Mutex, MutexGuard};

/// How far ahead of real time an executor plans kernels.
pub const HORIZON_NS: u64 = 1_000_000;
/// A waiting executor holding planned work wakes this long before the work ends to plan what
/// arrived meanwhile (so submissions need not wake it one by one).
const WAKE_MARGIN_NS: u64 = 300_000;
/// Pending items per stream before a launch blocks, like the driver's push buffer.
pub const QUEUE_DEPTH: usize = 1024;

static STOP: AtomicBool = AtomicBool::new(false);

/// A queued op: its place in submission order, when it was submitted and, for a kernel, the
/// engine time it still needs (a kernel handed over mid-way resumes with the rest).
struct Item {
    op: Op,
    seq: u64,
    submit: u64,
    rem: u64,
}

/// One stream's queue, numbered by its index in [`ExecState::queues`] (reused once the stream
/// is destroyed and drained).
struct Queue {
    ctx: usize,
    items: VecDeque<Item>,
    submitted: u64,
    completed: u64,
    last_end: u64,
    live: bool,
}

/// What the executor's mutex guards.
struct ExecState {
    queues: Vec<Queue>,
    free_ids: Vec<usize>,
    seq: u64,
    /// When the waiting executor wakes by itself: 0 while it runs, `u64::MAX` when only a
    /// submission wakes it (it then holds no planned work).
    wake_at: u64,
    /// Whether this process holds the device's engine.
    held: bool,
    /// Simulated time up to which the engine's work is planned.
    cursor: u64,
    /// Start of the current time slice.
    slice_start: u64,
    /// Whether another process waited for the engine at the last planning step.
    contended: bool,
    /// Threads waiting on `done` for a completion.
    sync_waiters: u32,
    /// Completions not yet announced on `done`.
    unannounced: u32,
}

/// The engine client of this process for one device.
pub struct Executor {
    pub(super) phys: usize,
    kernel_ns: u64,
    slice_ns: u64,
    st: Mutex<ExecState>,
    work: Condvar,
    done: Condvar,
    started: AtomicBool,
    /// Copies, memsets and frees queued and not yet run (cuMemFree waits for them).
    pub pending_mem: AtomicUsize,
}

impl Executor {
    /// The executor of physical device `phys`.
    pub fn new(phys: usize, kernel_ns: u64, slice_ns: u64) -> &'static Executor {
        Box::leak(Box::new(Executor {
            phys,
            kernel_ns,
            slice_ns,
            st: Mutex::new(ExecState {
                queues: Vec::new(),
                free_ids: Vec::new(),
                seq: 0,
                wake_at: 0,
                unannounced: 0,
                held: false,
                cursor: 0,
                slice_start: 0,
                contended: false,
                sync_waiters: 0,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            started: AtomicBool::new(false),
            pending_mem: AtomicUsize::new(0),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, ExecState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Duration of a kernel that is not `gpuslice_spin`.
    pub fn default_kernel_ns(&self) -> u64 {
        self.kernel_ns
    }

    /// A new queue for a stream of context `ctx`; its number.
    pub(super) fn new_queue(&self, ctx: usize) -> usize {
        let mut g = self.lock();
        let q = Queue {
            ctx,
            items: VecDeque::new(),
            submitted: 0,
            completed: 0,
            last_end: 0,
            live: true,
        };
        match g.free_ids.pop() {
            Some(i) => {
                g.queues[i] = q;
                i
            }
            None => {
                g.queues.push(q);
                g.queues.len() - 1
            }
        }
    }

    fn ensure_thread(&'static self) -> CuResult<()> {
        if self.started.load(Acquire) || self.started.swap(true, AcqRel) {
            return Ok(());
        }
        let spawned = std::thread::Builder::new()
            .name(format!("fakegpu-exec{}", self.phys))
            .spawn(move || self.run());
        if spawned.is_err() {
            // Without its executor nothing queued would ever complete: fail this call rather
            // than hang the next synchronize, and let a later one try again.
            self.started.store(false, Release);
            return Err(CUDA_ERROR_OPERATING_SYSTEM);
        }
        Ok(())
    }

    /// Queue `op` on queue `id`, or plan it at once when it can be (see [`Executor::plan_now`]).
    pub(super) fn submit(&'static self, id: usize, op: Op) -> CuResult<()> {
        let rem = match op {
            Op::Kernel(ns) => ns,
            _ => 0,
        };
        self.ensure_thread()?;
        if op.touches_memory() {
            self.pending_mem.fetch_add(1, AcqRel);
        }
        let mut g = self.lock();
        while g.queues[id].items.len() >= QUEUE_DEPTH {
            g = self.done.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g.seq += 1;
        let seq = g.seq;
        if self.plan_now(&mut g, id, &op) {
            return Ok(());
        }
        let q = &mut g.queues[id];
        q.items.push_back(Item {
            op,
            seq,
            submit: now_ns(),
            rem,
        });
        q.submitted += 1;
        let wake = g.wake_at == u64::MAX;
        drop(g);
        if wake {
            self.work.notify_one();
        }
        Ok(())
    }

    /// While this process holds the engine uncontended and nothing is queued, a short kernel
    /// or an event record is planned right here (the executor would plan it identically):
    /// no thread hand-off per launch, so tiny kernels cost little host time.
    fn plan_now(&self, g: &mut ExecState, id: usize, op: &Op) -> bool {
        let now = now_ns();
        if !g.held || g.cursor > now + HORIZON_NS || g.queues.iter().any(|q| !q.items.is_empty()) {
            return false;
        }
        let node = rt_unchecked().node;
        let start = g.cursor.max(now);
        match *op {
            Op::Kernel(ns) if ns <= self.slice_ns => {
                let dev = &node.state.dev[self.phys];
                if !engine::holds(dev, node.slot) || others_want(node.state, self.phys, node.slot) {
                    return false;
                }
                dev.beat.store(now, Relaxed);
                node.charge(self.phys, ns, start);
                g.slice_start = start;
                g.cursor = start + ns;
            }
            Op::Record(ev, gen) => {
                g.cursor = start;
                ev.set_recorded(gen, start);
                if g.sync_waiters > 0 {
                    self.done.notify_all();
                }
            }
            _ => return false,
        }
        let end = g.cursor;
        let q = &mut g.queues[id];
        q.submitted += 1;
        q.completed += 1;
        q.last_end = end;
        true
    }

    /// Wait until everything queued on queue `id` so far is planned; when it ends in simulated
    /// time (the caller waits for that in its own way, [`super::HostWait`]).
    pub(super) fn wait_queue(&self, id: usize) -> u64 {
        let g = self.lock();
        let target = g.queues[id].submitted;
        let g = self.wait_while(g, |g| g.queues[id].completed < target);
        g.queues[id].last_end
    }

    /// Whether this process has work on the device planned to end after `t`, or queued and not
    /// yet planned: a synchronizing thread that wakes late at `t` then idles nothing.
    pub(super) fn busy_after(&self, t: u64) -> bool {
        let g = self.lock();
        g.cursor > t || g.queues.iter().any(|q| !q.items.is_empty())
    }

    /// Whether queue `id` has nothing pending, in simulated time too (`cuStreamQuery`).
    pub(super) fn queue_idle(&self, id: usize) -> bool {
        let g = self.lock();
        let q = &g.queues[id];
        q.completed == q.submitted && now_ns() >= q.last_end
    }

    /// Queue `id`'s stream is destroyed: the queue is reused once its pending work ran.
    pub(super) fn retire_queue(&self, id: usize) {
        let mut g = self.lock();
        g.queues[id].live = false;
        if g.queues[id].items.is_empty() {
            g.free_ids.push(id);
        }
    }

    /// Wait until everything queued so far on the queues of context `ctx` is planned; when it
    /// ends in simulated time (`cuCtxSynchronize`).
    pub(super) fn wait_ctx(&self, ctx: usize) -> u64 {
        let mut g = self.lock();
        let targets: Vec<(usize, u64)> = g
            .queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.ctx == ctx)
            .map(|(i, q)| (i, q.submitted))
            .collect();
        let mut end = 0;
        for (i, t) in targets {
            g = self.wait_while(g, |g| g.queues[i].completed < t && g.queues[i].ctx == ctx);
            end = end.max(g.queues[i].last_end);
        }
        end
    }

    /// Wait until `done()` holds, checked under the lock after each batch of completions
    /// (`cuEventSynchronize`).
    pub(super) fn wait_for(&self, done: impl Fn() -> bool) {
        drop(self.wait_while(self.lock(), |_| !done()));
    }

    /// Wake the executor and sleep on `done` while `pending` holds.
    fn wait_while<'a>(
        &'a self,
        mut g: MutexGuard<'a, ExecState>,
        pending: impl Fn(&ExecState) -> bool,
    ) -> MutexGuard<'a, ExecState> {
        while pending(&g) {
            self.work.notify_one();
            g.sync_waiters += 1;
            g = self.done.wait(g).unwrap_or_else(|e| e.into_inner());
            g.sync_waiters -= 1;
        }
        g
    }

    /// The executor thread: plan the oldest runnable item of any queue, holding the engine
    /// while there are kernels and handing it on when the slice is over and others wait.
    fn run(&'static self) {
        let node = rt_unchecked().node;
        let dev = &node.state.dev[self.phys];
        let me = node.slot;
        let mut g = self.lock();
        loop {
            let mut pick: Option<(usize, u64)> = None;
            let mut blocked = false;
            for (i, q) in g.queues.iter().enumerate() {
                if let Some(it) = q.items.front() {
                    if let Op::Wait(ev, gen) = it.op {
                        if !ev.recorded(gen) {
                            blocked = true;
                            continue;
                        }
                    }
                    if pick.is_none_or(|(_, s)| it.seq < s) {
                        pick = Some((i, it.seq));
                    }
                }
            }
            let Some((qi, _)) = pick else {
                if g.held {
                    let now = now_ns();
                    if g.cursor > now {
                        // Keep the engine until the planned work ends. New work is planned a
                        // little before that (it continues from the cursor without a gap), or
                        // at once when someone waits for it: one wake-up per batch, not per
                        // launch (and launches while we hold it plan themselves).
                        self.announce(&mut g);
                        let wake = if g.cursor - now > WAKE_MARGIN_NS {
                            g.cursor - WAKE_MARGIN_NS
                        } else {
                            g.cursor
                        };
                        g.wake_at = wake;
                        g = self
                            .work
                            .wait_timeout(g, std::time::Duration::from_nanos(wake - now))
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                        g.wake_at = 0;
                        continue;
                    }
                    release(node.state, dev, self.phys, me, g.cursor);
                    g.held = false;
                }
                self.announce(&mut g);
                g.wake_at = u64::MAX;
                g = if blocked {
                    self.work
                        .wait_timeout(g, std::time::Duration::from_micros(500))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                } else {
                    self.work.wait(g).unwrap_or_else(|e| e.into_inner())
                };
                g.wake_at = 0;
                continue;
            };
            let now = now_ns();
            let (op, submit, rem) = {
                let it = g.queues[qi]
                    .items
                    .front()
                    .expect("picked a non-empty queue");
                (it.op.clone(), it.submit, it.rem)
            };
            let start = g.cursor.max(submit);
            match op {
                Op::Kernel(_) => {
                    if !g.held {
                        self.announce(&mut g);
                        drop(g);
                        if STOP.load(Acquire) {
                            return;
                        }
                        acquire(node, dev, self.phys, self.slice_ns);
                        g = self.lock();
                        g.held = true;
                        // The engine is ours from where the last holder's work ended; a kernel
                        // still starts no earlier than it was submitted.
                        g.cursor = g.cursor.max(dev.free_at.load(Acquire));
                        // The slice starts now at the earliest: from an engine idle since long
                        // ago (cursor in the past) a contended slice would otherwise be over
                        // before its first kernel, and two such processes would pass the engine
                        // back and forth without running anything.
                        g.slice_start = g.cursor.max(now_ns());
                        continue;
                    }
                    if !engine::holds(dev, me) {
                        // Taken from us while we were stopped (see `acquire`): queue again.
                        g.held = false;
                        continue;
                    }
                    dev.beat.store(now, Relaxed);
                    if rem == 0 {
                        // No work (a 0 ns spin, FAKEGPU_KERNEL_US=0): it ends where it starts.
                        // It must not reach `step == 0` below, which means "slice over": that
                        // would hand the engine over and take it back forever.
                        g.cursor = start;
                        self.complete(&mut g, qi, start);
                        continue;
                    }
                    let contended = others_want(node.state, self.phys, me);
                    g.contended = contended;
                    if !contended {
                        g.slice_start = start;
                    }
                    let mut step = rem.min(self.slice_ns);
                    if contended {
                        step = step.min((g.slice_start + self.slice_ns).saturating_sub(start));
                    }
                    if step == 0 {
                        // Slice over with others waiting: hand over once real time gets there.
                        self.announce(&mut g);
                        let c = g.cursor;
                        g.held = false;
                        drop(g);
                        sleep_until(c);
                        release(node.state, dev, self.phys, me, c);
                        g = self.lock();
                        continue;
                    }
                    node.charge(self.phys, step, start);
                    g.cursor = start + step;
                    let left = rem - step;
                    g.queues[qi].items.front_mut().expect("still there").rem = left;
                    if left == 0 {
                        let c = g.cursor;
                        self.complete(&mut g, qi, c);
                    }
                    if g.cursor > now + HORIZON_NS {
                        self.announce(&mut g);
                        let until = g.cursor - HORIZON_NS / 2;
                        drop(g);
                        sleep_until(until);
                        g = self.lock();
                    }
                }
                Op::Record(ev, gen) => {
                    g.cursor = start;
                    ev.set_recorded(gen, start);
                    self.complete(&mut g, qi, start);
                }
                Op::Wait(ev, _) => {
                    g.cursor = start.max(ev.time());
                    let c = g.cursor;
                    self.complete(&mut g, qi, c);
                }
                op @ (Op::Host(..) | Op::Callback(..)) => {
                    self.announce(&mut g);
                    drop(g);
                    sleep_until(start);
                    // SAFETY: the client gave us this function and its argument to call once.
                    unsafe {
                        match op {
                            Op::Host(f, d) => f(d as *mut c_void),
                            Op::Callback(f, s, d) => {
                                f(s as CUstream, CUDA_SUCCESS, d as *mut c_void)
                            }
                            _ => {}
                        }
                    }
                    g = self.lock();
                    g.cursor = g.cursor.max(start.max(now_ns()));
                    let c = g.cursor;
                    self.complete(&mut g, qi, c);
                }
                op => {
                    self.announce(&mut g);
                    drop(g);
                    // SAFETY: the client keeps the ranges of queued copies and memsets mapped
                    // until they complete (freeing waits for pending_mem to drain).
                    unsafe {
                        match op {
                            Op::Copy(c) => c.run(),
                            Op::Set(m) => m.run(),
                            Op::Free(p) => crate::mem::free_now(p),
                            _ => {}
                        }
                    }
                    g = self.lock();
                    g.cursor = g.cursor.max(start);
                    self.pending_mem.fetch_sub(1, AcqRel);
                    self.complete(&mut g, qi, start);
                }
            }
        }
    }

    fn complete(&self, g: &mut ExecState, qi: usize, end: u64) {
        let q = &mut g.queues[qi];
        q.items.pop_front();
        q.completed += 1;
        q.last_end = end;
        if !q.live && q.items.is_empty() {
            g.free_ids.push(qi);
        }
        // Waiters sleep until the simulated end anyway, so completions are announced in
        // batches (before the executor sleeps, or every few dozen items): one wake-up per
        // batch instead of one per kernel keeps the simulation cheap for tiny kernels.
        g.unannounced += 1;
        if g.unannounced >= 32 {
            self.announce(g);
        }
    }

    fn announce(&self, g: &mut ExecState) {
        if g.unannounced > 0 {
            g.unannounced = 0;
            self.done.notify_all();
        }
    }
}

/// Stop executors from taking the engine again (process exit).
pub fn shutdown() {
    STOP.store(true, Release);
}
