//! Compute shares: who may launch on a device, and when.
//!
//! Kernels of different processes already time-share a GPU, so a share is enforced by deciding
//! who may *launch*: each device has one **lease** word in the ledger naming the slice whose
//! processes may launch now and until when. The parts meet like this:
//!
//! - [`SchedDevice`], [`SchedSlice`], [`SchedProc`] live inside the ledger's `Device`, `Slice`
//!   and `Proc` records (shared memory, all-zero = idle, atomics only, no locks): the lease word,
//!   each slice's virtual time, cap budget, heartbeat and statistics.
//! - [`Client`] is one process's side of one device (process-local, not shared): before each
//!   launch the shim asks it for admission; it sleeps on a futex in the ledger while another
//!   slice holds the lease, waits for its own queued work when its lease ends, charges the GPU
//!   time its launches used, and hands the lease to the next slice.
//! - [`Work`] is how a `Client` sees the process's queued GPU work (the shim implements it with
//!   CUDA events; the unit tests with a simulated engine).
//! - [`slice_stats`], [`device_stats`], [`reap_proc`] / [`on_process_dead`] are for the monitor
//!   and the reaper; [`SchedSlice::reset`] for the ledger when it reuses a slice record.
//!
//! Algorithm: weighted fair queuing over GPU time. A slice's virtual time grows by the GPU time
//! its launches used during its turns, divided by its share (best-effort slices weigh
//! [`BEST_EFFORT_PPM`]); the lease goes to the waiting slice with the least virtual time, so
//! under contention each gets its share and the surplus is split by share. Only slices with a
//! fresh heartbeat compete (work-conserving); a slice coming back starts at the device's current
//! virtual time, so idling earns no burst. A cap is a GCRA budget (`cap_tat`): a slice is
//! eligible only once the GPU time it used, divided by its cap, has been "paid" by the clock. A
//! slice alone and uncapped gets a **solo** lease: its processes launch after one load of the
//! lease word, with no clock, no event and no syscall; a newcomer turns the solo lease into an
//! ordinary one and waits for it to end.
//!
//! A lease ends on time because its holder stops launching once its estimated queued work would
//! run past the lease end, then waits until about [`HANDOFF_LEAD_NS`] of it is left (so a deep
//! asynchronous queue is paid for by whoever queued it, and the next holder's first kernel meets
//! a busy engine). The GPU time charged is the estimated time of the launches admitted in the
//! turn (the shim measures each launch with events), at most the turn's span: a launcher too
//! slow to keep the engine busy is not charged for the idle time. Nothing waits on a holder
//! forever: a lease whose end is [`GRACE_NS`] past, or whose holder's queued work ran out
//! [`IDLE_GRACE_NS`] ago with nothing new launched, is taken over by any waiter, so a holder
//! that dies, hangs or goes idle loses its turn within milliseconds without the monitor. A
//! waiter that dies stops refreshing its heartbeat and stops competing after
//! [`WANT_STALE_NS`].

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use crate::layout::{Device, Proc, Slice, PPM, STATE_ACTIVE};

/// Length of an ordinary lease: long enough that handoffs (futex wake + first launch, 0.1-1 ms
/// on a loaded machine, mostly hidden by [`HANDOFF_LEAD_NS`]) cost little, short enough that
/// shares hold over 1 s windows (200 turns a second).
pub const LEASE_NS: u64 = 5_000_000;
/// Longest a lease may be extended for a single kernel longer than [`LEASE_NS`].
pub const MAX_LEASE_NS: u64 = 200_000_000;
/// A holder hands over when its queued work needs about this much more: about a wake-up and a
/// launch of the next holder, so the engine does not idle between turns.
pub const HANDOFF_LEAD_NS: u64 = 300_000;
/// A lease this far past its end is taken over (its holder is dead, hung or descheduled).
pub const GRACE_NS: u64 = 5_000_000;
/// A holder whose queued work ran out this long ago, and which launched nothing since, is idle:
/// its lease is taken over.
pub const IDLE_GRACE_NS: u64 = 2_000_000;
/// Time a newly granted slice has to make its first launch before it counts as idle.
pub const WAKE_ALLOW_NS: u64 = 3_000_000;
/// A slice whose waiters have not refreshed their heartbeat for this long does not compete.
pub const WANT_STALE_NS: u64 = 200_000_000;
/// Longest single futex sleep (waiters wake to refresh their heartbeat).
pub const MAX_SLEEP_NS: u64 = 50_000_000;
/// Weight of a slice without a guaranteed share: it gets only what the others leave.
pub const BEST_EFFORT_PPM: u64 = 10_000;
/// How late a capped slice may start a turn and still keep the budget of its previous one
/// (covers wake-up latency, so a cap is met, not undershot).
pub const CAP_SLACK_NS: u64 = 1_000_000;
/// Width of the statistics window behind `compute_used`.
pub const WINDOW_NS: u64 = 1_000_000_000;

// The lease word: [holder: 15 bits][solo: 1 bit][end: 48 bits, µs of CLOCK_MONOTONIC].
// One word, so a lease is read and replaced atomically (no torn holder/end pairs); 48 bits of
// µs last 8.9 years of uptime.
const END_BITS: u32 = 48;
const END_MASK: u64 = (1 << END_BITS) - 1;
const SOLO_BIT: u64 = 1 << END_BITS;
const HOLDER_SHIFT: u32 = END_BITS + 1;
/// The largest slice id a lease can name (slice index + 1).
pub const MAX_SLICE_ID: u32 = (1 << (64 - HOLDER_SHIFT)) - 1;

/// A decoded lease word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Slice id (ledger slice index + 1); 0: nobody holds the device.
    pub holder: u32,
    /// The holder is alone and uncapped: it launches without asking until someone else wants in.
    pub solo: bool,
    /// End of the lease, CLOCK_MONOTONIC ns (µs resolution); 0 for a solo lease.
    pub end_ns: u64,
}

impl Lease {
    /// Nobody holds the device.
    pub const FREE: Lease = Lease {
        holder: 0,
        solo: false,
        end_ns: 0,
    };

    /// Decode a lease word.
    pub fn unpack(w: u64) -> Lease {
        Lease {
            holder: (w >> HOLDER_SHIFT) as u32,
            solo: w & SOLO_BIT != 0,
            end_ns: (w & END_MASK) * 1000,
        }
    }

    /// Encode (end rounded up to the µs).
    pub fn pack(self) -> u64 {
        let end_us = self.end_ns.div_ceil(1000) & END_MASK;
        ((self.holder as u64) << HOLDER_SHIFT) | if self.solo { SOLO_BIT } else { 0 } | end_us
    }

    /// The solo lease word of slice `id`: what the launch fast path compares against.
    pub fn solo_word(id: u32) -> u64 {
        Lease {
            holder: id,
            solo: true,
            end_ns: 0,
        }
        .pack()
    }
}

