//! The hot path: charging and uncharging bytes, lock-free, never above the limit.
//!
//! Every byte a process holds on a device is counted twice: in the *account's* counter (the
//! slice's `memory_used`, or the device's `best_effort_used`), which is what the limit is
//! checked against with one compare-and-swap, and in the process's own `charged` word for that
//! device. Each update is bracketed by `ops_begun += 1` … `ops_ended += 1` in the process
//! record.
//!
//! Why this is exact under SIGKILL at any instruction: the counter always equals the sum of
//! `charged` over the account's processes, plus the updates in flight that have touched the
//! counter but not yet `charged`. When the reaper (under the cold-path lock, so membership
//! cannot change) reads, for every *live* member, `ops_ended` then `ops_begun` and finds them
//! equal, then reads the counter and every live `charged`, then reads every `ops_begun` again
//! unchanged, no live member had an update in flight anywhere in that window (one begun after
//! the first read would have moved `ops_begun`; one in flight at the first read would have
//! shown `begun != ended`). Within that window the live members' contribution is exactly the
//! sum of their `charged`, so `counter - Σ live charged` is exactly what the dead members
//! held, in-flight half-updates included, and it never changes afterwards (the dead do not
//! move). The reaper subtracts it with `fetch_sub`, which composes with whatever live members
//! do next. No journal is needed; if a live member stays mid-update (stopped by a debugger),
//! the reap of that account is retried later instead of guessing.
//!
//! Orderings (the weakest that keep the argument above): the reaper's loads are `SeqCst`
//! (at least Acquire, in the order written); a member's update does `ops_begun += 1`
//! Relaxed, then every write that follows it (the counter CAS, `charged`, `ops_ended`) with
//! Release. So whenever the reaper observes *any* write of an update (the counter, its
//! `charged`, its `ops_ended`), the Release/Acquire pair makes that update's `ops_begun`
//! increment visible to the reaper's later loads of `ops_begun`: the update is either counted
//! as finished at the first read (`ended` seen ⇒ `begun` seen, so `begun == ended` only if all
//! seen updates finished) or changes `ops_begun` between the first and the last read, and the
//! snapshot is retried. The counter is only ever written by read-modify-writes after the slice
//! is created (under the lock), so a later RMW by anyone continues the release sequence. On
//! x86 these compile to the same instructions as `SeqCst`; they matter on weaker machines.
//!
//! Best-effort accounts are capped at `memory_total - memory_reserved`. Admission of a new
//! reservation raises `memory_reserved` *then* reads `best_effort_used`; a best-effort charge
//! raises `best_effort_used` *then* re-reads `memory_reserved`, undoing itself if the sum no
//! longer fits. With sequentially consistent operations at least one of the two sees the other,
//! so they can never both succeed past the device's size.

use crate::layout::*;
use core::sync::atomic::{
    AtomicU32, AtomicU64,
    Ordering::{Relaxed, Release, SeqCst},
};

