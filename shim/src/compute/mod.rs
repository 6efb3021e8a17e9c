//! Compute shares: the gate every kernel and graph launch passes through.
//!
//! The launch hooks call [`before_launch`] / [`before_graph_launch`], make the real launch, then
//! call [`after_launch`]. The scheduling itself (leases, virtual time, caps, takeover of dead
//! holders) is `gpuslice_sched`; this module is the process's side of it:
//!
//! - one [`DevGate`] per device ordinal: the ledger's lease word for that device, the solo word
//!   of this process's slice, and (behind a process-local mutex, off the fast path) the
//!   scheduler [`Client`] and the [`Events`] that track this process's queued work;
//! - **fast path**: when the slice holds a solo lease (alone and uncapped on the device) a launch
//!   costs one load of the ledger's lease word, plus process-local loads and a countdown that,
//!   every few ms of GPU work ([`SAMPLE_GPU_NS`]), takes the slow path once to keep
//!   `compute_used` current and to notice a launch on another device;
//! - **contended**: skip streams that are capturing (capture is never throttled: the replay
//!   is; the driver is asked only while some capture is in progress), ask the client for
//!   admission (it may sleep on the ledger's futex), and track the launch. Every contended
//!   launch is admitted on its own, so the queued work stays within the lease launch by launch,
//!   but only a sample carries events (`events/`): about one launch in
//!   [`events::FENCE_NS`] of estimated GPU work gets an event after it, which tells when the
//!   queue completes (the lease's holder drains it before handing over, so a deep asynchronous
//!   queue is paid for by whoever queued it), and an event before it, which measures the launch
//!   (the estimates that keep a lease on time and are charged for the turn). The other launches cost the current device's lookup (`cuCtxGetDevice`), a lock, a
//!   few loads and clock reads: no event, no capture query, no syscall.
//!
//! In node mode the lease word is the policy's (read-only here) and the client is
//! `sched::Granted`: the monitor grants the turns (`bind`, `binding`); everything else is the
//! same.
//!
//! `events/` is the process's queued work as the events show it (`events/work.rs`: the
//! scheduler's `Work`).

use core::ptr::null_mut;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Mutex;

use gpuslice_abi::*;
use gpuslice_sched::{self as sched, Client, Granted, Scheduler};

mod events;
use events::{Events, Track};
use gpuslice_ledger::tenants::LedgerTenants;

use crate::capturing::CAPTURES;
use crate::real;

/// Device ordinals this process can gate (the ledger's device count).
const MAX_ORDINALS: usize = gpuslice_ledger::MAX_DEVICES;
/// GPU time between two samples of the slow path while solo: the sampling period in launches is
/// this over the launch's measured time, so tiny kernels are sampled rarely (their launch rate
/// is high) and long ones often enough that `compute_used` stays current.
const SAMPLE_GPU_NS: u64 = 2_000_000;
/// Bounds of that period, in launches.
const SAMPLE_MIN: u32 = 4;
const SAMPLE_MAX: u32 = 4096;
/// What `before_*` hands to [`after_launch`].
pub struct Gate {
    gate: Option<&'static DevGate>,
    kind: Kind,
    /// Event recorded before the launch (null: none).
    start: CUevent,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// Not gated (capturing, unknown device, gpuslice not attached).
    Pass,
    /// Launched under a solo lease.
    Solo,
    /// Admitted by the scheduler, one more launch of the run (no event; see `events/`).
    Run,
    /// Admitted by the scheduler: fence it (`start` non-null: measure it too).
    Kernel,
    /// A graph replay admitted by the scheduler.
    Graph(CUgraphExec),
    /// A solo launch sampled for the statistics (of the kind inside).
    Probe(Unit),
}

/// What a probed solo launch was.
#[derive(Clone, Copy, PartialEq)]
enum Unit {
    Kernel,
    Graph(CUgraphExec),
}

impl Kind {
    fn unit(self) -> Unit {
        match self {
            Kind::Graph(x) => Unit::Graph(x),
            _ => Unit::Kernel,
        }
    }
}

impl Unit {
    fn kind(self) -> Kind {
        match self {
            Unit::Graph(x) => Kind::Graph(x),
            Unit::Kernel => Kind::Kernel,
        }
    }
}

const PASS: Gate = Gate {
    gate: None,
    kind: Kind::Pass,
    start: null_mut(),
};

/// This process's gate for one device ordinal.
struct DevGate {
    /// The ledger's lease word of the device (null: not bound yet, or not gated).
    lease: AtomicPtr<AtomicU64>,
    /// The lease word meaning "our slice is alone here".
    solo_word: AtomicU64,
    /// Solo launches since the last sample.
    solo_left: AtomicU32,
    /// The sampling period `solo_left` was last set to.
    solo_period: AtomicU32,
    /// 0 unbound, 1 bound, 2 never gated (no ledger, or not joined).
    state: AtomicU32,
    inner: Mutex<Option<Inner>>,
}

