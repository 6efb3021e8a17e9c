//! Node mode's best-effort pools: one per (device, uid) with best-effort processes, each
//! granted a max-min fair part of what no slice reserved on its device; a pool is made with its
//! first member and freed with its last. The monitor's, under the policy's lock (`node.rs`
//! admits and reaps the members).

use crate::error::LedgerError;
use crate::layout::*;
use crate::ledger::Ledger;
use crate::region::Region;
use core::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

impl Ledger {
    /// The best-effort pool of `uid` on `device`, made if missing; caller holds the lock.
    pub(crate) fn pool_for_locked(&self, device: usize, uid: u32) -> Result<usize, LedgerError> {
        let pools = self.pools();
        if let Some(i) = pools.iter().position(|p| {
            p.state.load(SeqCst) == STATE_ACTIVE
                && p.device.load(SeqCst) as usize == device
                && p.uid.load(SeqCst) == uid
        }) {
            return Ok(i);
        }
        let i = pools
            .iter()
            .position(|p| p.state.load(SeqCst) == STATE_FREE)
            .ok_or(LedgerError::TableFull {
                table: "best-effort pool",
                size: MAX_POOLS,
                holders: "one per user and device with best-effort processes".into(),
            })?;
        let p = &pools[i];
        p.device.store(device as u32, SeqCst);
        p.uid.store(uid, SeqCst);
        p.members.store(0, SeqCst);
        p.grant.store(0, SeqCst);
        p.used.store(0, SeqCst);
        p.state.store(STATE_ACTIVE, SeqCst);
        Ok(i)
    }

    /// A process charged to pool account `a` left: free the pool with its last member.
    pub(crate) fn leave_pool_locked(&self, a: u32) {
        let Some(p) = a
            .checked_sub(POOL_ACCOUNT_BASE)
            .and_then(|i| self.pools().get(i as usize))
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

    /// Split what no slice reserved on `device` among its best-effort pools (max-min fair):
    /// a pool holding more than an equal share keeps what it holds and cannot grow; the others
    /// keep theirs and share the rest equally. A pool's counter is hostile (its own processes
    /// write it), so what it is taken to hold is clamped to the grant it had: lying high keeps
    /// a pool at most where it was, never above; lying low is a bypass (the device totals show
    /// it). Grants are stored first, then the counters read again: a charge racing a lowered
    /// grant is either seen here (and covered, up to the old grant) or sees the new grant and
    /// undoes itself (`account.rs`). Monitor only (needs its regions); caller holds the lock.
    pub(crate) fn rebalance_pools_locked(&self, device: usize) {
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
        // A pool just admitted has no region yet (the socket makes it next): it holds nothing.
        let mine: Vec<(usize, Option<Arc<Region>>)> = self
            .pools()
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p.state.load(SeqCst) == STATE_ACTIVE && p.device.load(SeqCst) as usize == device
            })
            .map(|(i, _)| (i, regions.get(POOL_ACCOUNT_BASE + i as u32)))
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
            .map(|(i, _)| self.pools()[*i].grant.load(SeqCst))
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
            self.pools()[*i].grant.store(*g, SeqCst);
        }
        for (((i, r), &g), &o) in mine.iter().zip(&grants).zip(&old) {
            let p = &self.pools()[*i];
            let now = counter(r);
            // A charge that raced the lowering succeeded against the old grant at most.
            let covered = now.min(o.max(g));
            if covered > g {
                p.grant.store(covered, SeqCst);
            }
            p.used.store(covered.min(o.max(g)), SeqCst);
        }
    }

    /// The monitor's tick: rebalance every device's best-effort pools.
    pub fn rebalance_pools(&self) -> Result<(), LedgerError> {
        let _g = self.lock()?;
        for d in 0..MAX_DEVICES {
            self.rebalance_pools_locked(d);
        }
        Ok(())
    }
}