/// Time-bucketed GPU time, for "fraction of the device over the last window".
#[repr(C)]
#[derive(Debug, Default)]
pub struct Window {
    /// Start of the current bucket (ns).
    pub start_ns: AtomicU64,
    /// GPU ns charged in the current bucket.
    pub cur_ns: AtomicU64,
    /// GPU ns charged in the previous bucket.
    pub prev_ns: AtomicU64,
}

impl Window {
    fn add(&self, now: u64, ns: u64) {
        let start = self.start_ns.load(Acquire);
        // `start` may be anything a record held (saturate), or ahead of `now` when another
        // process charged a span ending past the clock (then this one adds to that bucket).
        if now >= start.saturating_add(WINDOW_NS) {
            let new_start = now - now % WINDOW_NS;
            if self
                .start_ns
                .compare_exchange(start, new_start, AcqRel, Relaxed)
                .is_ok()
            {
                let cur = self.cur_ns.swap(0, AcqRel);
                let adjacent = start != 0 && new_start == start.saturating_add(WINDOW_NS);
                self.prev_ns.store(if adjacent { cur } else { 0 }, Release);
            }
        }
        self.cur_ns.fetch_add(ns, AcqRel);
    }

    /// Fraction of `WINDOW_NS` charged over the last `WINDOW_NS` before `now` (the previous
    /// bucket weighted by how much of it is still inside the window).
    fn fraction(&self, now: u64) -> f64 {
        let start = self.start_ns.load(Acquire);
        let (cur, prev) = (
            self.cur_ns.load(Acquire) as f64,
            self.prev_ns.load(Acquire) as f64,
        );
        let w = WINDOW_NS as f64;
        let into = now.saturating_sub(start) as f64;
        let ns = if into < w {
            cur + prev * (w - into) / w
        } else if into < 2.0 * w {
            cur * (2.0 * w - into) / w
        } else {
            0.0
        };
        (ns / w).clamp(0.0, 1.0)
    }
}

/// Per-device scheduler state (in the ledger's `Device` record).
#[repr(C)]
#[derive(Debug, Default)]
pub struct SchedDevice {
    /// The lease word (see [`Lease`]). 0: free.
    pub lease: AtomicU64,
    /// Futex word: bumped on every change of holder, so sleepers wake.
    pub seq: AtomicU32,
    /// Processes asleep on `seq` (a hint: one killed asleep only costs a spare wake).
    pub sleepers: AtomicU32,
    /// Virtual time of the latest slice granted the lease: where a returning slice restarts.
    pub vt_floor: AtomicU64,
    /// GPU ns charged on this device, all slices.
    pub gpu_ns_total: AtomicU64,
    /// Leases granted (handoffs and renewals).
    pub leases_total: AtomicU64,
    /// Leases taken over from a holder that overran, went idle or died.
    pub takeovers_total: AtomicU64,
    /// Recent GPU time, all slices.
    pub window: Window,
    /// Room to grow without moving the ledger layout.
    pub reserved: [u64; 8],
}

/// Per-slice scheduler state (in the ledger's `Slice` record). The share and cap themselves are
/// the slice record's `compute_share_ppm` / `compute_cap_ppm`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct SchedSlice {
    /// Virtual time: GPU ns held × 10⁶ / weight (ppm).
    pub vt: AtomicU64,
    /// Cap budget (GCRA theoretical arrival time, ns): eligible once the clock passes it.
    pub cap_tat_ns: AtomicU64,
    /// Heartbeat of this slice's waiting or launching processes (ns).
    pub want_ns: AtomicU64,
    /// Processes of this slice waiting for the lease (a hint; the heartbeat decides).
    pub waiters: AtomicU32,
    /// Padding.
    pub _pad: u32,
    /// While holding: when the holder's queued work is estimated to complete (ns).
    pub busy_until_ns: AtomicU64,
    /// GPU ns charged (time the slice held the device with work queued).
    pub gpu_ns_total: AtomicU64,
    /// ns its processes spent waiting for a lease before a launch.
    pub throttled_ns_total: AtomicU64,
    /// Launches admitted.
    pub launches_total: AtomicU64,
    /// Leases granted to it.
    pub leases_total: AtomicU64,
    /// Recent GPU time.
    pub window: Window,
    /// Room to grow without moving the ledger layout.
    pub reserved: [u64; 6],
}

/// Per-process scheduler state (in the ledger's `Proc` record), for the reaper.
#[repr(C)]
#[derive(Debug, Default)]
pub struct SchedProc {
    /// Bit `d`: the process counts in its slice's `waiters` on ledger device `d`.
    pub waiting_mask: AtomicU32,
    /// Bit `d`: the process is launching under its slice's lease on ledger device `d`.
    pub holding_mask: AtomicU32,
    /// ns this process spent throttled.
    pub throttled_ns_total: AtomicU64,
    /// Room to grow without moving the ledger layout.
    pub reserved: [u64; 6],
}

/// What the monitor shows for one slice.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SliceComputeStats {
    /// Fraction of the device the slice held over the last [`WINDOW_NS`] (`compute_used`).
    pub used_fraction: f64,
    /// GPU ns charged since the slice was created.
    pub gpu_ns_total: u64,
    /// ns its processes spent throttled (waiting for a lease).
    pub throttled_ns_total: u64,
    /// Launches admitted through the scheduler's slow path, plus sampled fast-path launches.
    pub launches_total: u64,
}

/// The statistics of one slice at `now_ns` (CLOCK_MONOTONIC, see [`now_ns`]).
pub fn slice_stats(s: &SchedSlice, now_ns: u64) -> SliceComputeStats {
    SliceComputeStats {
        used_fraction: s.window.fraction(now_ns),
        gpu_ns_total: s.gpu_ns_total.load(Relaxed),
        throttled_ns_total: s.throttled_ns_total.load(Relaxed),
        launches_total: s.launches_total.load(Relaxed),
    }
}

/// What the monitor shows for one device.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceComputeStats {
    /// Fraction of the device used over the last window, all slices.
    pub used_fraction: f64,
    /// GPU ns charged, all slices.
    pub gpu_ns_total: u64,
    /// Leases granted.
    pub leases_total: u64,
    /// Leases taken over from dead, hung or idle holders.
    pub takeovers_total: u64,
    /// Current holder (ledger slice index + 1; 0: none) and whether it is solo.
    pub holder: u32,
    /// The holder is alone on the device.
    pub solo: bool,
}

/// The statistics of one device at `now_ns`.
pub fn device_stats(d: &SchedDevice, now_ns: u64) -> DeviceComputeStats {
    let l = Lease::unpack(d.lease.load(Relaxed));
    DeviceComputeStats {
        used_fraction: d.window.fraction(now_ns),
        gpu_ns_total: d.gpu_ns_total.load(Relaxed),
        leases_total: d.leases_total.load(Relaxed),
        takeovers_total: d.takeovers_total.load(Relaxed),
        holder: l.holder,
        solo: l.solo,
    }
}

