//! This process's queued work on one device, seen through CUDA events: the scheduler's
//! [`Work`]. The scheduler admits every contended launch (so the queue is bounded launch by
//! launch), but only a sample of launches carries events, because a pair of event records per
//! launch is most of what a contended launch would cost:
//!
//! - a **fence** (an event recorded after a launch) goes on about one launch in [`FENCE_NS`] of
//!   estimated GPU work (at most [`FENCE_MAX`] launches apart), on every graph replay, on the
//!   first launch after a change of stream, and on every launch while the scheduler needs
//!   launches counted ([`Work::track_each`]); it completes when the launches before it on its
//!   stream have, so the ring of fences is the process's queue as the driver reports it;
//! - a fence is also **measured** (an event before the launch as well), which teaches the
//!   estimate (per kernel, and per graph executable; [`Events::learn`]);
//! - the launches between fences (the **run**) cost no driver call: their GPU time is their
//!   estimate, and a holder that must know when they complete (the hand-over) fences the run on
//!   the stream it is launching on. A run left on a stream the process stopped using is
//!   counted by its estimate only (recording on a stream the program may have destroyed is not
//!   safe), so what an unmeasured launch can cost is bounded by one fence interval per stream.
//!
//! Events are created in the launching context and recycled; an event whose context was
//! destroyed answers an error, which counts as completed, so nothing waits on it.

use core::ptr::null_mut;

use gpuslice_abi::*;
use gpuslice_sched::{self as sched, Work};

use super::Kind;
use crate::real;

mod work;

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
/// Estimated GPU work between two fences, at most.
pub(super) const FENCE_NS: u64 = 500_000;
/// Launches between two fences, at most (tiny kernels: the estimate keeps adapting).
const FENCE_MAX: u32 = 128;
/// How often the oldest fence is asked about before its estimated end (each is a driver call).
const POLL_NS: u64 = 20_000;

/// How a launch the scheduler admitted under an ordinary lease is tracked ([`Events::plan`]).
#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Track {
    /// One more launch of the run: no event.
    Run,
    /// Events before and after it: a fence that measures the launch.
    Measure,
}

/// One fence in flight: the event after it (and before it, when measured), the launches it
/// covers (itself and the run before it on its stream), and when they are estimated to complete.
#[derive(Clone, Copy)]
struct Entry {
    start: CUevent,
    end: CUevent,
    est: u64,
    est_end: u64,
    launches: u32,
    kind: Kind,
}

/// This process's queued work on one device, seen through events (the scheduler's [`Work`]).
pub(super) struct Events {
    ring: [Entry; RING],
    head: usize,
    len: usize,
    /// Spare events (recycled, so the launch path does not create one each time).
    spare: Vec<CUevent>,
    /// Measured GPU time of a kernel launch (moving average), and whether it was ever measured
    /// (until then every fence measures).
    kernel_ns: u64,
    learned: bool,
    /// The least recent measurement of a kernel launch ([`sched::least_of`]): its time when no
    /// other context's work interleaved with it.
    kernel_least_ns: u64,
    /// Measured GPU time of graph replays, per executable: the average and the least.
    graphs: [(CUgraphExec, u64, u64); GRAPHS],
    graph_next: usize,
    /// Estimate of the launch being admitted, and its least recent measurement.
    pub(super) next: u64,
    pub(super) next_least: u64,
    /// When the tracked work is expected to complete (ns; 0 when nothing is tracked).
    tail_end: u64,
    /// The run: launches since the last fence, on `run_stream`, estimated at `run_ns` in all
    /// and to complete at `run_end`.
    run_stream: CUstream,
    run_n: u32,
    run_ns: u64,
    run_end: u64,
    /// Launches in a fence interval now (about [`FENCE_NS`] of work, jittered so a periodic
    /// workload is not always sampled at the same kernel).
    fence_every: u32,
    jitter: u32,
    /// Estimated end of runs left on streams the process stopped using (never fenced).
    orphan_end: u64,
    /// The stream being admitted now (null outside an admission): the one stream a hand-over
    /// may record a fence on, since the program is launching on it.
    pub(super) current: CUstream,
    /// Until then every launch is fenced ([`Work::track_each`]).
    each_until: u64,
    /// When the oldest fence was last asked about.
    polled_at: u64,
    /// Estimated GPU time of the launches the fences in the ring cover.
    ring_ns: u64,
    /// When the last fence in flight was seen complete (the poll that retired it: an upper
    /// bound on its completion within the polling interval); 0 before any.
    done_seen: u64,
}

