//! Compute figures of a slice (used fraction, launches, throttled time), read from the
//! scheduler's part of the ledger ([`gpuslice_sched::slice_stats`]).

use core::sync::atomic::Ordering::Relaxed;

use gpuslice_ledger::Ledger;
use gpuslice_sched::{class_name, now_ns, slice_stats};

/// A slice's compute figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SliceCompute {
    /// Fraction of the device's time used over the scheduler's last window (0..1).
    pub used: f64,
    /// Launches gated (counter).
    pub launches: u64,
    /// Seconds launches waited for their turn (counter).
    pub throttled_seconds: f64,
    /// Priority class, `latency` or `normal` (the scheduler's record is where it lives).
    pub priority: &'static str,
}

/// The figures of slice record `slice`.
pub fn slice_compute(ledger: &Ledger, slice: usize) -> SliceCompute {
    let Some(s) = ledger.slices().get(slice) else {
        return SliceCompute {
            used: 0.0,
            launches: 0,
            throttled_seconds: 0.0,
            priority: "normal",
        };
    };
    let st = slice_stats(&s.sched, now_ns());
    SliceCompute {
        used: st.used_fraction.clamp(0.0, 1.0),
        launches: st.launches_total,
        throttled_seconds: st.throttled_ns_total as f64 / 1e9,
        priority: class_name(s.sched.class.load(Relaxed)),
    }
}
