//! The execution engine: one per device for the whole node, a token in
//! [`crate::shared::DevState`] (`owner`, the holder's process slot + 1). A holder keeps it
//! while it has kernels; when another process waits, the holder hands it on round-robin after
//! a time slice, mid-kernel if need be (the kernel resumes later with its remaining time), like
//! the hardware's time-slice scheduler. Waiters sleep on a shared futex and check the holder is
//! alive, so a SIGKILLed holder never hangs anyone, and a holder that shows no sign of life
//! loses the engine. Apart from the executor because this is the only part that other
//! processes see: everything here is state in the shared file.

use crate::shared::{self, futex_wait, futex_wake, now_ns, DevState, MAX_PROCS};
use std::sync::atomic::Ordering::*;

/// A holder that shows no sign of life for this long loses the engine to a waiter.
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
/// from a dead or stopped holder.
pub(super) fn acquire(state: &shared::State, dev: &DevState, phys: usize, me: usize) {
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