struct Inner {
    client: Scheduler<'static>,
    events: Events,
    /// Solo statistics: the start event of the last probe charged up to, the probe in flight
    /// (start, end, what, launches before it), and the launches since.
    anchor: CUevent,
    probe: Option<(CUevent, CUevent, Unit, u64)>,
    sampled: u64,
}

// SAFETY: the raw CUDA handles inside are process-wide driver handles, usable from any thread;
// access is serialised by the mutex.
unsafe impl Send for Inner {}

static GATES: [DevGate; MAX_ORDINALS] = [const {
    DevGate {
        lease: AtomicPtr::new(null_mut()),
        solo_word: AtomicU64::new(0),
        solo_left: AtomicU32::new(0),
        solo_period: AtomicU32::new(0),
        state: AtomicU32::new(0),
        inner: Mutex::new(None),
    }
}; MAX_ORDINALS];

/// The gate when the process has bound exactly one device (the common case): the fast path
/// then needs no driver call to find the device.
static SINGLE: AtomicPtr<DevGate> = AtomicPtr::new(null_mut());
/// Devices bound so far.
static BOUND: AtomicU32 = AtomicU32::new(0);

/// Called before a kernel launch on `stream`.
pub fn before_launch(stream: CUstream) -> Gate {
    before(stream, Kind::Kernel)
}

/// Called before a graph launch.
pub fn before_graph_launch(exec: CUgraphExec, stream: CUstream) -> Gate {
    before(stream, Kind::Graph(exec))
}

#[inline]
fn before(stream: CUstream, kind: Kind) -> Gate {
    let single = SINGLE.load(Relaxed);
    if !single.is_null() {
        // SAFETY: SINGLE only ever points into the static GATES.
        let g = unsafe { &*single };
        // SAFETY: a bound lease pointer points into the ledger mapping, mapped for the life of
        // the process.
        if let Some(lease) = unsafe { g.lease.load(Relaxed).as_ref() } {
            // Plain loads and stores, not locked adds: threads racing here only lose a count
            // (a statistic, or one launch of credit), and the fast path stays free of
            // read-modify-writes.
            let w = lease.load(Relaxed);
            let left = g.solo_left.load(Relaxed);
            if w == g.solo_word.load(Relaxed) && left > 0 {
                g.solo_left.store(left - 1, Relaxed);
                return Gate {
                    gate: Some(g),
                    kind: Kind::Solo,
                    start: null_mut(),
                };
            }
        }
    }
    slow_before(stream, kind)
}

#[cold]
fn slow_before(stream: CUstream, kind: Kind) -> Gate {
    let Some(g) = current_gate() else { return PASS };
    // Solo on a device other than the single one: same countdown as the fast path.
    // SAFETY: a bound gate's lease pointer points into the ledger mapping (process lifetime).
    if let Some(lease) = unsafe { g.lease.load(Relaxed).as_ref() } {
        let left = g.solo_left.load(Relaxed);
        if lease.load(Relaxed) == g.solo_word.load(Relaxed) && left > 0 {
            g.solo_left.store(left - 1, Relaxed);
            return Gate {
                gate: Some(g),
                kind: Kind::Solo,
                start: null_mut(),
            };
        }
    }
    // Only while a capture is in progress can the stream be capturing (the capture hooks count
    // them): otherwise no driver call.
    if CAPTURES.load(Acquire) > 0 && capturing(stream) {
        return PASS;
    }
    let mut guard = match g.inner.lock() {
        Ok(i) => i,
        Err(p) => p.into_inner(), // a panic elsewhere left it: the state is still usable
    };
    let Some(inner) = guard.as_mut() else {
        return PASS;
    };
    if inner.client.solo() {
        let start = inner.sample_solo(g, stream);
        return Gate {
            gate: Some(g),
            kind: if start.is_null() {
                Kind::Solo
            } else {
                Kind::Probe(kind.unit())
            },
            start,
        };
    }
    inner.events.next = inner.events.estimate(kind);
    inner.events.next_least = inner.events.least(kind);
    // The one stream a hand-over inside the admission may record a fence on.
    inner.events.current = stream;
    inner.client.acquire(&mut inner.events);
    inner.events.current = null_mut();
    if inner.client.solo() {
        return Gate {
            gate: Some(g),
            kind: Kind::Solo,
            start: null_mut(),
        };
    }
    let now = sched::now_ns();
    match inner.events.plan(stream, kind, now) {
        Track::Run => {
            inner.events.add_to_run(stream, kind, now);
            Gate {
                gate: Some(g),
                kind: Kind::Run,
                start: null_mut(),
            }
        }
        Track::Measure => Gate {
            gate: Some(g),
            kind,
            start: inner.events.record(stream),
        },
    }
}

