//! The execution model: streams, events, and one executor thread per (process, device) that
//! runs the queued work of every stream of that device on the node-wide execution engine.
//!
//! Work is asynchronous. The executor keeps a *simulated cursor*: a kernel starts at
//! max(cursor, its submission, the moment this process got the engine) and ends `duration`
//! later; completions and event timestamps are those simulated end times, and waiters sleep
//! until real time reaches them. The executor plans at most [`HORIZON_NS`] ahead of real time
//! and only sleeps between batches, so short kernels stay exact despite sleep overshoot. While
//! the process holds the engine uncontended with nothing queued, a launch plans itself in the
//! caller's thread (`Stream::plan_now`): no thread hand-off per kernel, so 20 µs kernels run
//! back to back.
//!
//! The engine is one per device for the whole node: a token in [`crate::shared::DevState`]
//! (`owner`). A holder keeps it while it has kernels; when another process waits, the holder
//! hands it on round-robin after a time slice, mid-kernel if need be (the kernel resumes later
//! with its remaining time), like the hardware's time-slice scheduler. Waiters sleep on a
//! shared futex and check the holder is alive, so a SIGKILLed holder never hangs anyone.

use crate::graph::{self, Graph};
use crate::runtime::{rt_unchecked, Ctx, CuResult};
use crate::shared::{self, futex_wait, futex_wake, now_ns, sleep_until, DevState, MAX_PROCS};
use gpuslice_abi::*;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Condvar, Mutex, MutexGuard};

/// How far ahead of real time an executor plans kernels.
pub const HORIZON_NS: u64 = 1_000_000;
/// A waiting executor holding planned work wakes this long before the work ends to plan what
/// arrived meanwhile (so submissions need not wake it one by one).
const WAKE_MARGIN_NS: u64 = 300_000;
/// A holder that shows no sign of life for this long loses the engine to a waiter.
const STALL_NS: u64 = 200_000_000;
/// Pending items per stream before a launch blocks, like the driver's push buffer.
pub const QUEUE_DEPTH: usize = 1024;

static STOP: AtomicBool = AtomicBool::new(false);

/// `cuStreamAddCallback`'s callback type.
pub type StreamCallback = Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>;

/// A 3D copy between linear byte ranges with pitches.
#[derive(Clone, Copy, Debug)]
pub struct Copy3D {
    pub dst: usize,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub src: usize,
    pub src_pitch: usize,
    pub src_height: usize,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

impl Copy3D {
    /// Move the bytes.
    ///
    /// # Safety
    /// Both ranges must be mapped for the whole extent.
    pub unsafe fn run(&self) {
        for z in 0..self.depth {
            for y in 0..self.height {
                let s = self.src + (z * self.src_height + y) * self.src_pitch;
                let d = self.dst + (z * self.dst_height + y) * self.dst_pitch;
                // SAFETY: the caller guarantees both ranges; memmove tolerates overlap.
                unsafe { std::ptr::copy(s as *const u8, d as *mut u8, self.width) };
            }
        }
    }

