//! This process's queued work on one device, seen through CUDA events: the scheduler's
//! [`Work`]. A ring of the launches tracked (an event before and after each one the scheduler
//! admitted, and one event after each run of launches made on credit), the GPU time learned
//! from them (per kernel, and per graph executable), and the waits a holder makes for its own
//! queue. Events are created in the launching context and recycled; an event whose context was
//! destroyed answers an error, which counts as completed, so nothing waits on it.

use core::ptr::null_mut;

use gpuslice_abi::*;
use gpuslice_ledger::sched::{self, Work};

use super::Kind;
use crate::hooks::real;

/// Launches tracked per device; one more waits for the oldest to complete.
const RING: usize = 128;
/// What pending work counts for once its estimated end has passed.
const MIN_PENDING_NS: u64 = 10_000;
/// Graph executables whose replay time is remembered.
const GRAPHS: usize = 16;
/// Longest a holder waits for its own queued work before handing over anyway (a hung kernel
/// must not hang the process's other threads on our lock).
const DRAIN_LIMIT_NS: u64 = 1_000_000_000;
/// Estimate of a launch never measured yet.
const DEFAULT_EST_NS: u64 = 100_000;

/// One launch in flight: events before and after it, and its estimated GPU time.
#[derive(Clone, Copy)]
struct Entry {
    start: CUevent,
    end: CUevent,
    est: u64,
    kind: Kind,
}

/// This process's queued work on one device, seen through events (the scheduler's [`Work`]).
pub(super) struct Events {
    ring: [Entry; RING],
    head: usize,
    len: usize,
    /// Spare events (recycled, so the launch path does not create one each time).
    spare: Vec<CUevent>,
    /// Measured GPU time of a kernel launch (moving average).
    kernel_ns: u64,
    /// Measured GPU time of graph replays, per executable.
    graphs: [(CUgraphExec, u64); GRAPHS],
    graph_next: usize,
    /// Estimate of the launch being admitted.
    pub(super) next: u64,
    /// When the tracked work is expected to complete (ns; 0 when nothing is tracked).
    tail_end: u64,
}

const NO_ENTRY: Entry = Entry {
    start: null_mut(),
    end: null_mut(),
    est: 0,
    kind: Kind::Pass,
};

impl Events {
    pub(super) fn new() -> Events {
        Events {
            ring: [NO_ENTRY; RING],
            head: 0,
            len: 0,
            spare: Vec::with_capacity(2 * RING + 8),
            kernel_ns: DEFAULT_EST_NS,
            graphs: [(null_mut(), 0); GRAPHS],
            graph_next: 0,
            next: DEFAULT_EST_NS,
            tail_end: 0,
        }
    }