/// What an account is checked against.
#[derive(Clone, Copy)]
enum Cap<'a> {
    /// A slice quota (the slice's record: its limit, and what balloons hold of it).
    Quota(&'a Slice),
    /// The best-effort allowance of a device.
    BestEffort(&'a Device),
    /// Node mode: a user's best-effort allowance, held to the grant the monitor sets (and lowers).
    Grant(&'a AtomicU64),
}

/// One process's charging handle for one device: cheap to copy, no syscalls, no locks.
#[derive(Clone, Copy)]
pub struct Account<'a> {
    counter: &'a AtomicU64,
    cap: Cap<'a>,
    charged: &'a AtomicU64,
    begun: &'a AtomicU64,
    ended: &'a AtomicU64,
    denied: &'a AtomicU64,
    charges: Option<&'a AtomicU64>,
    reaping: &'a AtomicU32,
}

impl<'a> Account<'a> {
    pub(crate) fn new(
        device: &'a Device,
        slice: Option<&'a Slice>,
        proc_: &'a Proc,
        pd: &'a ProcDevice,
    ) -> Account<'a> {
        match slice {
            Some(s) => Account {
                counter: &s.memory_used.0,
                cap: Cap::Quota(s),
                charged: &pd.charged,
                begun: &proc_.ops_begun,
                ended: &proc_.ops_ended,
                denied: &s.alloc_denied_total,
                charges: Some(&s.alloc_total),
                reaping: &s.reaping,
            },
            None => Account {
                counter: &device.best_effort_used,
                cap: Cap::BestEffort(device),
                charged: &pd.charged,
                begun: &proc_.ops_begun,
                ended: &proc_.ops_ended,
                denied: &device.best_effort_denied_total,
                charges: None,
                reaping: &device.reaping,
            },
        }
    }

    /// A node-mode account: the counters live in the slice's region (`region.rs`), the limit
    /// in the policy (mapped read-only). `slice` is the policy's slice record (`None`: the
    /// device's best-effort allowance, whose region `region` is), `slot` the process's policy slot.
    pub fn in_region(
        device: &'a Device,
        slice: Option<&'a Slice>,
        region: &'a crate::region::Region,
        slot: usize,
    ) -> Option<Account<'a>> {
        let cap = match slice {
            Some(s) => Cap::Quota(s),
            None => Cap::BestEffort(device),
        };
        Self::over_region(cap, region, slot)
    }

    /// A node-mode best-effort account: the counters in the allowance's region, the limit the
    /// monitor's grant in the policy (`layout::Allowance`).
    pub fn in_allowance(
        allowance: &'a Allowance,
        region: &'a crate::region::Region,
        slot: usize,
    ) -> Option<Account<'a>> {
        Self::over_region(Cap::Grant(&allowance.grant), region, slot)
    }

    /// The account of process `slot` over a region's counters, limited by `cap`.
    fn over_region(
        cap: Cap<'a>,
        region: &'a crate::region::Region,
        slot: usize,
    ) -> Option<Account<'a>> {
        let h = region.header();
        let rp = region.proc_(slot)?;
        Some(Account {
            counter: &h.memory_used.0,
            cap,
            charged: &rp.charged,
            begun: &rp.ops_begun,
            ended: &rp.ops_ended,
            denied: &h.alloc_denied_total,
            charges: Some(&h.alloc_total),
            reaping: &h.reaping,
        })
    }

    /// The limit now: the slice quota, or what the device has not reserved for slices.
    #[inline]
    pub fn limit(&self) -> u64 {
        match self.cap {
            Cap::Quota(s) => s.memory_limit.load(SeqCst),
            Cap::Grant(l) => l.load(SeqCst),
            Cap::BestEffort(d) => d
                .memory_total
                .load(SeqCst)
                .saturating_sub(d.memory_reserved.load(SeqCst)),
        }
    }

    /// Bytes held in the account (the whole slice, or the whole best-effort allowance).
    #[inline]
    pub fn used(&self) -> u64 {
        self.counter.load(SeqCst)
    }

    /// Node mode: bytes of a quota slice's unused reservation the monitor holds on the device
    /// (balloons), which an allocation of the slice gets back; 0 for best effort. Hostile
    /// input only to the caller's own view: the policy's record, written by the monitor.
    pub fn held_for_it(&self) -> u64 {
        match self.cap {
            Cap::Quota(s) => s.balloon_held.load(Relaxed),
            _ => 0,
        }
    }

    /// Whether this account is a slice quota (false: best effort).
    pub fn is_quota(&self) -> bool {
        matches!(self.cap, Cap::Quota(_))
    }

    /// Bytes this process holds on the device.
    pub fn charged(&self) -> u64 {
        self.charged.load(SeqCst)
    }

    /// Reserve `n` bytes: true if they fit under the limit (and are now counted), false if
    /// not (nothing changed).
    #[inline]
    pub fn try_charge(&self, n: u64) -> bool {
        self.yield_to_reaper();
        // Relaxed: the Release writes below publish it (module comment).
        self.begun.fetch_add(1, Relaxed);
        let ok = self.charge_counter(n);
        if ok {
            self.charged.fetch_add(n, Release);
        }
        self.ended.fetch_add(1, Release);
        if ok {
            if let Some(c) = self.charges {
                c.fetch_add(1, Relaxed);
            }
        } else {
            self.denied.fetch_add(1, Relaxed);
        }
        ok
    }

    #[inline]
    fn charge_counter(&self, n: u64) -> bool {
        let limit = self.limit();
        // A first guess for the CAS, which re-reads on failure.
        let mut cur = self.counter.load(Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|&v| v <= limit) else {
                return false;
            };
            // SeqCst (not just Release) for the best-effort re-check below, a store-load
            // pattern against admission; it includes the Release the reaper's argument needs.
            match self
                .counter
                .compare_exchange_weak(cur, next, SeqCst, Relaxed)
            {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        if let Cap::Grant(g) = self.cap {
            // The monitor may have lowered the grant meanwhile: it stores the grant, then reads
            // the counter; we wrote the counter, then read the grant (both SeqCst), so one of
            // us sees the other (module comment, best effort).
            if self.counter.load(SeqCst) > g.load(SeqCst) {
                self.counter.fetch_sub(n, SeqCst);
                return false;
            }
        }
        if let Cap::BestEffort(d) = self.cap {
            // Re-check against a reservation admitted meanwhile (see the module comment).
            let total = d.memory_total.load(SeqCst);
            let reserved = d.memory_reserved.load(SeqCst);
            if self.counter.load(SeqCst).saturating_add(reserved) > total {
                self.counter.fetch_sub(n, SeqCst);
                return false;
            }
        }
        true
    }

    /// While a reaper settles this account, wait (at most 200 µs) so it sees a quiet moment.
    /// One relaxed load when nobody reaps.
    #[inline]
    fn yield_to_reaper(&self) {
        if self.reaping.load(Relaxed) != 0 {
            wait_for_reaper(self.reaping);
        }
    }

    /// Return `n` bytes previously charged by this process.
    #[inline]
    pub fn uncharge(&self, n: u64) {
        self.yield_to_reaper();
        // Relaxed: published by the Release writes below. Plain subtractions: callers only
        // return what they charged (the shim's pointer table guarantees it), so neither word
        // can go below zero.
        self.begun.fetch_add(1, Relaxed);
        self.counter.fetch_sub(n, Release);
        self.charged.fetch_sub(n, Release);
        self.ended.fetch_add(1, Release);
    }
}

