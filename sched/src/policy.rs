//! The pure policy: which slice gets the device next, what a turn costs, and when a lease is
//! overdue. Functions of the records and an explicit `now`, no clock and no syscall, so the
//! same code can run in a tenant (personal mode) or in a monitor granting turns (node mode),
//! and tests drive it with any time they like.
//!
//! Weighted fair queuing over GPU time: a slice's virtual time grows by the GPU time its
//! launches used during its turns, divided by its share (best-effort slices weigh
//! [`BEST_EFFORT_PPM`]); the lease goes to the competing slice with the least virtual time. A cap
//! is a GCRA budget (`cap_tat_ns`): a slice is eligible once the GPU time it used, divided by
//! its cap, has been "paid" by the clock.
//!
//! Node mode drives the same functions from the monitor's `turns` thread
//! (`monitor/src/turns.rs`): [`Tenants`] over the policy's slice records, which only the
//! monitor writes (so virtual time and cap budgets cannot be forged), demand read from each
//! process's slot in its slice's region (clamped: tenant-written), [`pick`] when a grant ends,
//! [`charge`] of the span it granted; the tenant's side is `granted.rs`.

use core::sync::atomic::Ordering::*;

use super::records::{Lease, SchedDevice, SchedSlice, CLASS_LATENCY};
use gpuslice_quantity::{Cap, Share, PPM};

/// Length of an ordinary lease: long enough that handoffs (futex wake + first launch, 0.1-1 ms
/// on a loaded machine, mostly hidden by [`HANDOFF_LEAD_NS`]) cost little, short enough that
/// shares hold over 1 s windows (200 turns a second).
pub const LEASE_NS: u64 = 5_000_000;
/// Longest a lease may be extended for a single kernel longer than [`LEASE_NS`].
pub const MAX_LEASE_NS: u64 = 200_000_000;
/// A holder hands over when its queued work needs about this much more: a wake-up and a first
/// launch of the next holder, so the engine does not idle between turns. 300 µs was too short
/// on a busy 2-core host (the engine idled at most handovers, and a two-process slice next to a
/// one-process slice got 0.52-0.55 of the device at equal shares, `docs/benchmarks/2026-12-01.md`).
pub const HANDOFF_LEAD_NS: u64 = 1_000_000;
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
/// A latency slice that waited or launched this recently is active.
pub const LATENCY_ACTIVE_NS: u64 = 100_000_000;
/// While a latency slice is active, a normal holder keeps at most one launch in flight, and
/// none estimated at more than this (so the latency slice waits about one of its kernels, not
/// its whole queue).
pub const LATENCY_QUEUE_NS: u64 = 500_000;
/// A latency slice's lease is idle this soon after its queued work ran out.
pub const LATENCY_IDLE_GRACE_NS: u64 = 300_000;
/// How far (virtual ns) a latency slice may be ahead of the least virtual time of the others
/// and still be served first: the bound on what priority can take from their guarantees.
pub const LATENCY_LEAD_NS: u64 = 20_000_000;
/// One live slice of a device, as the scheduler sees it.
#[derive(Clone, Copy)]
pub struct Tenant<'a> {
    /// The ledger's slice index + 1 (0 is nobody).
    pub id: u32,
    /// Its scheduler state.
    pub sched: &'a SchedSlice,
    /// Its guaranteed share.
    pub share: Share,
    /// Its cap.
    pub cap: Cap,
}