/// Called after the launch returned `result`.
pub fn after_launch(gate: Gate, stream: CUstream, result: CUresult) {
    let Some(g) = gate.gate else { return };
    if matches!(gate.kind, Kind::Pass | Kind::Solo)
        || (gate.kind == Kind::Run && result == CUDA_SUCCESS)
    {
        return;
    }
    let mut guard = match g.inner.lock() {
        Ok(i) => i,
        Err(p) => p.into_inner(),
    };
    let Some(inner) = guard.as_mut() else { return };
    if gate.kind == Kind::Run {
        inner.events.remove_from_run(Kind::Kernel);
        return;
    }
    if result != CUDA_SUCCESS {
        inner.events.recycle(gate.start);
        return;
    }
    if let Kind::Probe(unit) = gate.kind {
        let end = inner.events.record(stream);
        if end.is_null() {
            inner.events.recycle(gate.start);
        } else {
            let new = (gate.start, end, unit, inner.sampled);
            if let Some((s, e, _, _)) = inner.probe.replace(new) {
                // Two threads probed at once: keep the later probe.
                inner.events.recycle(s);
                inner.events.recycle(e);
            }
            inner.sampled = 0;
        }
        return;
    }
    inner.events.push(gate.start, stream, gate.kind);
}

/// The process stops using device ordinal `dev` (its context is about to be destroyed, or
/// its primary context released or reset): hand the lease back now if its slice holds it
/// (after the queued work completes, so the next holder starts on an idle engine), and forget
/// the events, which belong to the context about to go. Never binds a gate.
pub fn release_device(dev: CUdevice) {
    let Some(g) = usize::try_from(dev).ok().and_then(|d| GATES.get(d)) else {
        return;
    };
    if g.state.load(Acquire) != 1 {
        return;
    }
    let mut guard = match g.inner.lock() {
        Ok(i) => i,
        Err(p) => p.into_inner(),
    };
    let Some(inner) = guard.as_mut() else { return };
    inner.client.release(&mut inner.events);
    inner.events.forget();
    let anchor = core::mem::replace(&mut inner.anchor, null_mut());
    inner.events.recycle(anchor);
    if let Some((s, e, _, _)) = inner.probe.take() {
        inner.events.recycle(s);
        inner.events.recycle(e);
    }
    inner.events.destroy_spares();
}

/// The device of the calling thread's current context, if any.
pub fn current_device() -> Option<CUdevice> {
    let f = real::cuCtxGetDevice()?;
    let mut dev: CUdevice = 0;
    // SAFETY: real driver function, valid out-pointer.
    (unsafe { f(&mut dev) } == CUDA_SUCCESS).then_some(dev)
}

/// Whether `stream` is capturing a graph (then nothing may wait on it, and it runs nothing).
fn capturing(stream: CUstream) -> bool {
    let Some(f) = real::cuStreamIsCapturing() else {
        return false;
    };
    let mut st = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: real driver function, valid out-pointer.
    let r = unsafe { f(stream, &mut st) };
    // Any error (e.g. the legacy stream during another stream's global capture): do not touch.
    r != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_NONE
}

/// The gate of the calling thread's current device, bound on first use; None when this
/// process's launches there are not gated.
fn current_gate() -> Option<&'static DevGate> {
    let dev = current_device()?;
    let g = GATES.get(usize::try_from(dev).ok()?)?;
    match g.state.load(Acquire) {
        1 => Some(g),
        2 => None,
        _ => bind(g, dev),
    }
}

#[cold]
fn bind(g: &'static DevGate, dev: CUdevice) -> Option<&'static DevGate> {
    let mut guard = match g.inner.lock() {
        Ok(i) => i,
        Err(p) => p.into_inner(),
    };
    if g.state.load(Acquire) != 0 {
        return (g.state.load(Acquire) == 1).then_some(g);
    }
    // Not started up yet: look again at the next launch.
    crate::init::state_if_ready()?;
    let Some(b) = binding(dev) else {
        g.state.store(2, Release); // no slice joined on this device: never gated
        return None;
    };
    let client = match b {
        Bound::Personal(b) => personal_client(b),
        Bound::Node(n) => Granted::new(n.words, n.id, &sched::SYSTEM).map(Scheduler::Granted),
    };
    let Some(client) = client else {
        g.state.store(2, Release);
        return None;
    };
    if let Some(class) = priority_class() {
        client.set_class(class);
    }
    g.solo_word.store(client.solo_word(), Relaxed);
    g.lease.store(
        client.lease_word() as *const AtomicU64 as *mut AtomicU64,
        Release,
    );
    *guard = Some(Inner {
        client,
        events: Events::new(),
        anchor: null_mut(),
        probe: None,
        sampled: 0,
    });
    g.state.store(1, Release);
    if BOUND.fetch_add(1, AcqRel) == 0 {
        SINGLE.store(g as *const DevGate as *mut DevGate, Release);
    } else {
        SINGLE.store(null_mut(), Release); // several devices: find the device per launch
    }
    Some(g)
}

/// The priority class `GPUSLICE_PRIORITY` asks for (`latency` or `normal`); None when unset,
/// so a slice whose class an operator set (`gpuslice slice set --priority`) keeps it. Read
/// from the configuration start-up kept (`config.rs` reads the variable, once).
fn priority_class() -> Option<u32> {
    crate::init::state_if_ready()?.priority
}

/// The personal-mode client of a binding: the tenant-run scheduler.
fn personal_client(b: Binding) -> Option<Scheduler<'static>> {
    let tenants: &'static LedgerTenants<'static> = Box::leak(Box::new(b.tenants));
    Client::new(
        b.sched,
        b.device,
        tenants,
        b.slice as u32 + 1,
        b.proc_sched,
        &sched::SYSTEM,
    )
    .map(Scheduler::Tenant)
}