const NO_ENTRY: Entry = Entry {
    start: null_mut(),
    end: null_mut(),
    est: 0,
    est_end: 0,
    launches: 0,
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
            learned: false,
            kernel_least_ns: DEFAULT_EST_NS,
            graphs: [(null_mut(), 0, 0); GRAPHS],
            graph_next: 0,
            next: DEFAULT_EST_NS,
            next_least: DEFAULT_EST_NS,
            tail_end: 0,
            run_stream: null_mut(),
            run_n: 0,
            run_ns: 0,
            run_end: 0,
            fence_every: 1,
            jitter: 0x9e37_79b9,
            orphan_end: 0,
            current: null_mut(),
            each_until: 0,
            polled_at: 0,
            ring_ns: 0,
            done_seen: 0,
        }
    }

    /// How to track the next admitted launch of `kind` on `stream` (see the module doc).
    pub(super) fn plan(&self, stream: CUstream, kind: Kind, now: u64) -> Track {
        let est = self.estimate(kind);
        let fence = !matches!(kind, Kind::Kernel)
            || (self.run_n > 0 && stream != self.run_stream)
            || self.run_n + 1 >= self.fence_every
            || self.run_ns.saturating_add(est) >= FENCE_NS
            || now < self.each_until;
        if fence {
            Track::Measure
        } else {
            Track::Run
        }
    }

    /// Count a launch of the run (no event), made on `stream` at `now`.
    pub(super) fn add_to_run(&mut self, stream: CUstream, kind: Kind, now: u64) {
        let est = self.estimate(kind);
        self.tail_end = self.tail_end.max(now).saturating_add(est);
        self.run_stream = stream;
        self.run_n += 1;
        self.run_ns = self.run_ns.saturating_add(est);
        self.run_end = self.tail_end;
    }

    /// Take back a launch of the run that the driver refused.
    pub(super) fn remove_from_run(&mut self, kind: Kind) {
        if self.run_n > 0 {
            let est = self.estimate(kind);
            self.run_n -= 1;
            self.run_ns = self.run_ns.saturating_sub(est);
        }
    }

    /// The next fence interval, in launches: about [`FENCE_NS`] of work, ±25%.
    fn next_interval(&mut self) -> u32 {
        let n = (FENCE_NS / self.kernel_ns.max(1)).clamp(1, FENCE_MAX as u64) as u32;
        // xorshift32: cheap, and only has to break up periodic patterns.
        let mut x = self.jitter;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.jitter = x;
        let spread = n / 2;
        if spread == 0 {
            n
        } else {
            n - spread / 2 + x % (spread + 1)
        }
    }

    /// Estimated end of the launches no fence covers (0: none).
    fn unfenced_end(&self) -> u64 {
        let run = if self.run_n > 0 { self.run_end } else { 0 };
        run.max(self.orphan_end)
    }

    /// A launch's estimate and its least recent measurement.
    fn learned(&self, kind: Kind) -> (u64, u64) {
        match kind {
            Kind::Graph(x) => self
                .graphs
                .iter()
                .find(|g| g.0 == x)
                .map_or((DEFAULT_EST_NS, DEFAULT_EST_NS), |g| (g.1, g.2)),
            _ => (self.kernel_ns, self.kernel_least_ns),
        }
    }

    pub(super) fn estimate(&self, kind: Kind) -> u64 {
        self.learned(kind).0
    }

    /// A launch's least recent measurement (what the slice's queue bound counts).
    pub(super) fn least(&self, kind: Kind) -> u64 {
        self.learned(kind).1
    }

    /// Learn a measured launch's GPU time: a sample counts for a quarter (the first one of a
    /// kernel or a graph executable as it is). A sample may include other contexts' work that
    /// the engine time-sliced in (the previous holder's last kernel, a sibling of the slice):
    /// an estimate that runs high costs nothing, since a turn is charged at most its span,
    /// while one kept low would undercharge the slices whose kernels overlap; so nothing is
    /// discounted.
    pub(super) fn learn(&mut self, kind: Kind, ns: u64) {
        // In u128: a measurement (f32 ms, saturated into u64) may be huge; never overflow.
        let avg = |old: u64| ((3 * old as u128 + ns as u128) / 4) as u64;
        match kind {
            Kind::Graph(x) => match self.graphs.iter_mut().find(|g| g.0 == x) {
                Some(g) => {
                    g.1 = avg(g.1);
                    g.2 = sched::least_of(g.2, ns);
                }
                None => {
                    self.graphs[self.graph_next] = (x, ns, ns.max(1));
                    self.graph_next = (self.graph_next + 1) % GRAPHS;
                }
            },
            _ if !self.learned => {
                self.kernel_ns = ns.max(1);
                self.kernel_least_ns = ns.max(1);
                self.learned = true;
            }
            _ => {
                self.kernel_ns = avg(self.kernel_ns).max(1);
                self.kernel_least_ns = sched::least_of(self.kernel_least_ns, ns);
            }
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

    /// Fence a launch made on `stream` (after `start` was recorded, when measured): the fence
    /// covers it and the run before it on that stream; a run on another stream is left to its
    /// estimate.
    pub(super) fn push(&mut self, start: CUevent, stream: CUstream, kind: Kind) {
        if self.len == RING {
            self.wait_oldest();
        }
        let now = sched::now_ns();
        let est = self.estimate(kind);
        self.tail_end = self.tail_end.max(now).saturating_add(est);
        let (covered, covered_ns) = if self.run_n > 0 && self.run_stream == stream {
            (self.run_n, self.run_ns)
        } else {
            if self.run_n > 0 {
                self.orphan_end = self.orphan_end.max(self.run_end);
            }
            (0, 0)
        };
        self.run_n = 0;
        self.run_ns = 0;
        self.fence_every = self.next_interval();
        let end = self.record(stream);
        if end.is_null() {
            // Untracked, like a run left behind: counted by its estimate.
            self.orphan_end = self.orphan_end.max(self.tail_end);
            self.recycle(start);
            return;
        }
        self.ring_ns = self.ring_ns.saturating_add(covered_ns.saturating_add(est));
        self.ring[(self.head + self.len) % RING] = Entry {
            start,
            end,
            est: covered_ns.saturating_add(est),
            est_end: self.tail_end,
            launches: covered + 1,
            kind,
        };
        self.len += 1;
    }

    /// Fence the run if it is on the stream being admitted now (the hand-over then knows when
    /// it completes instead of trusting its estimate).
    fn fence_run(&mut self) {
        if self.run_n == 0 || self.current.is_null() || self.current != self.run_stream {
            return;
        }
        if self.len == RING {
            self.wait_oldest();
        }
        let end = self.record(self.current);
        if end.is_null() {
            return;
        }
        self.ring_ns = self.ring_ns.saturating_add(self.run_ns);
        self.ring[(self.head + self.len) % RING] = Entry {
            start: null_mut(),
            end,
            est: self.run_ns,
            est_end: self.run_end,
            launches: self.run_n,
            kind: Kind::Pass,
        };
        self.len += 1;
        self.run_n = 0;
        self.run_ns = 0;
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

    /// Retire completed fences from the front (learning the GPU time of measured launches);
    /// true if the oldest is still pending. Before its estimated end a fence is asked about at
    /// most every [`POLL_NS`] (the driver call would otherwise come with every launch).
    pub(super) fn poll(&mut self) -> bool {
        let now = sched::now_ns();
        let mut retired = false;
        while self.len > 0 {
            let e = self.ring[self.head];
            if e.est_end > now && now.saturating_sub(self.polled_at) < POLL_NS {
                break;
            }
            self.polled_at = now;
            if !Self::done(e.end) {
                break;
            }
            if !e.start.is_null() {
                if let Some(ms) = self.elapsed_when_done(e.start, e.end) {
                    self.learn(e.kind, (ms as f64 * 1e6) as u64);
                }
            }
            let e = self.pop_front();
            self.recycle(e.start);
            self.recycle(e.end);
            retired = true;
        }
        if retired && self.len == 0 {
            self.done_seen = now;
        }
        if retired {
            // What follows a completed fence needs at most its estimates from now: estimated
            // ends booked from estimates that ran long (an inflated sample) would otherwise
            // hold the holder back until the clock caught up with them.
            let bound = now.saturating_add(self.ring_ns).saturating_add(self.run_ns);
            self.tail_end = self.tail_end.min(bound);
            self.run_end = self.run_end.min(bound);
        }
        self.len > 0
    }

    /// Take the oldest fence off the ring.
    fn pop_front(&mut self) -> Entry {
        let e = self.ring[self.head];
        self.head = (self.head + 1) % RING;
        self.len -= 1;
        self.ring_ns = self.ring_ns.saturating_sub(e.est);
        e
    }

    /// Drop every tracked launch (their events go to the spares).
    pub(super) fn forget(&mut self) {
        while self.len > 0 {
            let e = self.pop_front();
            self.recycle(e.start);
            self.recycle(e.end);
        }
        self.tail_end = 0;
        self.run_n = 0;
        self.run_ns = 0;
        self.run_end = 0;
        self.orphan_end = 0;
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
                let e = self.pop_front();
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

#[cfg(test)]
mod tests;