/// The slices that may compete for one device, as the scheduler sees them.
pub trait Tenants {
    /// Calls `f` for every live slice on the device.
    fn each(&self, f: &mut dyn FnMut(Tenant<'_>));
    /// The slice with id `id`, if it is live and on the device.
    fn get(&self, id: u32) -> Option<Tenant<'_>>;
}

/// The cap's ceiling in ppm when it caps anything.
fn cap_ppm(cap: Cap) -> Option<u64> {
    cap.limit().map(|c| c.ppm() as u64)
}

pub(crate) fn capped(cap: Cap) -> bool {
    !cap.is_none()
}

pub(crate) fn weight(share: Share) -> u64 {
    if share.is_none() {
        BEST_EFFORT_PPM
    } else {
        share.ppm() as u64
    }
}

/// A slice gets a solo lease only once the others have neither waited nor held the device for
/// this long (`SchedSlice::want_ns`): a slice between two bursts of launches (synchronizing,
/// its own last kernels still running) is not gone, and a solo holder's queue is neither
/// bounded nor charged. Without it two tenants that synchronize every few turns each got the
/// device solo while the other synchronized, and split it evenly whatever their shares
/// (issue 20: a PyTorch pair at 0.25 / 0.75 at 0.50 / 0.50).
pub const SOLO_QUIET_NS: u64 = 50_000_000;

/// Whether a slice other than `id` waited or held the device within [`SOLO_QUIET_NS`].
fn recently_active_other(t: &dyn Tenants, id: u32, now: u64) -> bool {
    let mut active = false;
    t.each(&mut |o| {
        if o.id != id && now.saturating_sub(o.sched.want_ns.load(Acquire)) < SOLO_QUIET_NS {
            active = true;
        }
    });
    active
}

/// Whether a process of the slice waited or launched recently (its heartbeat is fresh).
pub(crate) fn fresh(s: &SchedSlice, now: u64) -> bool {
    now.saturating_sub(s.want_ns.load(Acquire)) < WANT_STALE_NS
}

/// Whether the slice competes for the lease: a process of it is waiting now (the count) and
/// alive (the heartbeat: a waiter killed asleep leaves the count high but stops refreshing).
/// A slice that just stopped launching does not compete, so its turn is not offered to it.
pub(crate) fn wants(s: &SchedSlice, now: u64) -> bool {
    s.waiters.load(Acquire) > 0 && fresh(s, now)
}

/// Admission of compute guarantees: whether a slice guaranteeing `new` fits on a device whose
/// slices already guarantee `reserved_ppm` in all (Σ ≤ 1.0; a sum of shares, which may pass
/// one share's range). The ledger's attach path applies this rule when it reserves
/// `Device::compute_reserved`.
pub fn admits(reserved_ppm: u64, new: Share) -> bool {
    reserved_ppm.saturating_add(new.ppm() as u64) <= PPM as u64
}

/// Charge slice `s` (share `share`, cap `cap`) for a turn on the device from `start` to
/// `end` during which its launches used `busy` ns of GPU time: it pays the GPU time, at most the
/// span (a launcher that leaves the engine idle during its turn is not charged for the idle
/// time; concurrent streams are not charged more than the device).
pub fn charge(
    dev: &SchedDevice,
    s: &SchedSlice,
    share: Share,
    cap: Cap,
    start: u64,
    end: u64,
    busy: u64,
) {
    let d = end.saturating_sub(start).min(busy);
    if d == 0 {
        return;
    }
    // `busy` sums the shim's estimates (anything a driver measured): saturate, never wrap.
    s.vt.fetch_add(d.saturating_mul(PPM as u64) / weight(share), AcqRel);
    if let Some(cap_ppm) = cap_ppm(cap) {
        let inc = d.saturating_mul(PPM as u64) / cap_ppm;
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
///
/// Guaranteed slices come first: a best-effort slice is picked only when no guaranteed slice
/// competes (best-effort slices share only what is not guaranteed, however many there are,
/// and their virtual times are compared only with each other's). A competing latency-class
/// slice goes first among its kind, unless its virtual time is more than [`LATENCY_LEAD_NS`]
/// ahead of the least one (priority decides the order, never more than that much of the
/// others' guarantees).
pub fn pick(t: &dyn Tenants, now: u64, renewing: u32, exclude: u32) -> Lease {
    // Keys (best-effort, vt): guaranteed slices sort first.
    let mut best: Option<((bool, u64), u32, Cap)> = None; // (key, id, cap)
    let mut urgent: Option<((bool, u64), u32, Cap)> = None; // the same among latency slices
    let mut competing = 0;
    let mut latency_recent = false;
    t.each(&mut |Tenant {
                     id,
                     sched: s,
                     share,
                     cap,
                 }| {
        let latency = s.class.load(Relaxed) == CLASS_LATENCY;
        if latency && now.saturating_sub(s.want_ns.load(Acquire)) < LATENCY_ACTIVE_NS {
            latency_recent = true;
        }
        if id == exclude || !(id == renewing || wants(s, now)) {
            return;
        }
        competing += 1;
        if capped(cap) && s.cap_tat_ns.load(Acquire) > now {
            return;
        }
        let key = (share.is_none(), s.vt.load(Acquire));
        if best.is_none_or(|(b, _, _)| key < b) {
            best = Some((key, id, cap));
        }
        if latency && urgent.is_none_or(|(u, _, _)| key < u) {
            urgent = Some((key, id, cap));
        }
    });
    if let (Some(u), Some(b)) = (urgent, best) {
        if u.0 .0 == b.0 .0 && u.0 .1 <= b.0 .1.saturating_add(LATENCY_LEAD_NS) {
            best = Some(u);
        }
    }
    match best {
        None => Lease::FREE,
        // Never solo over a holder being taken over: it may well come back, and a solo lease
        // is not charged. A holder that is really gone stops competing once its heartbeat is
        // stale, and the next renewal is solo.
        // Nor for a normal slice while a latency slice is active: a solo holder's queue is
        // not bounded, and the latency slice would wait behind all of it.
        Some((_, id, cap))
            if competing == 1
                && exclude == 0
                && !capped(cap)
                && (!latency_recent || urgent.is_some_and(|u| u.1 == id))
                && !recently_active_other(t, id, now) =>
        {
            Lease {
                holder: id,
                solo: true,
                end_ns: 0,
            }
        }
        Some((_, id, _)) => Lease {
            holder: id,
            solo: false,
            end_ns: now + LEASE_NS,
        },
    }
}

/// A slice that neither waited, held the device nor had work queued for this long, and asks
/// again, is *returning*: it starts where the slices competing now stand ([`rejoin`]). As long
/// as a waiter's heartbeat stays fresh ([`WANT_STALE_NS`]): a process the CPU does not run for
/// tens of ms on a busy host is not idle, and must not lose the virtual time it is owed (20 ms
/// cut a 0.5 slice to 0.37 with every CPU busy).
pub const RETURN_NS: u64 = WANT_STALE_NS;
/// How much GPU time (at its share) a returning slice may stay behind the slices competing now:
/// a debt of its own overrun is paid back, a debt older than this is forgiven (a slice that was
/// away does not starve behind a newcomer that started from zero).
pub const REJOIN_DEBT_NS: u64 = 200_000_000;

/// Where slice `id` starts when it begins to compete again ([`RETURN_NS`]) or when a solo
/// holder (`holder`) is joined: at least the least virtual time of the slices of its kind
/// (guaranteed, or best-effort) competing now (waiting, or holding the lease), so idling earns
/// no burst; at most [`REJOIN_DEBT_NS`] of its own GPU time beyond it. Only slices competing
/// now set it, never a device-wide floor: an idle, lightly used or best-effort slice cannot
/// push anyone's clock (issue 20: best-effort slices, whose virtual time runs 100x faster than
/// their GPU time, raised the floor a newcomer started from so far that it waited for minutes).
/// Nobody of its kind competing: its own clock stands.
pub fn rejoin(t: &dyn Tenants, id: u32, holder: u32, now: u64) {
    let Some(Tenant {
        sched: me, share, ..
    }) = t.get(id)
    else {
        return;
    };
    let best_effort = share.is_none();
    let mut least = u64::MAX;
    t.each(&mut |o| {
        if o.id != id && o.share.is_none() == best_effort && (o.id == holder || wants(o.sched, now))
        {
            least = least.min(o.sched.vt.load(Acquire));
        }
    });
    if least == u64::MAX {
        return;
    }
    let most = least.saturating_add(REJOIN_DEBT_NS.saturating_mul(PPM as u64) / weight(share));
    // Lock-free read-modify-write of the slice's own clock.
    let _ = me
        .vt
        .fetch_update(AcqRel, Acquire, |v| Some(v.clamp(least, most)));
}

/// How long a holder's queued work must have run out before its lease counts as idle: a
/// latency slice's requests are short bursts, so its turn ends soon after a burst does (it
/// gets the device back at its next launch). The monitor's turns (node mode) use it too.
pub fn idle_grace(s: &SchedSlice) -> u64 {
    if s.class.load(Relaxed) == CLASS_LATENCY {
        LATENCY_IDLE_GRACE_NS
    } else {
        IDLE_GRACE_NS
    }
}

/// Whether a waiter may take the lease from its holder at `now`, if it may.
pub fn takeover_due(t: &dyn Tenants, l: Lease, now: u64) -> bool {
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
        Some(h) => {
            now > h
                .sched
                .busy_until_ns
                .load(Acquire)
                .saturating_add(idle_grace(h.sched))
        }
    }
}

/// When a waiter should look again at lease `l` if nothing wakes it.
pub fn recheck_at(t: &dyn Tenants, me: &SchedSlice, l: Lease, now: u64) -> u64 {
    let by = if l.holder == 0 {
        // Nobody eligible: the earliest a cap budget frees, ours at least.
        me.cap_tat_ns.load(Acquire).max(now + 100_000)
    } else {
        let idle = t.get(l.holder).map_or(now, |h| {
            h.sched
                .busy_until_ns
                .load(Acquire)
                .saturating_add(idle_grace(h.sched))
        });
        (l.end_ns + GRACE_NS).min(idle)
    };
    by.clamp(now + 50_000, now + MAX_SLEEP_NS)
}
