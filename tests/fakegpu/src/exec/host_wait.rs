//! How a synchronizing call waits on the host for work that ends at a known simulated time,
//! the way the driver does: by the context's `CU_CTX_SCHED_*` flag, or blocking for an event
//! made with `CU_EVENT_BLOCKING_SYNC`. Apart from the executor because it is the caller's
//! thread that waits, under the caller's context's policy.
//!
//! The driver's default (`CU_CTX_SCHED_AUTO`) spins while the process has no more active
//! contexts than the machine has CPUs, which is nearly always: a thread in
//! `cuStreamSynchronize` sees its kernel end within microseconds and launches the next at
//! once. A fake that slept to the end instead woke 50-200 µs late on a busy host (timer slack,
//! then a CPU to run on), and left a launcher that waits for each 1 ms kernel only 0.80-0.90
//! of the device, which no real GPU does. Unlike the driver the fake knows when the work ends,
//! so it sleeps until [`SPIN_NS`] before and spins (or yields) only the rest: the same moment
//! seen, for a fraction of the CPU. And it spins only when the device would idle until the
//! thread is back, i.e. when the process has nothing queued past the awaited end: a waiter
//! behind which more of its work runs (a launcher eight deep) sleeps to the end, as late as
//! the host makes it, at no cost to the device. The driver would spin there too; on this
//! project's 2-CPU hosts that CPU is what the scheduler's hand-overs need.

use crate::shared::{now_ns, sleep_until};
use gpuslice_abi::*;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// How long before the end a spinning or yielding wait stops sleeping: above a busy host's
/// usual wake-up lateness (timer slack is 50 µs), small against the kernels tests run.
const SPIN_NS: u64 = 200_000;

/// Contexts of this process that are active (created and not destroyed, or primaries
/// retained): the `C` of `CU_CTX_SCHED_AUTO`'s heuristic.
static ACTIVE_CONTEXTS: AtomicUsize = AtomicUsize::new(0);

/// One more (`true`) or one fewer active context.
pub fn context_active(active: bool) {
    if active {
        ACTIVE_CONTEXTS.fetch_add(1, AcqRel);
    } else {
        // Never below zero, whatever order a racing destroy and reset come in.
        let _ = ACTIVE_CONTEXTS.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
    }
}

/// A host thread's way of waiting for the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostWait {
    Spin,
    Yield,
    Block,
}

impl HostWait {
    /// The wait of a context with flags `ctx_flags`.
    pub fn of_context(ctx_flags: u32) -> HostWait {
        match ctx_flags & CU_CTX_SCHED_MASK {
            CU_CTX_SCHED_SPIN => HostWait::Spin,
            CU_CTX_SCHED_YIELD => HostWait::Yield,
            CU_CTX_SCHED_BLOCKING_SYNC => HostWait::Block,
            _ => auto(ACTIVE_CONTEXTS.load(Acquire), cpus()),
        }
    }

    /// The wait of `cuEventSynchronize` on an event made with `event_flags`, in the calling
    /// thread's current context (the driver's default when it has none).
    pub fn of_event(event_flags: u64) -> HostWait {
        let ctx_flags = crate::runtime::get_current()
            .ok()
            .flatten()
            .map_or(CU_CTX_SCHED_AUTO, |c| c.flags.load(Relaxed));
        event_wait(event_flags, ctx_flags)
    }

    /// Return once real time reaches `t` (ns on the fake's clock). `more_queued`: the process
    /// has work planned or queued past `t`, so a late return idles nothing.
    pub fn until(self, t: u64, more_queued: bool) {
        match self {
            HostWait::Block => sleep_until(t),
            _ if more_queued => sleep_until(t),
            HostWait::Spin | HostWait::Yield => {
                sleep_until(t.saturating_sub(SPIN_NS));
                while now_ns() < t {
                    if self == HostWait::Yield {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        }
    }
}

/// A blocking-sync event blocks whatever its context says.
fn event_wait(event_flags: u64, ctx_flags: u32) -> HostWait {
    if event_flags & CU_EVENT_BLOCKING_SYNC as u64 != 0 {
        HostWait::Block
    } else {
        HostWait::of_context(ctx_flags)
    }
}

/// `CU_CTX_SCHED_AUTO`: spin while the process's active contexts are no more than the CPUs.
fn auto(contexts: usize, cpus: usize) -> HostWait {
    if contexts > cpus {
        HostWait::Yield
    } else {
        HostWait::Spin
    }
}

/// The CPUs this process may run on, read once.
fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_flag_decides_and_a_blocking_event_always_blocks() {
        assert_eq!(HostWait::of_context(CU_CTX_SCHED_SPIN), HostWait::Spin);
        assert_eq!(HostWait::of_context(CU_CTX_SCHED_YIELD), HostWait::Yield);
        assert_eq!(
            HostWait::of_context(CU_CTX_SCHED_BLOCKING_SYNC | 0x8),
            HostWait::Block,
            "other context flags do not matter"
        );
        assert_eq!(
            event_wait(CU_EVENT_BLOCKING_SYNC as u64, CU_CTX_SCHED_SPIN),
            HostWait::Block
        );
        assert_eq!(
            event_wait(CU_EVENT_DISABLE_TIMING as u64, CU_CTX_SCHED_YIELD),
            HostWait::Yield
        );
    }

    #[test]
    fn auto_spins_until_the_process_has_more_contexts_than_cpus() {
        assert_eq!(auto(1, 2), HostWait::Spin);
        assert_eq!(auto(2, 2), HostWait::Spin);
        assert_eq!(auto(3, 2), HostWait::Yield);
    }

    #[test]
    fn a_wait_returns_at_the_end_and_not_before() {
        for w in [HostWait::Spin, HostWait::Yield, HostWait::Block] {
            for more in [false, true] {
                let end = now_ns() + 3_000_000;
                w.until(end, more);
                assert!(now_ns() >= end, "{w:?} returned early");
            }
        }
        // An end in the past returns at once.
        HostWait::Spin.until(0, false);
    }
}