/// Where this process's compute state lives for device ordinal `dev`; None before start-up or
/// when the process joined no slice there.
fn binding(dev: CUdevice) -> Option<Bound> {
    let st = crate::init::state_if_ready()?;
    let d = st.device(dev)?;
    let ledger = st.ledger;
    let b = ledger.compute_binding(st.me, d.ledger_dev)?;
    if !ledger.writable() {
        // Node mode: the monitor grants the turns; this process asks in its region slot.
        let region = d.region?;
        return Some(Bound::Node(NodeBinding {
            words: sched::GrantWords {
                dev: b.device,
                beat: b.monitor_beat,
                bell: b.turns_bell,
                class: &b.slice_sched.class,
                shared: &region.header().sched,
                me: &region.proc_(st.me.slot)?.grant,
            },
            id: b.slice as u32 + 1,
        }));
    }
    Some(Bound::Personal(Binding {
        sched: b.device,
        device: d.ledger_dev,
        tenants: ledger.tenants(d.ledger_dev),
        slice: b.slice,
        proc_sched: b.proc_sched,
    }))
}

/// Personal or node mode.
enum Bound {
    Personal(Binding),
    Node(NodeBinding),
}

/// Node mode: the policy's words (read-only here) and this process's and its slice's words in
/// its region.
struct NodeBinding {
    words: sched::GrantWords<'static>,
    id: u32,
}

/// Where a process's compute state lives in the ledger for one device.
pub struct Binding {
    /// The device record's scheduler state.
    pub sched: &'static sched::SchedDevice,
    /// Ledger index of the device.
    pub device: usize,
    /// The device's slices, as the scheduler sees them.
    pub tenants: LedgerTenants<'static>,
    /// Ledger index of the slice this process joined on the device.
    pub slice: usize,
    /// This process's record's scheduler state.
    pub proc_sched: &'static sched::SchedProc,
}

impl Inner {
    /// Keep `compute_used` current while solo, every few ms of GPU work: once the
    /// previous probe (events around one launch) completed, learn that launch's GPU time, and
    /// charge the GPU time between the two latest probes: the span between their start events,
    /// but at most the launches made in between times their estimate (a launcher that leaves the
    /// engine idle is not charged for the idle time). Returns the start event of a new probe
    /// (null: none now).
    fn sample_solo(&mut self, g: &DevGate, stream: CUstream) -> CUevent {
        let period = g.solo_period.load(Relaxed);
        self.sampled += period.saturating_sub(g.solo_left.load(Relaxed)) as u64 + 1;
        let est = self.events.estimate(Kind::Kernel).max(1);
        let next = (SAMPLE_GPU_NS / est).clamp(SAMPLE_MIN as u64, SAMPLE_MAX as u64) as u32;
        g.solo_period.store(next, Relaxed);
        g.solo_left.store(next, Relaxed);
        if let Some((start, end, unit, launches)) = self.probe {
            if !Events::done(end) {
                return null_mut();
            }
            if let Some(ms) = self.events.elapsed_when_done(start, end) {
                self.events.learn(unit.kind(), (ms as f64 * 1e6) as u64);
            }
            if !self.anchor.is_null() {
                if let Some(ms) = self.events.elapsed_when_done(self.anchor, start) {
                    let span = (ms as f64 * 1e6) as u64;
                    let work = launches.saturating_mul(self.events.estimate(unit.kind()));
                    self.client
                        .charge_solo(sched::now_ns(), span.min(work), launches);
                }
            }
            let old = core::mem::replace(&mut self.anchor, start);
            self.events.recycle(old);
            self.events.recycle(end);
            self.probe = None;
        }
        self.events.record(stream)
    }
}
