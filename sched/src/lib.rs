//! The compute scheduler of gpuslice: who may launch on a device, and when (policy, the
//! records it keeps in the ledger's shared memory, and a simulation to test it on).
//!
//! Kernels of different processes already time-share a GPU, so a share is enforced by deciding
//! who may *launch*: each device has one **lease** word in the ledger naming the slice whose
//! processes may launch now and until when. The parts meet like this:
//!
//! - `records.rs`: [`SchedDevice`], [`SchedSlice`], [`SchedProc`] live inside the ledger's
//!   `Device`, `Slice` and `Proc` records (shared memory, all-zero = idle, atomics only, no
//!   locks): the lease word, each slice's virtual time, cap budget, heartbeat and statistics.
//!   They are part of the file format.
//! - `policy.rs`: the pure policy ([`pick`], [`charge`], [`takeover_due`], [`recheck_at`]):
//!   functions of the records and an explicit time, no clock, no syscall.
//! - `client.rs`: [`Client`] is one process's side of one device (process-local, not shared): before each
//!   launch the shim asks it for admission; it sleeps on a futex in the ledger while another
//!   slice holds the lease, waits for its own queued work when its lease ends, charges the GPU
//!   time its launches used, and hands the lease to the next slice.
//! - `lease.rs`: the lease word changing hands (`install`: every hand-over, renewal and
//!   takeover; [`on_process_dead`]: what a dead process held).
//! - `work.rs`: [`Work`] is how a `Client` sees the process's queued GPU work (the shim
//!   implements it with CUDA events; the unit tests with a simulated engine).
//! - `sys.rs`: [`Os`], the clock and the futex, injected ([`SYSTEM`] is the real one); the
//!   unit tests run the same code on a simulated clock and CPU (`sim/`), deterministically.
//! - `granted.rs`: node mode, where the monitor grants the turns ([`Granted`], [`GrantProc`]);
//!   [`Scheduler`] is either client behind one set of methods (what the shim holds).
//! - `turns.rs`: node mode's grantor, [`DeviceTurns`]: one device's turns as the monitor's
//!   thread drives them, and every write the monitor makes into the policy's records.
//! - [`slice_stats`] and [`on_process_dead`] are for the monitor and the reaper (the ledger's
//!   adapter, `tenants.rs`, calls it for each dead process); [`SchedSlice::reset`] for the ledger
//!   when it reuses a slice record.
//!
//! Algorithm: weighted fair queuing over GPU time. A slice's virtual time grows by the GPU time
//! its launches used during its turns, divided by its share (best-effort slices weigh
//! [`BEST_EFFORT_PPM`]); the lease goes to the waiting slice with the least virtual time, so
//! under contention each gets its share and the surplus is split by share. Only slices with a
//! fresh heartbeat compete (work-conserving); a slice coming back, or joining a solo holder,
//! starts where the slices of its kind competing now stand ([`rejoin`]), so idling earns no
//! burst and no idle, lightly used or best-effort slice sets anyone's start. Best-effort slices
//! get the device only while no guaranteed slice competes. A cap is a GCRA budget (`cap_tat`): a slice is
//! eligible only once the GPU time it used, divided by its cap, has been "paid" by the clock. A
//! slice alone and uncapped (no other slice waited or held the device for [`SOLO_QUIET_NS`])
//! gets a **solo** lease: its processes launch after one load of the lease word, with no clock,
//! no event and no syscall; a newcomer turns the solo lease into an ordinary one and waits for
//! it to end.
//!
//! A lease ends on time because its holder stops launching once its estimated queued work would
//! run past the lease end, then waits until about [`HANDOFF_LEAD_NS`] of it is left (so a deep
//! asynchronous queue is paid for by whoever queued it, and the next holder's first kernel meets
//! a busy engine). The GPU time charged is the estimated time of the launches admitted in the
//! turn (the shim measures each launch with events), at most the turn's span: a launcher too
//! slow to keep the engine busy is not charged for the idle time. The next holder's charge
//! starts after the span the previous one was charged, and what a holder left queued past its
//! charge is paid by it once it sees it done ([`Work::finished_at`]); a holder taken over
//! without launching pays for the turn it held idle. In node mode the monitor charges the span
//! granted plus what the slice's processes left queued past it, and grants the next turn once
//! that is about done (at most 5 ms past the lease, `turns.rs`). In both modes the slice's
//! processes together queue at most a turn ([`SchedSlice::queue_in_turn`]), each launch
//! counted at its least recent measurement ([`Work::next_least_ns`]). Nothing waits on a holder
//! forever: a lease whose end is [`GRACE_NS`] past, or whose holder's queued work ran out
//! [`IDLE_GRACE_NS`] ago with nothing new launched, is taken over by any waiter, so a holder
//! that dies, hangs or goes idle loses its turn within milliseconds without the monitor. A
//! waiter that dies stops refreshing its heartbeat and stops competing after
//! [`WANT_STALE_NS`].

#![deny(missing_docs)]

mod client;
mod granted;
mod lease;
mod policy;
mod records;
mod rings;
#[cfg(test)]
mod sim;
mod sys;
#[cfg(test)]
mod tests;
mod turns;
mod work;

pub use client::{Admission, Client};
pub use granted::{
    GrantProc, GrantWords, Granted, Scheduler, MONITOR_BEAT_NS, MONITOR_STALE_NS,
    NODE_HANDOFF_LEAD_NS,
};
pub use lease::on_process_dead;
pub use policy::{
    admits, charge, charge_solo, idle_grace, pick, recheck_at, rejoin, takeover_due, Tenant,
    Tenants, BEST_EFFORT_PPM, CAP_SLACK_NS, GRACE_NS, HANDOFF_LEAD_NS, IDLE_GRACE_NS,
    LATENCY_ACTIVE_NS, LATENCY_LEAD_NS, LATENCY_QUEUE_NS, LEASE_NS, MAX_LEASE_NS, MAX_SLEEP_NS,
    REJOIN_DEBT_NS, RETURN_NS, SOLO_QUIET_NS, WAKE_ALLOW_NS, WANT_STALE_NS,
};
pub use records::{
    class_name, parse_class, slice_stats, used_fraction, Lease, SchedDevice, SchedProc, SchedSlice,
    SliceComputeStats, Window, CLASS_LATENCY, CLASS_NORMAL, MAX_SLICE_ID, WINDOW_NS,
};
pub use rings::Rings;
pub use sys::{Os, SystemOs, SYSTEM};
pub use turns::{
    beat, DeviceTurns, Member, DRAIN_HOLD_NS, HAND_BACK_POLL_NS, HAND_BACK_WINDOW_NS, MAX_GRANT_NS,
    POLL_NS, POLL_SOLO_NS, SETTLE_SLACK_NS,
};
pub use work::{least_of, Work};

/// CLOCK_MONOTONIC in ns, the clock of every timestamp here ([`SYSTEM`]'s).
pub fn now_ns() -> u64 {
    crate::sys::now_ns()
}