/// CLOCK_MONOTONIC in ns: the clock of every timestamp here (one clock for all processes).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The slices that may compete for one device, as the scheduler sees them.
pub trait Tenants {
    /// Calls `f(id, state, share_ppm, cap_ppm)` for every live slice on the device; `id` is the
    /// ledger slice index + 1, `cap_ppm` is [`PPM`] (or more) for "no cap".
    fn each(&self, f: &mut dyn FnMut(u32, &SchedSlice, u32, u32));
    /// The slice with id `id`, if it is live and on the device.
    fn get(&self, id: u32) -> Option<(&SchedSlice, u32, u32)>;
}

/// The ledger's slices on one device.
pub struct LedgerTenants<'a> {
    /// The ledger's slice array.
    pub slices: &'a [Slice],
    /// Ledger index of the device.
    pub device: u32,
}

impl Tenants for LedgerTenants<'_> {
    fn each(&self, f: &mut dyn FnMut(u32, &SchedSlice, u32, u32)) {
        for (i, s) in self.slices.iter().enumerate() {
            if s.state.load(Acquire) == STATE_ACTIVE && s.device.load(Relaxed) == self.device {
                let share = s.compute_share_ppm.load(Relaxed);
                let cap = s.compute_cap_ppm.load(Relaxed);
                f(i as u32 + 1, &s.sched, share, cap);
            }
        }
    }

    fn get(&self, id: u32) -> Option<(&SchedSlice, u32, u32)> {
        let s = self.slices.get(id.checked_sub(1)? as usize)?;
        (s.state.load(Acquire) == STATE_ACTIVE && s.device.load(Relaxed) == self.device).then(
            || {
                (
                    &s.sched,
                    s.compute_share_ppm.load(Relaxed),
                    s.compute_cap_ppm.load(Relaxed),
                )
            },
        )
    }
}

fn capped(cap_ppm: u32) -> bool {
    cap_ppm != 0 && cap_ppm < PPM
}

fn weight(share_ppm: u32) -> u64 {
    if share_ppm == 0 {
        BEST_EFFORT_PPM
    } else {
        share_ppm as u64
    }
}

/// Whether a process of the slice waited or launched recently (its heartbeat is fresh).
fn fresh(s: &SchedSlice, now: u64) -> bool {
    now.saturating_sub(s.want_ns.load(Acquire)) < WANT_STALE_NS
}

/// Whether the slice competes for the lease: a process of it is waiting now (the count) and
/// alive (the heartbeat: a waiter killed asleep leaves the count high but stops refreshing).
/// A slice that just stopped launching does not compete, so its turn is not offered to it.
fn wants(s: &SchedSlice, now: u64) -> bool {
    s.waiters.load(Acquire) > 0 && fresh(s, now)
}

/// Admission of compute guarantees: whether a slice guaranteeing `new_ppm` fits on a device
/// whose slices already guarantee `reserved_ppm` in all (Σ ≤ 1.0). The ledger's attach path
/// applies this rule when it reserves `Device::compute_reserved`.
pub fn admits(reserved_ppm: u64, new_ppm: u32) -> bool {
    reserved_ppm.saturating_add(new_ppm as u64) <= PPM as u64
}

/// Charge slice `s` (share `share_ppm`, cap `cap_ppm`) for a turn on the device from `start` to
/// `end` during which its launches used `busy` ns of GPU time: it pays the GPU time, at most the
/// span (a launcher that leaves the engine idle during its turn is not charged for the idle
/// time; concurrent streams are not charged more than the device).
pub fn charge(
    dev: &SchedDevice,
    s: &SchedSlice,
    share_ppm: u32,
    cap_ppm: u32,
    start: u64,
    end: u64,
    busy: u64,
) {
    let d = end.saturating_sub(start).min(busy);
    if d == 0 {
        return;
    }
    // `busy` sums the shim's estimates (anything a driver measured): saturate, never wrap.
    s.vt.fetch_add(d.saturating_mul(PPM as u64) / weight(share_ppm), AcqRel);
    if capped(cap_ppm) {
        let inc = d.saturating_mul(PPM as u64) / cap_ppm as u64;
        let floor = start.saturating_sub(CAP_SLACK_NS);
        // Lock-free read-modify-write: retried only when another process charged meanwhile.
        let _ = s
            .cap_tat_ns
            .fetch_update(AcqRel, Acquire, |t| Some(t.max(floor).saturating_add(inc)));
    }
    s.gpu_ns_total.fetch_add(d, Relaxed);
    s.window.add(end, d);
    dev.gpu_ns_total.fetch_add(d, Relaxed);
    dev.window.add(end, d);
}

/// Account GPU time used by a slice holding a solo lease (sampled by the shim from events): the
/// statistics only, since nobody competes.
pub fn charge_solo(dev: &SchedDevice, s: &SchedSlice, end: u64, ns: u64, launches: u64) {
    s.gpu_ns_total.fetch_add(ns, Relaxed);
    s.launches_total.fetch_add(launches, Relaxed);
    s.window.add(end, ns);
    dev.gpu_ns_total.fetch_add(ns, Relaxed);
    dev.window.add(end, ns);
}

/// The next lease for the device at `now`: the competing, cap-eligible slice with the least
/// virtual time (`renewing`: a slice that wants it without a fresh heartbeat, i.e. the holder
/// asking; `exclude`: a holder being taken over, which competes again once it waits).
fn pick(t: &dyn Tenants, now: u64, renewing: u32, exclude: u32) -> Lease {
    let mut best: Option<(u64, u32, u32)> = None; // (vt, id, cap)
    let mut competing = 0;
    t.each(&mut |id, s, _share, cap| {
        if id == exclude || !(id == renewing || wants(s, now)) {
            return;
        }
        competing += 1;
        if capped(cap) && s.cap_tat_ns.load(Acquire) > now {
            return;
        }
        let vt = s.vt.load(Acquire);
        if best.is_none_or(|(bvt, _, _)| vt < bvt) {
            best = Some((vt, id, cap));
        }
    });
    match best {
        None => Lease::FREE,
        // Never solo over a holder being taken over: it may well come back, and a solo lease
        // is not charged. A holder that is really gone stops competing once its heartbeat is
        // stale, and the next renewal is solo.
        Some((_, id, cap)) if competing == 1 && exclude == 0 && !capped(cap) => Lease {
            holder: id,
            solo: true,
            end_ns: 0,
        },
        Some((_, id, _)) => Lease {
            holder: id,
            solo: false,
            end_ns: now + LEASE_NS,
        },
    }
}

/// Replace lease word `old` by `new` (one CAS) and wake sleepers if the holder changed.
fn install(dev: &SchedDevice, t: &dyn Tenants, old: u64, new: Lease, now: u64) -> bool {
    if let Some((s, _, _)) = t.get(new.holder) {
        // Before the CAS, so a waiter never sees the new holder with a stale estimate. A failed
        // CAS leaves a harmless later estimate (it only delays an idle takeover).
        s.busy_until_ns.fetch_max(now + WAKE_ALLOW_NS, AcqRel);
    }
    if dev
        .lease
        .compare_exchange(old, new.pack(), AcqRel, Acquire)
        .is_err()
    {
        return false;
    }
    if let Some((s, _, _)) = t.get(new.holder) {
        dev.vt_floor.fetch_max(s.vt.load(Acquire), AcqRel);
        s.leases_total.fetch_add(1, Relaxed);
        dev.leases_total.fetch_add(1, Relaxed);
    }
    if Lease::unpack(old).holder != new.holder {
        dev.seq.fetch_add(1, Release);
        if dev.sleepers.load(Acquire) > 0 {
            futex_wake(&dev.seq);
        }
    }
    true
}

