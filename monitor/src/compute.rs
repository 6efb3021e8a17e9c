//! Compute figures of a slice (used fraction, launches, throttled time), read from the
//! scheduler's part of the ledger ([`gpuslice_sched::slice_stats`]).

use core::sync::atomic::Ordering::Relaxed;

use gpuslice_ledger::Ledger;
use gpuslice_sched::{class_name, slice_stats, used_fraction};

/// A slice's compute figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SliceCompute {
    /// `compute_used`: the slice's part of the device's busy time over the scheduler's last
    /// second (see [`shares_of_busy_time`]).
    pub used: f64,
    /// GPU ns charged to the slice over that second.
    pub window_ns: f64,
    /// Launches gated (counter).
    pub launches: u64,
    /// Seconds launches waited for their turn (counter).
    pub throttled_seconds: f64,
    /// Priority class, `latency` or `normal` (the scheduler's record is where it lives).
    pub priority: &'static str,
}

/// The figures of slice record `slice` at `now_ns` (CLOCK_MONOTONIC).
pub fn slice_compute(ledger: &Ledger, slice: usize, now_ns: u64) -> SliceCompute {
    let none = SliceCompute {
        used: 0.0,
        window_ns: 0.0,
        launches: 0,
        throttled_seconds: 0.0,
        priority: "normal",
    };
    let Some(s) = ledger.slices().get(slice) else {
        return none;
    };
    let Some(d) = ledger.devices().get(s.device.load(Relaxed) as usize) else {
        return none;
    };
    let st = slice_stats(&d.sched, &s.sched, now_ns);
    SliceCompute {
        used: st.used_fraction,
        window_ns: st.window_ns,
        launches: st.launches_total,
        throttled_seconds: st.throttled_ns_total as f64 / 1e9,
        priority: class_name(s.sched.class.load(Relaxed)),
    }
}

/// Set `compute_used` of slices read at one moment, `(device, figures)` each: a slice's charges
/// over the window as a part of the window, or of its device's slices' charges together where
/// those exceed it ([`used_fraction`]), so the slices of a device never sum over 1 (each
/// slice's record alone, read a moment apart from its device's, does not guarantee that).
pub fn shares_of_busy_time<D: Eq + std::hash::Hash + Copy>(slices: &mut [(D, SliceCompute)]) {
    let mut busy = std::collections::HashMap::<D, f64>::new();
    for (d, c) in slices.iter() {
        *busy.entry(*d).or_default() += c.window_ns;
    }
    for (d, c) in slices.iter_mut() {
        c.used = used_fraction(c.window_ns, busy[d]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(ns: f64) -> SliceCompute {
        SliceCompute {
            used: 0.0,
            window_ns: ns,
            launches: 0,
            throttled_seconds: 0.0,
            priority: "normal",
        }
    }

    #[test]
    fn a_devices_slices_never_sum_over_one() {
        // Issue 20's status: 26.8% and 81.6% charged on one device; a third slice elsewhere.
        let mut s = [(0, busy(0.268e9)), (0, busy(0.816e9)), (1, busy(0.4e9))];
        shares_of_busy_time(&mut s);
        let sum = s[0].1.used + s[1].1.used;
        assert!(sum <= 1.0 + 1e-12 && sum > 1.0 - 1e-9, "{s:?}");
        assert!((s[0].1.used - 0.268 / 1.084).abs() < 1e-9, "{s:?}");
        // Under the window, each is its own fraction of it.
        assert!((s[2].1.used - 0.4).abs() < 1e-9, "{s:?}");
    }
}
