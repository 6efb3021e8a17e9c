//! The records as the reaper and a slice's removal see them: dead importers leave, a dying
//! exporter's charge is handed to the records still held (or goes with it), and a slice stays
//! while a record charges it.

use crate::layout::*;
use crate::ledger::{Ledger, LockGuard};
use crate::snapshot::{Reaped, RemovedSlice};
use core::sync::atomic::Ordering::SeqCst;

impl Ledger {
    /// The reaper's part (under the lock, `dying` marked): dead importers leave; a dying
    /// exporter's records held by a live importer keep their bytes (clamped to what it was
    /// charged there), the others' bytes go with it; records nobody holds any more become
    /// orphans. The accounts whose counters must give back an orphaned record's `held`.
    pub(crate) fn reap_shared_locked(
        &self,
        dying: &[usize],
        out: &mut Reaped,
    ) -> Vec<(usize, u32)> {
        let mut settle = vec![];
        // What each dying exporter was charged per device and has not yet handed to a record.
        let mut left: Vec<(usize, usize, u64)> = vec![];
        for (i, r) in self.shared().iter().enumerate() {
            if r.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            let (d, a) = (r.device.load(SeqCst) as usize, r.account.load(SeqCst));
            if d >= MAX_DEVICES || self.with_counter(d, a, |_| ()).is_none() {
                out.problems.push(format!(
                    "shared allocation record {i}: device {d} or account {a} is not usable; freed"
                ));
                r.state.store(STATE_FREE, SeqCst);
                continue;
            }
            for x in &r.importers {
                if dying.contains(&(x.load(SeqCst) as usize)) {
                    x.store(NO_SLOT, SeqCst);
                }
            }
            let e = r.exporter.load(SeqCst) as usize;
            if dying.contains(&e) {
                // Node mode: the record holds the charge for the descriptors that may be left
                // (the monitor's scan lets it go).
                if self.any_importer(r) || self.is_node() {
                    let at = left.iter().position(|&(p, dd, _)| p == e && dd == d);
                    let at = at.unwrap_or_else(|| {
                        let c = self.with_member(e, d, |m| m.charged.load(SeqCst));
                        left.push((e, d, c.unwrap_or(0)));
                        left.len() - 1
                    });
                    let n = r.bytes.load(SeqCst).min(left[at].2);
                    left[at].2 -= n;
                    r.held.store(n, SeqCst);
                    r.exporter.store(NO_SLOT, SeqCst);
                } else {
                    // Its bytes go with the exporter's; a descriptor it left behind charges
                    // whoever imports it next.
                    r.exporter.store(NO_SLOT, SeqCst);
                    r.state.store(STATE_ORPHAN, SeqCst);
                }
            } else if e as u32 == NO_SLOT && !self.any_importer(r) && !self.is_node() {
                r.state.store(STATE_ORPHAN, SeqCst);
                if !settle.contains(&(d, a)) {
                    settle.push((d, a));
                }
            }
        }
        settle
    }

    /// Bytes the records hold themselves in account `a` of device `d`.
    pub(crate) fn shared_held(&self, d: usize, a: u32) -> u64 {
        self.shared()
            .iter()
            .filter(|r| {
                r.state.load(SeqCst) == STATE_ACTIVE
                    && r.device.load(SeqCst) as usize == d
                    && r.account.load(SeqCst) == a
            })
            .fold(0u64, |s, r| s.saturating_add(r.held.load(SeqCst)))
    }

    /// Whether a record charges slice `si` (which then stays, even with no process in it).
    pub(crate) fn slice_has_shared(&self, si: usize) -> bool {
        self.shared()
            .iter()
            .any(|r| r.state.load(SeqCst) == STATE_ACTIVE && r.account.load(SeqCst) as usize == si)
    }

    /// Free the records charging slice `si` (it is being freed with its counter).
    pub(crate) fn drop_shared_of_slice_locked(&self, si: usize) {
        for r in self.shared() {
            if r.state.load(SeqCst) == STATE_ACTIVE && r.account.load(SeqCst) as usize == si {
                r.state.store(STATE_FREE, SeqCst);
            }
        }
    }

    /// Remove slice `a` if a record alone kept it (no process, not an operator's): after its
    /// last record went.
    pub(crate) fn drop_kept_slice_locked(
        &self,
        _g: &LockGuard<'_>,
        a: u32,
    ) -> Option<RemovedSlice> {
        let sl = self.slices().get(a as usize)?;
        self.remove_if_unused_locked(a as usize, sl)
    }
}
