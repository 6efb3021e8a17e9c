//! The lease word changing hands: [`install`] replaces it and wakes the sleepers when the
//! holder changes (every hand-over, renewal and takeover goes through it), and
//! [`on_process_dead`] revokes what a dead process held (the reaper's call).

use core::sync::atomic::Ordering::*;

use super::policy::{pick, Tenant, Tenants, WAKE_ALLOW_NS};
use super::records::{Lease, SchedDevice, SchedProc, SchedSlice};
use super::sys::Os;

/// Replace lease word `old` by `new` (one CAS) and wake sleepers if the holder changed.
pub(super) fn install(
    os: &dyn Os,
    dev: &SchedDevice,
    t: &dyn Tenants,
    old: u64,
    new: Lease,
    now: u64,
) -> bool {
    if let Some(Tenant { sched: s, .. }) = t.get(new.holder) {
        // Before the CAS, so a waiter never sees the new holder with a stale estimate. A failed
        // CAS leaves a harmless later estimate (it only delays an idle takeover).
        s.busy_until_ns.fetch_max(now + WAKE_ALLOW_NS, AcqRel);
    }
    // Before the CAS (a failed one only costs a spare settle), so whoever sees the new word
    // sees the new turn.
    dev.turn.fetch_add(1, AcqRel);
    if dev
        .lease
        .compare_exchange(old, new.pack(), AcqRel, Acquire)
        .is_err()
    {
        return false;
    }
    if let Some(Tenant { sched: s, .. }) = t.get(new.holder) {
        s.leases_total.fetch_add(1, Relaxed);
        dev.leases_total.fetch_add(1, Relaxed);
    }
    if Lease::unpack(old).holder != new.holder {
        dev.seq.fetch_add(1, Release);
        if dev.sleepers.load(Acquire) > 0 {
            os.futex_wake(&dev.seq);
        }
    }
    true
}

/// Revoke what a dead process held on one device: its place among its slice's waiters and, when
/// its slice holds the lease and no other process of the slice is launching under it, the lease.
/// Called by the reaper (ledger/monitor) with the dead process's records; idempotent. Waiters do
/// not depend on it (they take over an overdue lease themselves), it only makes the handoff
/// immediate.
pub fn on_process_dead(
    os: &dyn Os,
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
        let now = os.now_ns();
        // Other processes of the slice waiting for it: the slice may keep competing.
        let next = if slice.waiters.load(Acquire) > 0 {
            pick(t, now, 0, 0)
        } else {
            pick(t, now, 0, slice_id)
        };
        if install(os, dev, t, w, next, now) {
            dev.takeovers_total.fetch_add(1, Relaxed);
        }
    }
}
