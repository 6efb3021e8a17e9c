//! The execution engine: one per device for the whole node, a token in
//! [`crate::shared::DevState`] (`owner`, the holder's process slot + 1). A holder keeps it
//! while it has kernels; when another process waits, the holder hands it on round-robin after
//! a time slice, mid-kernel if need be (the kernel resumes later with its remaining time), like
//! the hardware's time-slice scheduler. Waiters sleep on a shared futex and check the holder is
//! alive, so a SIGKILLed holder never hangs anyone; a stopped holder loses the engine within
//! about a slice, and one that shows no sign of life for long loses it too. Apart from the executor because this is the only part that other
//! processes see: everything here is state in the shared file.

use crate::shared::{self, futex_wait, futex_wake, now_ns, DevState, Liveness, MAX_PROCS};
use std::sync::atomic::Ordering::*;

/// A live holder (not stopped) that shows no sign of life for this long loses the engine to a
/// waiter: tolerant, since on a busy host a holder may be descheduled for a while.
const STALL_NS: u64 = 200_000_000;

/// Whether process slot `me` holds `dev`'s engine.
pub(super) fn holds(dev: &DevState, me: usize) -> bool {
    dev.owner.load(Acquire) == me as u32 + 1
}

/// Whether a process other than slot `me` waits for physical device `phys`'s engine.
pub(super) fn others_want(state: &shared::State, phys: usize, me: usize) -> bool {
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

/// Take `dev`'s engine for slot `me`: sleep until it is free or handed to us, taking it over
/// from a dead or stopped holder. `slice_ns` is the engine's time slice: how long a waiter
/// waits before it judges the holder.
pub(super) fn acquire(node: &shared::Node, dev: &DevState, phys: usize, slice_ns: u64) {
    let (state, me) = (node.state, node.slot);
    let mine = me as u32 + 1;
    // Between 1 and 10 ms: a short configured slice must not turn waiters into /proc pollers.
    let period = slice_ns.clamp(1_000_000, 10_000_000);
    let mut checked = now_ns();
    loop {
        // Refreshed at every pass (at least every `period`): a waiter that stops refreshing
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
        if now - checked >= period {
            checked = now;
            if take_over(node, dev, o, mine, now, period) {
                break;
            }
        }
        futex_wait(&dev.seq, seq, period);
    }
    dev.beat.store(now_ns(), Relaxed);
    state.procs[me].want[phys].store(0, Release);
}

/// Judge holder `o` for a waiter `mine` that has waited `period`: reap it when dead, take the
/// engine from it when it is stopped or has shown no sign of life for [`STALL_NS`]. Whether
/// the engine is now ours.
///
/// A working holder plans (and beats) at least once a slice, so the holder is judged (its
/// slot lock, /proc) only when it has been silent longer: off the path of an engine that is
/// merely contended. A stopped process's CPU side cannot hold a real GPU (the hardware
/// time-slices contexts on its own), so it loses the engine within about a slice when the
/// waiter can see its state (/proc of a PID namespace that holds it); a live but silent one
/// (descheduled on a busy host), or one of a PID namespace the waiter cannot see, keeps it up
/// to [`STALL_NS`], since its kernels would still be running.
fn take_over(
    node: &shared::Node,
    dev: &DevState,
    o: u32,
    mine: u32,
    now: u64,
    period: u64,
) -> bool {
    let silent = now.saturating_sub(dev.beat.load(Relaxed));
    if silent <= period {
        return false;
    }
    let lost = match shared::slot_liveness(node, o as usize - 1) {
        Liveness::Dead => {
            shared::reap(node);
            return false;
        }
        Liveness::Stopped => true,
        Liveness::Live => silent > STALL_NS,
    };
    lost && dev.owner.compare_exchange(o, mine, AcqRel, Acquire).is_ok()
}

/// Hand `dev`'s engine on, round-robin to the next waiter (or to nobody), after work planned
/// up to `cursor`.
pub(super) fn release(state: &shared::State, dev: &DevState, phys: usize, me: usize, cursor: u64) {
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