#[cold]
fn wait_for_reaper(flag: &AtomicU32) {
    let t = std::time::Instant::now();
    while flag.load(Relaxed) != 0 && t.elapsed() < std::time::Duration::from_micros(200) {
        core::hint::spin_loop();
    }
}

/// A member of an account, as the reaper sees it: its update counters and its bytes.
pub(crate) struct Member<'a> {
    pub begun: &'a AtomicU64,
    pub ended: &'a AtomicU64,
    pub charged: &'a AtomicU64,
}

/// What the dead members of an account hold: `counter - Σ live charged` from a stable
/// snapshot, or `None` when a live member stayed mid-update through every try.
///
/// Live members pause their updates while `reaping` is set (bounded, see
/// [`Account::yield_to_reaper`]), so even a member charging in a tight loop leaves a window.
pub(crate) fn dead_part(
    counter: &AtomicU64,
    reaping: &AtomicU32,
    live: &[Member<'_>],
) -> Option<u64> {
    reaping.store(1, SeqCst);
    let r = settle(counter, live);
    reaping.store(0, SeqCst);
    r
}

fn settle(counter: &AtomicU64, live: &[Member<'_>]) -> Option<u64> {
    for attempt in 0..200 {
        let mut stable = true;
        let mut first = Vec::with_capacity(live.len());
        for m in live {
            let e = m.ended.load(SeqCst);
            let b = m.begun.load(SeqCst);
            stable &= e == b;
            first.push(b);
        }
        if stable {
            let u = counter.load(SeqCst);
            let sum: u64 = live
                .iter()
                .map(|m| m.charged.load(SeqCst))
                .fold(0u64, |a, c| a.saturating_add(c));
            let again = live
                .iter()
                .zip(&first)
                .all(|(m, b)| m.begun.load(SeqCst) == *b);
            if again {
                return Some(u.saturating_sub(sum));
            }
        }
        if attempt < 20 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
    None
}