/// Why a waiter may take the lease from its holder at `now`, if it may.
fn takeover_due(t: &dyn Tenants, l: Lease, now: u64) -> bool {
    if l.holder == 0 {
        return true;
    }
    if l.solo {
        return false; // turned into an ordinary lease first (see `Client::acquire`)
    }
    if now > l.end_ns + GRACE_NS {
        return true;
    }
    match t.get(l.holder) {
        None => true, // the slice is gone
        Some((s, _, _)) => now > s.busy_until_ns.load(Acquire).saturating_add(IDLE_GRACE_NS),
    }
}

/// When a waiter should look again at lease `l` if nothing wakes it.
fn recheck_at(t: &dyn Tenants, me: &SchedSlice, l: Lease, now: u64) -> u64 {
    let by = if l.holder == 0 {
        // Nobody eligible: the earliest a cap budget frees, ours at least.
        me.cap_tat_ns.load(Acquire).max(now + 100_000)
    } else {
        let idle = t.get(l.holder).map_or(now, |(s, _, _)| {
            s.busy_until_ns.load(Acquire).saturating_add(IDLE_GRACE_NS)
        });
        (l.end_ns + GRACE_NS).min(idle)
    };
    by.clamp(now + 50_000, now + MAX_SLEEP_NS)
}

/// Revoke what a dead process held on one device: its place among its slice's waiters and, when
/// its slice holds the lease and no other process of the slice is launching under it, the lease.
/// Called by the reaper (ledger/monitor) with the dead process's records; idempotent. Waiters do
/// not depend on it (they take over an overdue lease themselves), it only makes the handoff
/// immediate.
pub fn on_process_dead(
    dev: &SchedDevice,
    dev_index: usize,
    t: &dyn Tenants,
    slice_id: u32,
    slice: &SchedSlice,
    proc: &SchedProc,
) {
    let bit = 1u32 << (dev_index % 32);
    if proc.waiting_mask.fetch_and(!bit, AcqRel) & bit != 0 {
        let _ = slice
            .waiters
            .fetch_update(AcqRel, Acquire, |w| w.checked_sub(1));
    }
    let holding = proc.holding_mask.fetch_and(!bit, AcqRel) & bit != 0;
    let w = dev.lease.load(Acquire);
    let l = Lease::unpack(w);
    // A solo lease is not tracked per process: give it up too (a surviving process of the slice
    // takes it back at its next launch).
    if (holding || l.solo) && l.holder == slice_id {
        let now = now_ns();
        // Other processes of the slice waiting for it: the slice may keep competing.
        let next = if slice.waiters.load(Acquire) > 0 {
            pick(t, now, 0, 0)
        } else {
            pick(t, now, 0, slice_id)
        };
        if install(dev, t, w, next, now) {
            dev.takeovers_total.fetch_add(1, Relaxed);
        }
    }
}

/// What the reaper calls for each dead process record, before it clears the record's
/// per-device slices: [`on_process_dead`] on every device the process had joined.
pub fn reap_proc(devices: &[Device], slices: &[Slice], p: &Proc) {
    for (d, pd) in p.devices.iter().enumerate() {
        let si = pd.slice.load(Acquire);
        let (Some(dev), Some(slice)) = (devices.get(d), slices.get(si as usize)) else {
            continue; // ACCOUNT_NONE (not joined) is past the end of `slices`
        };
        let t = LedgerTenants {
            slices,
            device: d as u32,
        };
        on_process_dead(&dev.sched, d, &t, si + 1, &slice.sched, &p.sched);
    }
}

impl SchedSlice {
    /// Forget everything of a previous slice that used this record: the ledger calls it when it
    /// creates a slice in a freed record, before publishing it.
    pub fn reset(&self) {
        for a in [
            &self.vt,
            &self.cap_tat_ns,
            &self.want_ns,
            &self.busy_until_ns,
            &self.gpu_ns_total,
            &self.throttled_ns_total,
            &self.launches_total,
            &self.leases_total,
            &self.window.start_ns,
            &self.window.cur_ns,
            &self.window.prev_ns,
        ] {
            a.store(0, Release);
        }
        self.waiters.store(0, Release);
    }
}

/// The process's queued GPU work on one device, as the [`Client`] needs to see it.
pub trait Work {
    /// Estimated GPU ns of work queued and not yet complete (may poll completions).
    fn outstanding_ns(&mut self) -> u64;
    /// Estimated GPU ns of the launch about to be admitted.
    fn next_ns(&mut self) -> u64;
    /// Wait until all queued work is complete; returns when it completed (ns, ≤ now).
    fn drain(&mut self) -> u64;
    /// Wait until the queued work is estimated to need at most `ns` more; returns that estimate.
    fn wait_below(&mut self, ns: u64) -> u64;
}

/// What an admission cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    /// ns spent waiting for the lease.
    pub throttled_ns: u64,
}

/// One process's side of one device: process-local (the shim keeps one per device under a
/// process-local lock, taken only off the solo fast path).
pub struct Client<'a> {
    dev: &'a SchedDevice,
    dev_index: usize,
    tenants: &'a dyn Tenants,
    id: u32,
    me: &'a SchedSlice,
    proc: &'a SchedProc,
    /// First launch of this process under its slice's current lease (its charge starts there).
    held_since: Option<u64>,
    /// The lease word `held_since` belongs to (a renewal is a new lease).
    held_word: u64,
    /// This process's latest estimate of when its queued work completes.
    busy_until: u64,
    /// End of the last span charged (a handoff charges a little ahead of the clock).
    charged_until: u64,
    /// Estimated GPU time of the launches admitted under the current lease.
    admitted_ns: u64,
    solo_word: u64,
}

