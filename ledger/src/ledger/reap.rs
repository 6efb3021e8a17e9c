//! Reaping: processes that died (their OFD lock gone) give back what they held to their
//! slices, exactly (the double collect of `account.rs`), lose their compute lease and queue
//! place, and free their records; the slices they leave empty go. Apart because it is the one
//! cold path that runs for others, the monitor's tick and every attach.

use super::{Ledger, LockGuard};
use crate::account::{dead_part, Member};
use crate::error::LedgerError;
use crate::layout::*;
use crate::snapshot::{Reaped, ReapedProc};
use core::sync::atomic::Ordering::SeqCst;

impl Ledger {
    /// Find processes that died, return what they held to their slices, free their records,
    /// and remove the slices they leave empty (unless operator-defined).
    pub fn reap_dead(&self) -> Result<Reaped, LedgerError> {
        if self.is_node() {
            return Ok(Reaped::default()); // the monitor's `reap_node` does it
        }
        let g = self.lock()?;
        Ok(self.reap_locked(&g))
    }

    pub(super) fn reap_locked(&self, g: &LockGuard<'_>) -> Reaped {
        let mut out = Reaped::default();
        let procs = self.procs();
        for (i, p) in procs.iter().enumerate() {
            if p.state.load(SeqCst) == STATE_ACTIVE && !self.is_alive(i) {
                p.state.store(STATE_DYING, SeqCst);
            }
        }
        let dying: Vec<usize> = (0..MAX_PROCS)
            .filter(|&i| procs[i].state.load(SeqCst) == STATE_DYING)
            .collect();
        if dying.is_empty() {
            return out;
        }
        // Every (device, account) a dying process is charged to. An account index past the
        // slice table is a scribbled record: reported, and never used as an index.
        let valid_account = |a: u32| a == ACCOUNT_BEST_EFFORT || (a as usize) < MAX_SLICES;
        let mut accounts: Vec<(usize, u32)> = vec![];
        for &i in &dying {
            for (d, pd) in procs[i].devices.iter().enumerate() {
                let a = pd.account.load(SeqCst);
                if a == ACCOUNT_NONE {
                    continue;
                }
                if !valid_account(a) {
                    out.problems.push(format!(
                        "process record {i} (pid {}): account index {a} on device {d} is past \
                         the slice table; its memory cannot be returned",
                        procs[i].pid.load(SeqCst)
                    ));
                    continue;
                }
                if !accounts.contains(&(d, a)) {
                    accounts.push((d, a));
                }
            }
        }
        // Exported allocations: a dying exporter's that a live importer holds stay charged
        // (`shared.rs`); those nobody holds any more go back with their accounts' dead part.
        let freed_shared = self.reap_shared_locked(&dying, &mut out);
        for &(d, a) in &freed_shared {
            if !accounts.contains(&(d, a)) {
                accounts.push((d, a));
            }
        }
        let mut unresolved: Vec<(usize, u32)> = vec![];
        for &(d, a) in &accounts {
            let (counter, reaping) = if a == ACCOUNT_BEST_EFFORT {
                (
                    &self.devices()[d].best_effort_used,
                    &self.devices()[d].reaping,
                )
            } else {
                let s = &self.slices()[a as usize];
                (&s.memory_used.0, &s.reaping)
            };
            let live: Vec<Member<'_>> = procs
                .iter()
                .filter(|p| {
                    p.state.load(SeqCst) == STATE_ACTIVE && p.devices[d].account.load(SeqCst) == a
                })
                .map(|p| Member {
                    begun: &p.ops_begun,
                    ended: &p.ops_ended,
                    charged: &p.devices[d].charged,
                })
                .collect();
            match dead_part(counter, reaping, &live) {
                Some(dead) => {
                    let n = dead.saturating_sub(self.shared_held(d, a));
                    counter.fetch_sub(n, SeqCst);
                    out.bytes_returned = out.bytes_returned.saturating_add(n);
                }
                None => unresolved.push((d, a)),
            }
        }
        for &i in &dying {
            let p = &procs[i];
            if p.devices
                .iter()
                .enumerate()
                .any(|(d, pd)| unresolved.contains(&(d, pd.account.load(SeqCst))))
            {
                continue; // retried at the next reap
            }
            out.processes.push(ReapedProc {
                pid: p.pid.load(SeqCst),
                bytes: p
                    .devices
                    .iter()
                    .fold(0u64, |a, pd| a.saturating_add(pd.charged.load(SeqCst))),
            });
            // Its compute lease and place in the queue go before its slices do.
            crate::tenants::reap_proc(self.devices(), self.slices(), &self.header().slice_hwm, p);
            self.free_dead_record_locked(i, p, &mut out);
        }
        for (_, a) in freed_shared {
            out.slices_removed.extend(self.drop_kept_slice_locked(g, a));
        }
        out
    }
}

impl Ledger {
    /// Let go of dead process record `i` once its memory is settled (personal and node mode's
    /// reapers): its place in a best-effort allowance, its accounts, and its slices (one whose
    /// last member it was goes), then the record itself. Caller holds the lock.
    pub(crate) fn free_dead_record_locked(&self, i: usize, p: &Proc, out: &mut Reaped) {
        for (d, pd) in p.devices.iter().enumerate() {
            let s = pd.slice.load(SeqCst);
            self.leave_allowance_locked(pd.account.load(SeqCst));
            pd.account.store(ACCOUNT_NONE, SeqCst);
            pd.slice.store(ACCOUNT_NONE, SeqCst);
            pd.charged.store(0, SeqCst);
            if s == ACCOUNT_NONE {
                continue;
            }
            let Some(sl) = self.slices().get(s as usize) else {
                out.problems.push(format!(
                    "process record {i}: slice index {s} on device {d} is past the slice table"
                ));
                continue;
            };
            out.slices_removed
                .extend(self.leave_slice_locked(s as usize, sl));
        }
        p.pid.store(0, SeqCst);
        p.state.store(STATE_FREE, SeqCst);
    }
}
