//! Node mode's best-effort allowances: one per (device, uid) with best-effort processes, each
//! granted a max-min fair part of what no slice reserved on its device; an allowance is made with its
//! first member and freed with its last. The monitor's, under the policy's lock (`node.rs`
//! admits and reaps the members).

use crate::error::LedgerError;
use crate::layout::*;
use crate::ledger::Ledger;
use crate::region::Region;
use core::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

impl Ledger {
    /// The best-effort allowance of `uid` on `device`, made if missing; caller holds the lock.
    pub(crate) fn allowance_for_locked(
        &self,
        device: usize,
        uid: u32,
    ) -> Result<usize, LedgerError> {
        let allowances = self.allowances();
        if let Some(i) = allowances.iter().position(|p| {
            p.state.load(SeqCst) == STATE_ACTIVE
                && p.device.load(SeqCst) as usize == device
                && p.uid.load(SeqCst) == uid
        }) {
            return Ok(i);
        }
        let i = allowances
            .iter()
            .position(|p| p.state.load(SeqCst) == STATE_FREE)
            .ok_or(LedgerError::TableFull {
                table: "best-effort allowance",
                size: MAX_ALLOWANCES,
                holders: "one per user and device with best-effort processes".into(),
            })?;
        let p = &allowances[i];
        p.device.store(device as u32, SeqCst);
        p.uid.store(uid, SeqCst);
        p.members.store(0, SeqCst);
        p.grant.store(0, SeqCst);
        p.used.store(0, SeqCst);
        p.state.store(STATE_ACTIVE, SeqCst);
        Ok(i)
    }

    /// A process charged to allowance account `a` left: free the allowance with its last member.
    pub(crate) fn leave_allowance_locked(&self, a: u32) {
        let Some(p) = a
            .checked_sub(ALLOWANCE_ACCOUNT_BASE)
            .and_then(|i| self.allowances().get(i as usize))
        else {
            return;
        };
        let left = p
            .members
            .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(1)))
            .unwrap_or(0)
            .saturating_sub(1);
        if left == 0 {
            p.state.store(STATE_FREE, SeqCst);
            p.grant.store(0, SeqCst);
        }
    }

    /// Split what no slice reserved on `device` among its best-effort allowances (max-min fair):
    /// an allowance holding more than an equal share keeps what it holds and cannot grow; the others
    /// keep theirs and share the rest equally. An allowance's counter is hostile (its own processes
    /// write it), so what it is taken to hold is clamped to the grant it had: lying high keeps
    /// an allowance at most where it was, never above; lying low is a bypass (the device totals show
    /// it). Grants are stored first, then the counters read again: a charge racing a lowered
    /// grant is either seen here (and covered, up to the old grant) or sees the new grant and
    /// undoes itself (`account.rs`). Monitor only (needs its regions); caller holds the lock.
    pub(crate) fn rebalance_allowances_locked(&self, device: usize) {
        let Some(regions) = self.regions() else {
            return;
        };
        let Some(d) = self.devices().get(device) else {
            return;
        };
        let unreserved = d
            .memory_total
            .load(SeqCst)
            .saturating_sub(d.memory_reserved.load(SeqCst));
        // An allowance just admitted has no region yet (the socket makes it next): it holds nothing.
        let mine: Vec<(usize, Option<Arc<Region>>)> = self
            .allowances()
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p.state.load(SeqCst) == STATE_ACTIVE && p.device.load(SeqCst) as usize == device
            })
            .map(|(i, _)| (i, regions.get(ALLOWANCE_ACCOUNT_BASE + i as u32)))
            .collect();
        let counter = |r: &Option<Arc<Region>>| {
            r.as_ref()
                .map_or(0, |r| r.header().memory_used.load(SeqCst))
        };
        if mine.is_empty() {
            return;
        }
        let old: Vec<u64> = mine
            .iter()
            .map(|(i, _)| self.allowances()[*i].grant.load(SeqCst))
            .collect();
        let held: Vec<u64> = mine
            .iter()
            .zip(&old)
            .map(|((_, r), &g)| counter(r).min(g).min(unreserved))
            .collect();
        let fair = unreserved / mine.len() as u64;
        let over: u64 = held
            .iter()
            .filter(|&&h| h > fair)
            .fold(0, |a, &h| a.saturating_add(h));
        let under_held: u64 = held
            .iter()
            .filter(|&&h| h <= fair)
            .fold(0, |a, &h| a.saturating_add(h));
        let under_n = held.iter().filter(|&&h| h <= fair).count().max(1) as u64;
        let spare = unreserved.saturating_sub(over).saturating_sub(under_held) / under_n;
        let grants: Vec<u64> = held
            .iter()
            .map(|&h| if h > fair { h } else { h.saturating_add(spare) })
            .collect();
        for ((i, _), g) in mine.iter().zip(&grants) {
            self.allowances()[*i].grant.store(*g, SeqCst);
        }
        for (((i, r), &g), &o) in mine.iter().zip(&grants).zip(&old) {
            let p = &self.allowances()[*i];
            let now = counter(r);
            // A charge that raced the lowering succeeded against the old grant at most.
            let covered = now.min(o.max(g));
            if covered > g {
                p.grant.store(covered, SeqCst);
            }
            p.used.store(covered.min(o.max(g)), SeqCst);
        }
    }
}