    pub(super) fn estimate(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Graph(x) => self
                .graphs
                .iter()
                .find(|g| g.0 == x)
                .map_or(DEFAULT_EST_NS, |g| g.1),
            _ => self.kernel_ns,
        }
    }

    pub(super) fn learn(&mut self, kind: Kind, ns: u64) {
        // In u128: a measurement (f32 ms, saturated into u64) may be huge; never overflow.
        let avg = |old: u64| {
            if old == 0 {
                ns
            } else {
                ((3 * old as u128 + ns as u128) / 4) as u64
            }
        };
        match kind {
            Kind::Graph(x) => match self.graphs.iter_mut().find(|g| g.0 == x) {
                Some(g) => g.1 = avg(g.1),
                None => {
                    self.graphs[self.graph_next] = (x, ns);
                    self.graph_next = (self.graph_next + 1) % GRAPHS;
                }
            },
            _ => self.kernel_ns = avg(self.kernel_ns),
        }
    }

    /// A spare event, or a new one in the current context (null if that fails).
    pub(super) fn take(&mut self) -> CUevent {
        if let Some(e) = self.spare.pop() {
            return e;
        }
        let Some(f) = real::cuEventCreate() else {
            return null_mut();
        };
        let mut e: CUevent = null_mut();
        // SAFETY: real driver function, valid out-pointer.
        if unsafe { f(&mut e, CU_EVENT_DEFAULT) } != CUDA_SUCCESS {
            return null_mut();
        }
        e
    }

    pub(super) fn recycle(&mut self, e: CUevent) {
        if e.is_null() {
            return;
        }
        if self.spare.len() < self.spare.capacity() {
            self.spare.push(e);
        } else if let Some(f) = real::cuEventDestroy_v2() {
            // SAFETY: an event we created and no longer reference.
            unsafe { f(e) };
        }
    }

    fn record_into(&mut self, e: CUevent, stream: CUstream) -> bool {
        let Some(f) = real::cuEventRecord() else {
            return false;
        };
        // SAFETY: real driver function on our event and the caller's stream.
        unsafe { f(e, stream) == CUDA_SUCCESS }
    }

    /// Record a fresh event on `stream` (null when that fails: the launch is then tracked by
    /// its end event alone).
    pub(super) fn record(&mut self, stream: CUstream) -> CUevent {
        let e = self.take();
        if !e.is_null() && !self.record_into(e, stream) {
            self.recycle(e);
            return null_mut();
        }
        e
    }

    /// Track a launch made after `start` was recorded.
    pub(super) fn push(&mut self, start: CUevent, stream: CUstream, kind: Kind) {
        if self.len == RING {
            self.wait_oldest();
        }
        let end = self.record(stream);
        if end.is_null() {
            self.recycle(start);
            return;
        }
        let est = self.estimate(kind);
        self.tail_end = self.tail_end.max(sched::now_ns()).saturating_add(est);
        self.ring[(self.head + self.len) % RING] = Entry {
            start,
            end,
            est,
            kind,
        };
        self.len += 1;
    }

    /// Whether `e` completed (an error, e.g. its context is gone, counts as completed).
    pub(super) fn done(e: CUevent) -> bool {
        let Some(f) = real::cuEventQuery() else {
            return true;
        };
        // SAFETY: real driver function on our event.
        unsafe { f(e) != CUDA_ERROR_NOT_READY }
    }

    /// ms between two completed events; None while `end` is pending or on error.
    pub(super) fn elapsed_when_done(&self, start: CUevent, end: CUevent) -> Option<f32> {
        let f = real::cuEventElapsedTime()?;
        let mut ms = 0f32;
        // SAFETY: real driver function on our events, valid out-pointer.
        (unsafe { f(&mut ms, start, end) } == CUDA_SUCCESS && ms >= 0.0).then_some(ms)
    }

    /// Retire completed launches from the front (learning their GPU time); true if the oldest
    /// is still pending.
    pub(super) fn poll(&mut self) -> bool {
        while self.len > 0 {
            let e = self.ring[self.head];
            if !Self::done(e.end) {
                return true;
            }
            if !e.start.is_null() {
                if let Some(ms) = self.elapsed_when_done(e.start, e.end) {
                    self.learn(e.kind, (ms as f64 * 1e6) as u64);
                }
            }
            self.recycle(e.start);
            self.recycle(e.end);
            self.head = (self.head + 1) % RING;
            self.len -= 1;
        }
        false
    }

    /// Track launches made without events (on credit) by one event recorded after them on
    /// `stream`, estimated at `ns` in all.
    pub(super) fn push_marker(&mut self, stream: CUstream, ns: u64) {
        if self.len == RING {
            self.wait_oldest();
        }
        let end = self.record(stream);
        if end.is_null() {
            return;
        }
        self.tail_end = self.tail_end.max(sched::now_ns()).saturating_add(ns);
        self.ring[(self.head + self.len) % RING] = Entry {
            start: null_mut(),
            end,
            est: ns,
            kind: Kind::Credit,
        };
        self.len += 1;
    }

    /// Drop every tracked launch (their events go to the spares).
    pub(super) fn forget(&mut self) {
        while self.len > 0 {
            let e = self.ring[self.head];
            self.head = (self.head + 1) % RING;
            self.len -= 1;
            self.recycle(e.start);
            self.recycle(e.end);
        }
        self.tail_end = 0;
    }

    /// Destroy the spare events (their context is going away).
    pub(super) fn destroy_spares(&mut self) {
        let Some(f) = real::cuEventDestroy_v2() else {
            self.spare.clear();
            return;
        };
        for e in self.spare.drain(..) {
            // SAFETY: an event we created and no longer reference.
            unsafe { f(e) };
        }
    }

    /// Sleep (never spin) until the oldest launch completes.
    fn wait_oldest(&mut self) {
        let t0 = sched::now_ns();
        while self.poll() && self.len == RING {
            if sched::now_ns().saturating_sub(t0) > DRAIN_LIMIT_NS {
                // Give up on it: forget the oldest rather than block forever.
                let e = self.ring[self.head];
                self.head = (self.head + 1) % RING;
                self.len -= 1;
                self.recycle(e.start);
                self.recycle(e.end);
                return;
            }
            nap(self.ring[self.head].est);
        }
    }
}

/// Sleep a fraction of `est_ns` (bounded: short enough to notice completion promptly, long
/// enough not to burn a CPU).
fn nap(est_ns: u64) {
    let ns = (est_ns / 4).clamp(20_000, 1_000_000);
    std::thread::sleep(std::time::Duration::from_nanos(ns));
}

impl Work for Events {
    fn outstanding_ns(&mut self) -> u64 {
        if !self.poll() {
            self.tail_end = 0;
            return 0;
        }
        // Pending but overdue by the estimate: still something, so a holder keeps waiting.
        self.tail_end
            .saturating_sub(sched::now_ns())
            .max(MIN_PENDING_NS)
    }

    fn wait_below(&mut self, ns: u64) -> u64 {
        let t0 = sched::now_ns();
        loop {
            if !self.poll() {
                self.tail_end = 0;
                return 0;
            }
            let now = sched::now_ns();
            let left = self.tail_end.saturating_sub(now);
            // Past its estimated end the rest is unknown: wait for it to complete.
            if (left > 0 && left <= ns) || now.saturating_sub(t0) > DRAIN_LIMIT_NS {
                return left.max(MIN_PENDING_NS);
            }
            let nap_ns = if left > ns {
                left - ns
            } else {
                MIN_PENDING_NS * 2
            };
            std::thread::sleep(std::time::Duration::from_nanos(nap_ns.min(1_000_000)));
        }
    }

    fn next_ns(&mut self) -> u64 {
        self.next
    }

    fn pending(&mut self) -> usize {
        self.poll();
        self.len
    }

    fn wait_pending(&mut self, n: usize) {
        let t0 = sched::now_ns();
        while self.poll() && self.len > n {
            if sched::now_ns().saturating_sub(t0) > DRAIN_LIMIT_NS {
                return;
            }
            nap(self.ring[self.head].est);
        }
    }

    fn drain(&mut self) -> u64 {
        let t0 = sched::now_ns();
        while self.poll() {
            if sched::now_ns().saturating_sub(t0) > DRAIN_LIMIT_NS {
                break;
            }
            let left = self.outstanding_ns();
            nap(left);
        }
        sched::now_ns()
    }
}
