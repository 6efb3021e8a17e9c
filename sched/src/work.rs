//! The process's queued GPU work as the scheduler sees it ([`Work`]; the shim implements it
//! with CUDA events, the unit tests with a simulated engine), and the least-measurement filter
//! ([`least_of`]) the slice's queue bound counts launches in.

/// The process's queued GPU work on one device, as the [`crate::Client`] needs to see it.
pub trait Work {
    /// Estimated GPU ns of work queued and not yet complete (may poll completions).
    fn outstanding_ns(&mut self) -> u64;
    /// Estimated GPU ns of the launch about to be admitted.
    fn next_ns(&mut self) -> u64;
    /// The least GPU ns a launch like the one about to be admitted was recently measured at
    /// ([`least_of`]): its time when no other context's work interleaved with it. What the
    /// slice's processes queue together is counted in it ([`crate::SchedSlice::queue_in_turn`]): a
    /// measurement includes the time the engine served siblings' contexts, so a sum of
    /// [`Work::next_ns`] over N busy processes counts their work about N times.
    fn next_least_ns(&mut self) -> u64 {
        self.next_ns()
    }
    /// Wait until all queued work is complete; returns when it completed (ns, ≤ now).
    fn drain(&mut self) -> u64;
    /// When the queued work was seen complete (ns, ≤ now), if all of it is (may poll
    /// completions); `None` while some is pending, or when it cannot tell.
    fn finished_at(&mut self) -> Option<u64> {
        None
    }
    /// Wait until the queued work is estimated to need at most `ns` more; returns that estimate.
    fn wait_below(&mut self, ns: u64) -> u64;
    /// Launches queued and not yet complete (may poll completions).
    fn pending(&mut self) -> usize;
    /// Wait until at most `n` launches are pending (never spins; gives up after a while on a
    /// launch that never completes).
    fn wait_pending(&mut self, n: usize);
    /// Until `until_ns`, the scheduler counts queued work in launches ([`Work::pending`]): a
    /// tracker that samples launches must track each one meanwhile.
    fn track_each(&mut self, _until_ns: u64) {}
}

/// The least recent measurement of a launch, after measuring `ns` (`least` before): a lower
/// one is taken at once; a higher one raises it by a sixteenth of the difference, so the time
/// a launch takes when it runs alone is remembered while other contexts' work inflates most
/// measurements, and a launch that really got longer is followed within tens of measurements.
pub fn least_of(least: u64, ns: u64) -> u64 {
    if ns <= least {
        ns.max(1)
    } else {
        least.saturating_add((ns - least) / 16)
    }
}