    /// A flat copy of `len` bytes.
    pub fn flat(dst: usize, src: usize, len: usize) -> Copy3D {
        Copy3D {
            dst,
            dst_pitch: len,
            dst_height: 1,
            src,
            src_pitch: len,
            src_height: 1,
            width: len,
            height: 1,
            depth: 1,
        }
    }
}

/// A memset of `height` rows of `width` elements of `elem` bytes, `pitch` bytes apart.
#[derive(Clone, Copy, Debug)]
pub struct Memset {
    pub dst: usize,
    pub pitch: usize,
    pub width: usize,
    pub height: usize,
    pub elem: u8,
    pub value: u32,
}

impl Memset {
    /// Write the values.
    ///
    /// # Safety
    /// The range must be mapped.
    pub unsafe fn run(&self) {
        for y in 0..self.height {
            let row = self.dst + y * self.pitch;
            // SAFETY: the caller guarantees the range; the element writes are unaligned-safe.
            unsafe {
                match self.elem {
                    1 => std::ptr::write_bytes(row as *mut u8, self.value as u8, self.width),
                    2 => (0..self.width).for_each(|i| {
                        ((row + 2 * i) as *mut u16).write_unaligned(self.value as u16)
                    }),
                    _ => (0..self.width)
                        .for_each(|i| ((row + 4 * i) as *mut u32).write_unaligned(self.value)),
                }
            }
        }
    }
}

/// One unit of queued work.
#[derive(Clone, Debug)]
pub enum Op {
    /// A kernel taking this many ns of engine time.
    Kernel(u64),
    /// Record an event (its record generation).
    Record(&'static Event, u64),
    /// Wait until an event's record generation completes.
    Wait(&'static Event, u64),
    /// `cuLaunchHostFunc`.
    Host(unsafe extern "C" fn(*mut c_void), usize),
    /// `cuStreamAddCallback` (callback, stream handle, user data).
    Callback(
        unsafe extern "C" fn(CUstream, CUresult, *mut c_void),
        usize,
        usize,
    ),
    /// Copy bytes.
    Copy(Copy3D),
    /// Set bytes.
    Set(Memset),
    /// `cuMemFreeAsync` reaching the stream.
    Free(u64),
}

// SAFETY: the raw addresses inside are plain integers or `'static` references to Sync
// structures; host functions are called on the executor thread as CUDA calls them on its own.
unsafe impl Send for Op {}

impl Op {
    fn touches_memory(&self) -> bool {
        matches!(self, Op::Copy(_) | Op::Set(_) | Op::Free(_))
    }
}

struct Item {
    op: Op,
    seq: u64,
    submit: u64,
    rem: u64,
}

struct Queue {
    ctx: usize,
    items: VecDeque<Item>,
    submitted: u64,
    completed: u64,
    last_end: u64,
    live: bool,
}

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
    phys: usize,
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

    fn new_queue(&self, ctx: usize) -> usize {
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
                        if ev.done_gen.load(Acquire) < gen {
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
                        acquire(node.state, dev, self.phys, me);
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
                    dev.beat.store(now, Relaxed);
                    if dev.owner.load(Acquire) != me as u32 + 1 {
                        // Taken from us while we were stopped (see `acquire`): queue again.
                        g.held = false;
                        continue;
                    }
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
                    ev.ts.store(start, Release);
                    ev.done_gen.fetch_max(gen, AcqRel);
                    self.complete(&mut g, qi, start);
                }
                Op::Wait(ev, _) => {
                    g.cursor = start.max(ev.ts.load(Acquire));
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

fn others_want(state: &shared::State, phys: usize, me: usize) -> bool {
    let now = now_ms();
    state
        .procs
        .iter()
        .enumerate()
        .any(|(j, p)| j != me && fresh(p.want[phys].load(Relaxed), now))
}

/// Coarse real time for `want` stamps: ms, never 0.
fn now_ms() -> u32 {
    ((now_ns() / 1_000_000) as u32).max(1)
}

/// Whether a `want` stamp is from a waiter that is still waiting and running.
fn fresh(want: u32, now: u32) -> bool {
    want != 0 && now.wrapping_sub(want) < 100
}

fn acquire(state: &shared::State, dev: &DevState, phys: usize, me: usize) {
    let mine = me as u32 + 1;
    let mut checked = now_ns();
    loop {
        // Refreshed at every pass (at least every 10 ms): a waiter that stops refreshing
        // (SIGSTOP) is passed over at hand-offs.
        state.procs[me].want[phys].store(now_ms(), Release);
        let seq = dev.seq.load(Acquire);
        let o = dev.owner.load(Acquire);
        if o == mine || (o == 0 && dev.owner.compare_exchange(0, mine, AcqRel, Acquire).is_ok()) {
            break;
        }
        if o == 0 {
            continue;
        }
        let now = now_ns();
        if now - checked > 10_000_000 {
            checked = now;
            if !shared::slot_alive(state, o as usize - 1) {
                shared::reap(state);
                continue;
            }
            // A holder that has not planned anything for this long is stopped (SIGSTOP, a
            // debugger): the hardware would preempt it, so take the engine over.
            let beat = dev.beat.load(Relaxed);
            if now.saturating_sub(beat) > STALL_NS
                && dev.owner.compare_exchange(o, mine, AcqRel, Acquire).is_ok()
            {
                break;
            }
        }
        futex_wait(&dev.seq, seq, 10_000_000);
    }
    dev.beat.store(now_ns(), Relaxed);
    state.procs[me].want[phys].store(0, Release);
}

fn release(state: &shared::State, dev: &DevState, phys: usize, me: usize, cursor: u64) {
    dev.free_at.fetch_max(cursor, AcqRel);
    let now = now_ms();
    let next = (1..MAX_PROCS)
        .map(|k| (me + k) % MAX_PROCS)
        .find(|&j| fresh(state.procs[j].want[phys].load(Acquire), now));
    let to = next.map_or(0, |j| j as u32 + 1);
    let _ = dev
        .owner
        .compare_exchange(me as u32 + 1, to, AcqRel, Relaxed);
    dev.seq.fetch_add(1, Release);
    futex_wake(&dev.seq);
}

/// Stop executors from taking the engine again (process exit).
pub fn shutdown() {
    STOP.store(true, Release);
}

const STREAM_MAGIC: u64 = 0x5732_EA40_0000_FA4E;

/// A stream. Handles are pointers to leaked `Stream`s.
#[repr(C)]
pub struct Stream {
    magic: u64,
    /// Its context.
    pub ctx: &'static Ctx,
    /// The executor of its device.
    pub exec: &'static Executor,
    id: usize,
    /// Creation flags.
    pub flags: u32,
    /// Priority.
    pub priority: i32,
    /// Whether it is a legacy default stream (which cannot capture).
    pub legacy: bool,
    capturing: AtomicBool,
    capture: Mutex<Option<Capture>>,
    destroyed: AtomicBool,
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for Stream {
    const MAGIC: u64 = STREAM_MAGIC;
}

struct Capture {
    graph: &'static Graph,
    id: u64,
    invalid: bool,
}

static CAPTURE_IDS: AtomicU64 = AtomicU64::new(1);

impl Stream {
    /// A new stream of `ctx`.
    pub fn new(ctx: &'static Ctx, flags: u32, priority: i32, legacy: bool) -> &'static Stream {
        let exec = ctx.device().exec;
        let id = exec.new_queue(ctx as *const Ctx as usize);
        Box::leak(Box::new(Stream {
            magic: STREAM_MAGIC,
            ctx,
            exec,
            id,
            flags,
            priority,
            legacy,
            capturing: AtomicBool::new(false),
            capture: Mutex::new(None),
            destroyed: AtomicBool::new(false),
        }))
    }

    /// The handle of this stream (the legacy default stream's is `CU_STREAM_LEGACY`).
    pub fn handle(&'static self) -> CUstream {
        self as *const Stream as CUstream
    }

    /// The stream a handle names: null/0x1/0x2 are the default streams of the current context
    /// (null is the per-thread one for `_ptsz` entry points).
    pub fn resolve(h: CUstream, per_thread: bool) -> CuResult<&'static Stream> {
        let v = h as usize;
        if v == 0 || v == CU_STREAM_LEGACY || v == CU_STREAM_PER_THREAD {
            let c = crate::runtime::cur_ctx()?;
            return Ok(if v == CU_STREAM_PER_THREAD || (v == 0 && per_thread) {
                c.thread_stream()
            } else {
                c.legacy_stream()
            });
        }
        crate::runtime::rt()?;
        let s = crate::handle::resolve::<Stream>(h as *const c_void)
            .filter(|s| !s.destroyed.load(Acquire))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if !s.ctx.active.load(Acquire) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        Ok(s)
    }

    /// Whether it is capturing into a graph.
    pub fn is_capturing(&self) -> bool {
        self.capturing.load(Acquire)
    }

    /// Queue `op` (or record it into the graph being captured).
    pub fn submit(&'static self, op: Op) -> CuResult<()> {
        if self.is_capturing() {
            let mut c = self.capture.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = c.as_mut() {
                graph::add_op(c.graph, op);
                return Ok(());
            }
        }
        let ex = self.exec;
        let rem = match op {
            Op::Kernel(ns) => ns,
            _ => 0,
        };
        ex.ensure_thread()?;
        if op.touches_memory() {
            ex.pending_mem.fetch_add(1, AcqRel);
        }
        let mut g = ex.lock();
        while g.queues[self.id].items.len() >= QUEUE_DEPTH {
            g = ex.done.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g.seq += 1;
        let seq = g.seq;
        if self.plan_now(&mut g, &op) {
            return Ok(());
        }
        let q = &mut g.queues[self.id];
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
            ex.work.notify_one();
        }
        Ok(())
    }

    /// While this process holds the engine uncontended and nothing is queued, a short kernel
    /// or an event record is planned right here (the executor would plan it identically):
    /// no thread hand-off per launch, so tiny kernels cost little host time.
    fn plan_now(&self, g: &mut ExecState, op: &Op) -> bool {
        let ex = self.exec;
        let now = now_ns();
        if !g.held || g.cursor > now + HORIZON_NS || g.queues.iter().any(|q| !q.items.is_empty()) {
            return false;
        }
        let node = rt_unchecked().node;
        let start = g.cursor.max(now);
        match *op {
            Op::Kernel(ns) if ns <= ex.slice_ns => {
                let dev = &node.state.dev[ex.phys];
                if dev.owner.load(Acquire) != node.slot as u32 + 1
                    || others_want(node.state, ex.phys, node.slot)
                {
                    return false;
                }
                dev.beat.store(now, Relaxed);
                node.charge(ex.phys, ns, start);
                g.slice_start = start;
                g.cursor = start + ns;
            }
            Op::Record(ev, gen) => {
                g.cursor = start;
                ev.ts.store(start, Release);
                ev.done_gen.fetch_max(gen, AcqRel);
                if g.sync_waiters > 0 {
                    ex.done.notify_all();
                }
            }
            _ => return false,
        }
        let end = g.cursor;
        let q = &mut g.queues[self.id];
        q.submitted += 1;
        q.completed += 1;
        q.last_end = end;
        true
    }

    /// Wait until everything queued so far has completed; returns the simulated end time.
    fn wait_idle(&self) -> u64 {
        let ex = self.exec;
        let mut g = ex.lock();
        let target = g.queues[self.id].submitted;
        while g.queues[self.id].completed < target {
            ex.work.notify_one();
            g.sync_waiters += 1;
            g = ex.done.wait(g).unwrap_or_else(|e| e.into_inner());
            g.sync_waiters -= 1;
        }
        let end = g.queues[self.id].last_end;
        drop(g);
        sleep_until(end);
        end
    }

    /// `cuStreamSynchronize`.
    pub fn synchronize(&'static self) -> CuResult<()> {
        if self.is_capturing() {
            self.invalidate_capture();
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        self.wait_idle();
        crate::mem::after_sync(self.ctx.dev);
        Ok(())
    }

    /// `cuStreamQuery`.
    pub fn query(&self) -> CuResult<()> {
        if self.is_capturing() {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let g = self.exec.lock();
        let q = &g.queues[self.id];
        if q.completed == q.submitted && now_ns() >= q.last_end {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    }

    /// `cuStreamDestroy`: pending work still runs.
    pub fn destroy(&'static self) -> CuResult<()> {
        if self.legacy {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        self.destroyed.store(true, Release);
        let mut g = self.exec.lock();
        g.queues[self.id].live = false;
        if g.queues[self.id].items.is_empty() {
            g.free_ids.push(self.id);
        }
        Ok(())
    }

    /// `cuStreamBeginCapture`.
    pub fn begin_capture(&'static self) -> CuResult<()> {
        if self.legacy {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let mut c = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        if c.is_some() {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        *c = Some(Capture {
            graph: Graph::new(),
            id: CAPTURE_IDS.fetch_add(1, Relaxed),
            invalid: false,
        });
        self.capturing.store(true, Release);
        Ok(())
    }

    /// `cuStreamEndCapture`.
    pub fn end_capture(&'static self) -> CuResult<&'static Graph> {
        let mut c = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        let cap = c.take().ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        self.capturing.store(false, Release);
        if cap.invalid {
            return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        Ok(cap.graph)
    }

    fn invalidate_capture(&self) {
        if let Some(c) = self
            .capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            c.invalid = true;
        }
    }

    /// (status, id, graph) for `cuStreamGetCaptureInfo`.
    pub fn capture_info(&self) -> (CUstreamCaptureStatus, u64, CUgraph) {
        match self
            .capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            None => (CU_STREAM_CAPTURE_STATUS_NONE, 0, std::ptr::null_mut()),
            Some(c) if c.invalid => (CU_STREAM_CAPTURE_STATUS_INVALIDATED, c.id, c.graph.handle()),
            Some(c) => (CU_STREAM_CAPTURE_STATUS_ACTIVE, c.id, c.graph.handle()),
        }
    }

    /// The graph being captured, if any (for memory nodes made by cuMemAllocAsync).
    pub fn capture_graph(&self) -> Option<&'static Graph> {
        self.capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|c| c.graph)
    }
}

/// `cuCtxSynchronize`: wait for every stream of `c`.
pub fn ctx_synchronize(c: &'static Ctx) -> CuResult<()> {
    let ex = c.device().exec;
    let me = c as *const Ctx as usize;
    let mut g = ex.lock();
    let targets: Vec<(usize, u64)> = g
        .queues
        .iter()
        .enumerate()
        .filter(|(_, q)| q.ctx == me)
        .map(|(i, q)| (i, q.submitted))
        .collect();
    let mut end = 0;
    for (i, t) in targets {
        while g.queues[i].completed < t && g.queues[i].ctx == me {
            ex.work.notify_one();
            g.sync_waiters += 1;
            g = ex.done.wait(g).unwrap_or_else(|e| e.into_inner());
            g.sync_waiters -= 1;
        }
        end = end.max(g.queues[i].last_end);
    }
    drop(g);
    sleep_until(end);
    crate::mem::after_sync(c.dev);
    Ok(())
}

const EVENT_MAGIC: u64 = 0xE7E7_0000_0000_FA4E;

/// An event. Handles are pointers to leaked `Event`s, recycled through a free list.
#[derive(Debug)]
#[repr(C)]
pub struct Event {
    magic: u64,
    /// Creation flags.
    pub flags: AtomicU64,
    gen: AtomicU64,
    done_gen: AtomicU64,
    ts: AtomicU64,
    exec: AtomicPtr<Executor>,
    destroyed: AtomicBool,
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for Event {
    const MAGIC: u64 = EVENT_MAGIC;
}

static FREE_EVENTS: Mutex<Vec<&'static Event>> = Mutex::new(Vec::new());

impl Event {
    /// `cuEventCreate`.
    pub fn create(flags: u32) -> &'static Event {
        if let Some(e) = FREE_EVENTS.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            e.flags.store(flags as u64, Relaxed);
            e.gen.store(0, Relaxed);
            e.done_gen.store(0, Relaxed);
            e.ts.store(0, Relaxed);
            e.destroyed.store(false, Release);
            return e;
        }
        Box::leak(Box::new(Event {
            magic: EVENT_MAGIC,
            flags: AtomicU64::new(flags as u64),
            gen: AtomicU64::new(0),
            done_gen: AtomicU64::new(0),
            ts: AtomicU64::new(0),
            exec: AtomicPtr::new(std::ptr::null_mut()),
            destroyed: AtomicBool::new(false),
        }))
    }

    /// The event a handle names.
    pub fn resolve(h: CUevent) -> CuResult<&'static Event> {
        crate::runtime::rt()?;
        crate::handle::resolve::<Event>(h as *const c_void)
            .filter(|e| !e.destroyed.load(Acquire))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// Its handle.
    pub fn handle(&'static self) -> CUevent {
        self as *const Event as CUevent
    }

    /// `cuEventRecord`.
    pub fn record(&'static self, s: &'static Stream) -> CuResult<()> {
        if s.is_capturing() {
            return Ok(());
        }
        let gen = self.gen.fetch_add(1, AcqRel) + 1;
        self.exec
            .store(s.exec as *const Executor as *mut Executor, Release);
        s.submit(Op::Record(self, gen))
    }

    /// `cuStreamWaitEvent`.
    pub fn wait_on(&'static self, s: &'static Stream) -> CuResult<()> {
        let gen = self.gen.load(Acquire);
        if gen == 0 || s.is_capturing() {
            return Ok(());
        }
        s.submit(Op::Wait(self, gen))
    }

    fn complete(&self) -> bool {
        let gen = self.gen.load(Acquire);
        gen == 0 || (self.done_gen.load(Acquire) >= gen && now_ns() >= self.ts.load(Acquire))
    }

    /// `cuEventQuery`.
    pub fn query(&self) -> CuResult<()> {
        if self.complete() {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    }

    /// `cuEventSynchronize`.
    pub fn synchronize(&self) -> CuResult<()> {
        let gen = self.gen.load(Acquire);
        if gen == 0 {
            return Ok(());
        }
        let ex = self.exec.load(Acquire);
        // Usually the executor has planned the record already: no lock needed.
        if !ex.is_null() && self.done_gen.load(Acquire) < gen {
            // SAFETY: executors are leaked, never freed.
            let ex = unsafe { &*ex };
            let mut g = ex.lock();
            while self.done_gen.load(Acquire) < gen {
                ex.work.notify_one();
                g.sync_waiters += 1;
                g = ex.done.wait(g).unwrap_or_else(|e| e.into_inner());
                g.sync_waiters -= 1;
            }
        }
        sleep_until(self.ts.load(Acquire));
        if !ex.is_null() {
            // SAFETY: executors are leaked, never freed.
            crate::mem::after_sync_phys(unsafe { &*ex }.phys);
        }
        Ok(())
    }

    /// `cuEventElapsedTime`, in ms.
    pub fn elapsed(start: &Event, end: &Event) -> CuResult<f32> {
        if (start.flags.load(Relaxed) | end.flags.load(Relaxed)) & CU_EVENT_DISABLE_TIMING as u64
            != 0
        {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if start.gen.load(Acquire) == 0 || end.gen.load(Acquire) == 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if !start.complete() || !end.complete() {
            return Err(CUDA_ERROR_NOT_READY);
        }
        let (a, b) = (start.ts.load(Acquire) as i64, end.ts.load(Acquire) as i64);
        Ok((b - a) as f32 / 1e6)
    }

    /// `cuEventDestroy`.
    pub fn destroy(&'static self) {
        // Recycle only once its pending records ran, so the executor never touches a reused one.
        let _ = self.synchronize();
        self.destroyed.store(true, Release);
        FREE_EVENTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self);
    }
}