impl<'a> Client<'a> {
    /// The client of slice `id` (ledger slice index + 1) on ledger device `dev_index`.
    pub fn new(
        dev: &'a SchedDevice,
        dev_index: usize,
        tenants: &'a dyn Tenants,
        id: u32,
        proc: &'a SchedProc,
    ) -> Option<Client<'a>> {
        if id == 0 || id > MAX_SLICE_ID {
            return None;
        }
        let (me, _, _) = tenants.get(id)?;
        Some(Client {
            dev,
            dev_index,
            tenants,
            id,
            me,
            proc,
            held_since: None,
            held_word: 0,
            busy_until: 0,
            charged_until: 0,
            admitted_ns: 0,
            solo_word: Lease::solo_word(id),
        })
    }

    /// The launch fast path: true when this slice holds a solo lease (one atomic load). The
    /// shim launches directly then, and calls [`Client::acquire`] otherwise.
    #[inline]
    pub fn solo(&self) -> bool {
        self.dev.lease.load(Relaxed) == self.solo_word
    }

    /// The device's and the slice's scheduler records (for statistics the caller gathers).
    pub fn parts(&self) -> (&'a SchedDevice, &'a SchedSlice) {
        (self.dev, self.me)
    }

    /// Lease word to compare against in a caller's own fast path.
    pub fn solo_word(&self) -> u64 {
        self.solo_word
    }

    fn share_cap(&self) -> (u32, u32) {
        self.tenants
            .get(self.id)
            .map_or((0, PPM), |(_, s, c)| (s, c))
    }

    fn bit(&self) -> u32 {
        1u32 << (self.dev_index % 32)
    }

    /// Charge what this process held under its current lease, up to `end`. A turn can start
    /// after the clock (it begins where the previous charge ended, which may lie ahead), so `end`
    /// may precede it: that charges nothing rather than wrapping or panicking.
    fn settle(&mut self, end: u64) {
        if let Some(start) = self.held_since.take() {
            let (share, cap) = self.share_cap();
            let busy = core::mem::take(&mut self.admitted_ns);
            let end = end.max(start);
            charge(self.dev, self.me, share, cap, start, end, busy);
            self.charged_until = end;
            self.proc.holding_mask.fetch_and(!self.bit(), AcqRel);
        }
    }

    /// Block until this process may launch one more piece of work on the device; `work` is its
    /// queued work there. Never spins: waits sleep on the ledger's futex with a timeout.
    pub fn acquire(&mut self, work: &mut dyn Work) -> Admission {
        let t0 = now_ns();
        let mut registered = false;
        let mut out = Admission::default();
        loop {
            let now = now_ns();
            let w = self.dev.lease.load(Acquire);
            let l = Lease::unpack(w);
            if l.holder == self.id {
                if l.solo {
                    break;
                }
                if self.held_since.is_some() && self.held_word != w {
                    // A renewal by another process of the slice: charge the old lease apart.
                    self.settle(self.busy_until.min(now));
                }
                if self.held_since.is_none() {
                    // Not before the end of what was already charged (a handoff lead).
                    self.held_since = Some(now.max(self.charged_until));
                    self.held_word = w;
                    self.proc.holding_mask.fetch_or(self.bit(), AcqRel);
                }
                self.me.want_ns.store(now, Release);
                let queued = work.outstanding_ns();
                let next = work.next_ns();
                // What is left of an earlier turn's handoff lead counts as nothing queued, so a
                // fresh lease always admits at least one launch.
                let fresh = queued <= HANDOFF_LEAD_NS;
                // `queued` and `next` are estimates from the driver's timings: saturate.
                let need = queued.saturating_add(next);
                let done_at = now.saturating_add(need);
                if now < l.end_ns && (fresh || done_at <= l.end_ns) {
                    if fresh && done_at > l.end_ns {
                        // One launch longer than the lease: stretch the lease to cover it, so
                        // waiters do not take over mid-kernel.
                        let end = now + need.min(MAX_LEASE_NS);
                        let nl = Lease { end_ns: end, ..l };
                        if self
                            .dev
                            .lease
                            .compare_exchange(w, nl.pack(), AcqRel, Acquire)
                            .is_err()
                        {
                            continue;
                        }
                        self.held_word = nl.pack();
                    }
                    self.admitted_ns = self.admitted_ns.saturating_add(next);
                    // No further than a stretched lease reaches: `busy_until_ns` only grows
                    // (fetch_max), so one absurd estimate would end idle takeovers for good.
                    self.busy_until = now + need.min(MAX_LEASE_NS);
                    self.me.busy_until_ns.fetch_max(self.busy_until, AcqRel);
                    break;
                }
                // The lease is over for us: pay for everything queued, then hand over, a little
                // before our last kernel ends so the next holder's first launch meets an engine
                // that is still busy rather than idle.
                // Draining is not idling: waiters must not take over before the lease's grace.
                self.me
                    .busy_until_ns
                    .fetch_max(l.end_ns.max(now) + GRACE_NS, AcqRel);
                let left = work.wait_below(HANDOFF_LEAD_NS);
                let now = now_ns();
                // `left` should be about the lead, but a drain that gave up on a hung kernel
                // reports the whole rest: charge at most a lease ahead, or `charged_until`
                // would hold the start of this process's next turns far beyond the clock.
                self.settle(now + left.min(MAX_LEASE_NS));
                if self.dev.lease.load(Acquire) == w {
                    let next = pick(self.tenants, now, self.id, 0);
                    install(self.dev, self.tenants, w, next, now);
                }
                continue;
            }
            if self.held_since.is_some() {
                // Our lease was taken over (we overran it or looked idle): pay what we held.
                self.settle(self.busy_until.min(now));
            }
            if !registered {
                registered = true;
                if self.me.waiters.fetch_add(1, AcqRel) == 0 && !fresh(self.me, now) {
                    // Coming back after idling: start from the device's current virtual time,
                    // so the idle time earns no burst that would starve the others.
                    self.me
                        .vt
                        .fetch_max(self.dev.vt_floor.load(Acquire), AcqRel);
                }
                self.proc.waiting_mask.fetch_or(self.bit(), AcqRel);
            }
            self.me.want_ns.store(now, Release);
            if l.solo {
                // Someone is alone on the device: give it one more ordinary lease, then compete
                // from its virtual time on (it was not charged while alone).
                if let Some((h, _, _)) = self.tenants.get(l.holder) {
                    self.me.vt.fetch_max(h.vt.load(Acquire), AcqRel);
                    h.busy_until_ns.fetch_max(now + WAKE_ALLOW_NS, AcqRel);
                }
                let nl = Lease {
                    holder: l.holder,
                    solo: false,
                    end_ns: now + LEASE_NS,
                };
                let _ = self
                    .dev
                    .lease
                    .compare_exchange(w, nl.pack(), AcqRel, Acquire);
                continue;
            }
            if takeover_due(self.tenants, l, now) {
                let next = pick(self.tenants, now, 0, l.holder);
                if install(self.dev, self.tenants, w, next, now) && l.holder != 0 {
                    self.dev.takeovers_total.fetch_add(1, Relaxed);
                }
                if next.holder == self.id || next.holder != 0 {
                    continue;
                }
            }
            // Sleep until the lease changes hands, or until it is due for takeover.
            let seq = self.dev.seq.load(Acquire);
            if self.dev.lease.load(Acquire) != w {
                continue;
            }
            let deadline = recheck_at(self.tenants, self.me, Lease::unpack(w), now);
            self.dev.sleepers.fetch_add(1, AcqRel);
            futex_wait(&self.dev.seq, seq, deadline.saturating_sub(now));
            self.dev.sleepers.fetch_sub(1, AcqRel);
        }
        if registered {
            let _ = self
                .me
                .waiters
                .fetch_update(AcqRel, Acquire, |w| w.checked_sub(1));
            self.proc.waiting_mask.fetch_and(!self.bit(), AcqRel);
            out.throttled_ns = now_ns().saturating_sub(t0);
            self.me
                .throttled_ns_total
                .fetch_add(out.throttled_ns, Relaxed);
            self.proc
                .throttled_ns_total
                .fetch_add(out.throttled_ns, Relaxed);
        }
        self.me.launches_total.fetch_add(1, Relaxed);
        out
    }

    /// Give the lease back now if this process holds it (it stops using the device: context
    /// destroyed, process exiting). Drains first, so the next holder starts on an idle engine.
    pub fn release(&mut self, work: &mut dyn Work) {
        let w = self.dev.lease.load(Acquire);
        let l = Lease::unpack(w);
        if l.holder != self.id {
            return;
        }
        let done = if l.solo { now_ns() } else { work.drain() };
        let now = now_ns();
        self.settle(done.min(now));
        let next = pick(self.tenants, now, 0, self.id);
        install(self.dev, self.tenants, w, next, now);
    }
}

/// Sleep on `word` while it equals `val`, for at most `timeout_ns` (a process-shared futex:
/// the word lives in the ledger mapping).
pub fn futex_wait(word: &AtomicU32, val: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word` (valid for the call) and sleeps at
    // most `ts`; EAGAIN, EINTR and ETIMEDOUT are all "look again" for the caller.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            val,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        );
    }
}

/// Wake every sleeper on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address of `word` as a key; it touches no memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    //! Threads stand in for processes, a simulated single-engine GPU for the device: kernels run
    //! one after another in submission order, taking real time.
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    struct Table(Vec<(SchedSlice, u32, u32)>);

    impl Table {
        fn new(slices: &[(f64, f64)]) -> Table {
            Table(
                slices
                    .iter()
                    .map(|&(share, cap)| {
                        (
                            SchedSlice::default(),
                            (share * 1e6) as u32,
                            (cap * 1e6) as u32,
                        )
                    })
                    .collect(),
            )
        }
    }

    impl Tenants for Table {
        fn each(&self, f: &mut dyn FnMut(u32, &SchedSlice, u32, u32)) {
            for (i, (s, share, cap)) in self.0.iter().enumerate() {
                f(i as u32 + 1, s, *share, *cap);
            }
        }
        fn get(&self, id: u32) -> Option<(&SchedSlice, u32, u32)> {
            self.0
                .get(id.checked_sub(1)? as usize)
                .map(|(s, a, c)| (s, *a, *c))
        }
    }

    /// One tenant's queue on the shared simulated engine (`free_at`: when the engine is free).
    struct Sim<'a> {
        free_at: &'a AtomicU64,
        queue: VecDeque<u64>,
        kernel_ns: u64,
    }

    impl<'a> Sim<'a> {
        fn new(free_at: &'a AtomicU64, kernel_ns: u64) -> Sim<'a> {
            Sim {
                free_at,
                queue: VecDeque::new(),
                kernel_ns,
            }
        }

        fn launch(&mut self) {
            let now = now_ns();
            let d = self.kernel_ns;
            let start = self
                .free_at
                .fetch_update(AcqRel, Acquire, |f| Some(f.max(now) + d))
                .unwrap();
            self.queue.push_back(start.max(now) + d);
        }
        fn wait_until(t: u64) {
            let now = now_ns();
            if t > now {
                std::thread::sleep(Duration::from_nanos(t - now));
            }
        }
    }

    impl Work for Sim<'_> {
        fn outstanding_ns(&mut self) -> u64 {
            let now = now_ns();
            while self.queue.front().is_some_and(|&e| e <= now) {
                self.queue.pop_front();
            }
            self.queue.back().map_or(0, |&e| e.saturating_sub(now))
        }
        fn next_ns(&mut self) -> u64 {
            self.kernel_ns
        }
        fn wait_below(&mut self, ns: u64) -> u64 {
            let last = self.queue.back().copied().unwrap_or(0);
            Self::wait_until(last.saturating_sub(ns));
            self.outstanding_ns()
        }
        fn drain(&mut self) -> u64 {
            let last = self.queue.back().copied().unwrap_or(0);
            Self::wait_until(last);
            self.queue.clear();
            last.min(now_ns())
        }
    }

    struct Tenant {
        id: u32,
        kernel_ns: u64,
        depth: usize,
        /// Stop launching after this long (work conservation).
        stop_after: Option<Duration>,
    }

    /// Run tenants saturating the engine for `secs`; returns each one's GPU ns launched in the
    /// measured part (after a short warm-up) and the measured wall ns.
    fn run(t: &Table, tenants: &[Tenant], secs: f64) -> (Vec<u64>, u64) {
        // One timed run at a time: they measure real time on a machine shared with the others.
        static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dev = SchedDevice::default();
        let free_at = AtomicU64::new(0);
        let procs: Vec<SchedProc> = tenants.iter().map(|_| SchedProc::default()).collect();
        let warm = 200_000_000u64;
        let begin = now_ns() + warm;
        let end = begin + (secs * 1e9) as u64;
        let used: Vec<AtomicU64> = tenants.iter().map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|sc| {
            for (i, ten) in tenants.iter().enumerate() {
                let (dev, free_at, proc, used) = (&dev, &free_at, &procs[i], &used[i]);
                sc.spawn(move || {
                    let mut c = Client::new(dev, 0, t, ten.id, proc).unwrap();
                    let mut sim = Sim::new(free_at, ten.kernel_ns);
                    let started = now_ns();
                    loop {
                        let now = now_ns();
                        if now >= end
                            || ten
                                .stop_after
                                .is_some_and(|d| now >= started + d.as_nanos() as u64)
                        {
                            break;
                        }
                        if !c.solo() {
                            c.acquire(&mut sim);
                        }
                        sim.launch();
                        let e = *sim.queue.back().unwrap();
                        if e > begin && e <= end {
                            used.fetch_add(ten.kernel_ns, Relaxed);
                        }
                        if sim.queue.len() >= ten.depth {
                            Sim::wait_until(*sim.queue.front().unwrap());
                            sim.outstanding_ns();
                        }
                    }
                    // Exit like a process whose context is destroyed: hand the lease back.
                    c.release(&mut sim);
                });
            }
        });
        (used.iter().map(|u| u.load(Relaxed)).collect(), end - begin)
    }

    fn tenant(id: u32, kernel_us: u64) -> Tenant {
        Tenant {
            id,
            kernel_ns: kernel_us * 1000,
            depth: 8,
            stop_after: None,
        }
    }

    fn fractions(used: &[u64], wall: u64) -> Vec<f64> {
        used.iter().map(|&u| u as f64 / wall as f64).collect()
    }

    /// Each tenant's part of what they got together is `want` ± 8 points, and together they
    /// kept the engine mostly busy (loosely: the test threads compete for a few shared CPUs).
    fn assert_split(f: &[f64], want: &[f64]) {
        let total: f64 = f.iter().sum();
        assert!(total >= 0.6, "the engine idled: {f:?}");
        for (got, w) in f.iter().zip(want) {
            assert!((got / total - w).abs() < 0.08, "{f:?}, want {want:?}");
        }
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
    fn two_tenants_get_their_shares() {
        let t = Table::new(&[(0.25, 0.0), (0.75, 0.0)]);
        let (used, wall) = run(&t, &[tenant(1, 200), tenant(2, 200)], 1.5);
        let f = fractions(&used, wall);
        assert_split(&f, &[0.25, 0.75]);
    }

    #[test]
    fn three_tenants_with_mixed_kernels() {
        let t = Table::new(&[(0.2, 0.0), (0.5, 0.0), (0.3, 0.0)]);
        let (used, wall) = run(&t, &[tenant(1, 50), tenant(2, 1000), tenant(3, 300)], 1.5);
        let f = fractions(&used, wall);
        assert_split(&f, &[0.2, 0.5, 0.3]);
    }

    #[test]
    fn surplus_is_split_by_share() {
        // 0.2 and 0.4 guaranteed, 0.4 unreserved: both saturating get 1/3 and 2/3.
        let t = Table::new(&[(0.2, 0.0), (0.4, 0.0)]);
        let (used, wall) = run(&t, &[tenant(1, 200), tenant(2, 200)], 1.5);
        let f = fractions(&used, wall);
        assert_split(&f, &[1.0 / 3.0, 2.0 / 3.0]);
    }

    #[test]
    fn cap_holds_alone() {
        let t = Table::new(&[(0.0, 0.3)]);
        let (used, wall) = run(&t, &[tenant(1, 200)], 1.5);
        let f = fractions(&used, wall);
        assert!((f[0] - 0.3).abs() < 0.08, "{f:?}");
    }

    #[test]
    fn share_alone_takes_the_whole_device_solo() {
        let t = Table::new(&[(0.25, 0.0)]);
        let dev = SchedDevice::default();
        let p = SchedProc::default();
        let mut c = Client::new(&dev, 0, &t, 1, &p).unwrap();
        let free_at = AtomicU64::new(0);
        let mut sim = Sim::new(&free_at, 1000);
        assert!(!c.solo());
        let a = c.acquire(&mut sim);
        assert!(c.solo(), "{:?}", Lease::unpack(dev.lease.load(Relaxed)));
        assert!(a.throttled_ns < 100_000_000);
        let (used, wall) = run(&t, &[tenant(1, 200)], 1.0);
        assert!(
            fractions(&used, wall)[0] >= 0.85,
            "{:?}",
            fractions(&used, wall)
        );
    }

    #[test]
    fn idle_tenant_lends_its_time() {
        let t = Table::new(&[(0.5, 0.0), (0.5, 0.0)]);
        let quitter = Tenant {
            stop_after: Some(Duration::from_millis(200)),
            ..tenant(2, 200)
        };
        let (used, wall) = run(&t, &[tenant(1, 200), quitter], 1.5);
        let f = fractions(&used, wall);
        assert!(f[0] >= 0.85, "{f:?}");
        assert!(t.0[1].0.throttled_ns_total.load(Relaxed) > 0);
    }

    #[test]
    fn best_effort_gets_only_the_leftovers() {
        let t = Table::new(&[(0.5, 0.0), (0.0, 0.0)]);
        let (used, wall) = run(&t, &[tenant(1, 200), tenant(2, 200)], 1.0);
        let f = fractions(&used, wall);
        assert!(f[0] >= 0.8 && f[1] <= 0.1, "{f:?}");
    }

    #[test]
    fn a_dead_holder_loses_its_turn() {
        let t = Table::new(&[(0.5, 0.0), (0.5, 0.0)]);
        let dev = SchedDevice::default();
        let (p1, p2) = (SchedProc::default(), SchedProc::default());
        let free_at = AtomicU64::new(0);
        // Slice 2 wants the device, so slice 1 gets an ordinary lease, launches, and "dies".
        t.0[1].0.want_ns.store(now_ns(), Relaxed);
        t.0[1].0.waiters.store(1, Relaxed);
        let mut c1 = Client::new(&dev, 0, &t, 1, &p1).unwrap();
        let mut s1 = Sim::new(&free_at, 1_000_000);
        c1.acquire(&mut s1);
        assert_eq!(Lease::unpack(dev.lease.load(Relaxed)).holder, 1);
        assert!(!c1.solo());
        s1.launch();
        // Slice 1 "dies" here: it holds the lease and never launches or releases again.
        t.0[1].0.waiters.store(0, Relaxed);
        let mut c2 = Client::new(&dev, 0, &t, 2, &p2).unwrap();
        let mut s2 = Sim::new(&free_at, 1000);
        let a = c2.acquire(&mut s2);
        assert_eq!(Lease::unpack(dev.lease.load(Relaxed)).holder, 2);
        assert!(
            a.throttled_ns < 1_000_000_000,
            "waited {} ns",
            a.throttled_ns
        );
        assert_eq!(dev.takeovers_total.load(Relaxed), 1);
    }

    #[test]
    fn the_reaper_revokes_a_dead_holder_at_once() {
        let t = Table::new(&[(0.5, 0.0), (0.5, 0.0)]);
        let dev = SchedDevice::default();
        let (p1, p2) = (SchedProc::default(), SchedProc::default());
        let free_at = AtomicU64::new(0);
        t.0[1].0.want_ns.store(now_ns(), Relaxed);
        t.0[1].0.waiters.store(1, Relaxed);
        let mut c1 = Client::new(&dev, 0, &t, 1, &p1).unwrap();
        let mut s1 = Sim::new(&free_at, 1000);
        c1.acquire(&mut s1);
        assert_eq!(p1.holding_mask.load(Relaxed), 1);
        t.0[1].0.waiters.store(0, Relaxed);
        let stop = AtomicBool::new(false);
        std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                let mut c2 = Client::new(&dev, 0, &t, 2, &p2).unwrap();
                let mut s2 = Sim::new(&free_at, 1000);
                let a = c2.acquire(&mut s2);
                stop.store(true, Relaxed);
                a
            });
            std::thread::sleep(Duration::from_millis(1));
            on_process_dead(&dev, 0, &t, 1, &t.0[0].0, &p1);
            let a = h.join().unwrap();
            assert!(stop.load(Relaxed));
            assert!(a.throttled_ns < 1_000_000_000);
        });
        assert_eq!(p1.holding_mask.load(Relaxed), 0);
        assert_eq!(Lease::unpack(dev.lease.load(Relaxed)).holder, 2);
    }

    #[test]
    fn the_reaper_frees_a_dead_solo_holder() {
        let t = Table::new(&[(0.5, 0.0)]);
        let dev = SchedDevice::default();
        let p = SchedProc::default();
        let free_at = AtomicU64::new(0);
        let mut c = Client::new(&dev, 0, &t, 1, &p).unwrap();
        let mut sim = Sim::new(&free_at, 1000);
        c.acquire(&mut sim);
        assert!(c.solo());
        on_process_dead(&dev, 0, &t, 1, &t.0[0].0, &p);
        assert_eq!(Lease::unpack(dev.lease.load(Relaxed)), Lease::FREE);
    }

    #[test]
    fn a_newcomer_ends_a_solo_lease() {
        let t = Table::new(&[(0.5, 0.0), (0.5, 0.0)]);
        let dev = SchedDevice::default();
        let (p1, p2) = (SchedProc::default(), SchedProc::default());
        let free_at = AtomicU64::new(0);
        let mut c1 = Client::new(&dev, 0, &t, 1, &p1).unwrap();
        let mut s1 = Sim::new(&free_at, 1000);
        c1.acquire(&mut s1);
        assert!(c1.solo());
        // Slice 1 goes quiet while solo: the newcomer gets in within a few ms, not never.
        let mut c2 = Client::new(&dev, 0, &t, 2, &p2).unwrap();
        let mut s2 = Sim::new(&free_at, 1000);
        let a = c2.acquire(&mut s2);
        assert!(!c1.solo());
        assert!(a.throttled_ns < 500_000_000, "{}", a.throttled_ns);
    }

    #[test]
    fn stats_report_recent_use() {
        let dev = SchedDevice::default();
        let s = SchedSlice::default();
        let t0 = 10 * WINDOW_NS;
        charge(&dev, &s, 250_000, PPM, t0, t0 + WINDOW_NS / 4, u64::MAX);
        let st = slice_stats(&s, t0 + WINDOW_NS / 2);
        assert!((st.used_fraction - 0.25).abs() < 1e-6, "{st:?}");
        assert_eq!(st.gpu_ns_total, WINDOW_NS / 4);
        assert_eq!(s.vt.load(Relaxed), WINDOW_NS); // 0.25 s held at share 0.25
                                                   // Half a window later the old bucket still counts for half; two windows on, nothing.
        let st = slice_stats(&s, t0 + WINDOW_NS + WINDOW_NS / 2);
        assert!((st.used_fraction - 0.125).abs() < 1e-6, "{st:?}");
        assert_eq!(slice_stats(&s, t0 + 3 * WINDOW_NS).used_fraction, 0.0);
        assert!((device_stats(&dev, t0 + WINDOW_NS / 2).used_fraction - 0.25).abs() < 1e-6);
    }

    #[test]
    fn admission_keeps_guarantees_within_the_device() {
        assert!(admits(750_000, 250_000));
        assert!(!admits(750_000, 250_001));
        assert!(admits(0, PPM));
    }

    /// Queued work whose estimates are whatever a test says (a driver may measure anything).
    struct Fixed {
        queued: u64,
        next: u64,
        left: u64,
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
        let t = Table::new(&[(0.5, 1.0), (0.5, 1.0)]);
        let dev = SchedDevice::default();
        let proc = SchedProc::default();
        let mut c = Client::new(&dev, 0, &t, 1, &proc).unwrap();
        let now = now_ns();
        c.charged_until = now + 1_000_000_000;
        c.held_since = Some(c.charged_until);
        c.held_word = 12345; // not the current word: a renewal by another process
        c.busy_until = now;
        ordinary(&dev, 1, now + LEASE_NS);
        let mut w = Fixed {
            queued: 0,
            next: 1000,
            left: 0,
        };
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
        let t = Table::new(&[(0.5, 1.0), (0.5, 1.0)]);
        let dev = SchedDevice::default();
        let proc = SchedProc::default();
        let mut c = Client::new(&dev, 0, &t, 1, &proc).unwrap();
        let now = now_ns();
        c.charged_until = now + 1_000_000_000;
        c.held_since = Some(c.charged_until);
        c.busy_until = now + 2_000_000_000;
        ordinary(&dev, 2, 1000); // ended long ago
        c.acquire(&mut Fixed {
            queued: 0,
            next: 1000,
            left: 0,
        });
        assert_eq!(t.0[0].0.gpu_ns_total.load(Relaxed), 0);
        assert_eq!(Lease::unpack(dev.lease.load(Acquire)).holder, 1);
    }

    #[test]
    fn huge_estimates_saturate() {
        // A measurement can be anything (an f32 of ms saturated into u64): admitting, stretching
        // the lease, draining and charging must not overflow.
        let t = Table::new(&[(0.5, 1.0)]);
        let dev = SchedDevice::default();
        let proc = SchedProc::default();
        let mut c = Client::new(&dev, 0, &t, 1, &proc).unwrap();
        let now = now_ns();
        ordinary(&dev, 1, now + LEASE_NS);
        c.acquire(&mut Fixed {
            queued: 0,
            next: u64::MAX,
            left: 0,
        });
        let l = Lease::unpack(dev.lease.load(Acquire));
        assert!(l.end_ns <= now_ns() + MAX_LEASE_NS + 1000, "{l:?}");
        assert!(t.0[0].0.busy_until_ns.load(Relaxed) <= now_ns() + MAX_LEASE_NS);
        c.acquire(&mut Fixed {
            queued: u64::MAX,
            next: u64::MAX,
            left: u64::MAX,
        });
        // Alone and uncapped: the handoff renewed the lease to itself, solo.
        assert!(c.solo());
        assert!(c.charged_until <= now_ns() + MAX_LEASE_NS);
        assert!(t.0[0].0.gpu_ns_total.load(Relaxed) <= MAX_LEASE_NS + 1_000_000_000);
    }

    #[test]
    fn a_lease_already_over_hands_over_at_once() {
        let t = Table::new(&[(0.5, 1.0)]);
        let dev = SchedDevice::default();
        let proc = SchedProc::default();
        let mut c = Client::new(&dev, 0, &t, 1, &proc).unwrap();
        ordinary(&dev, 1, 1000);
        c.acquire(&mut Fixed {
            queued: 0,
            next: 1000,
            left: 0,
        });
        assert!(c.solo());
    }

    #[test]
    fn charging_tolerates_zero_shares_and_any_values() {
        let dev = SchedDevice::default();
        let s = SchedSlice::default();
        // Share 0 is best effort; cap 0 is no cap.
        charge(&dev, &s, 0, 0, 1_000, 2_000, 500);
        assert_eq!(s.vt.load(Relaxed), 500 * PPM as u64 / BEST_EFFORT_PPM);
        assert_eq!(s.cap_tat_ns.load(Relaxed), 0);
        // An end before the start charges nothing.
        charge(&dev, &s, 0, 1, 2_000, 1_000, 500);
        assert_eq!(s.gpu_ns_total.load(Relaxed), 500);
        // Values no sane process writes: saturate.
        s.cap_tat_ns.store(u64::MAX, Relaxed);
        s.window.start_ns.store(u64::MAX, Relaxed);
        dev.window.start_ns.store(u64::MAX - 1, Relaxed);
        charge(&dev, &s, 1, 1, 0, u64::MAX, u64::MAX);
        assert_eq!(s.cap_tat_ns.load(Relaxed), u64::MAX);
        let _ = slice_stats(&s, 0);
        let _ = device_stats(&dev, u64::MAX);
        assert!(!admits(u64::MAX, 1));
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
}
