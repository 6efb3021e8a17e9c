//! Where a record's bytes are counted: in a personal ledger the slice's `memory_used` (or the
//! device's best-effort pool) and the process record's words; in node mode the account's
//! region, which only the monitor writes (`region.rs`). Every export, import, let-go and reap
//! reaches the counters through these.

use super::RecordCharge;
use crate::account::{Account, Member};
use crate::error::LedgerError;
use crate::layout::*;
use crate::ledger::{Ledger, ProcHandle};
use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::SeqCst;

impl Ledger {
    /// Process slot `slot`'s account on ledger device `d` if it can keep a record (as for an
    /// export: not node mode's best-effort allowances, which go with their last member).
    pub(super) fn slice_account(&self, slot: usize, d: usize) -> Option<u32> {
        let pd = self.procs().get(slot)?.devices.get(d)?;
        let a = pd.account.load(SeqCst);
        let keeps = a != ACCOUNT_NONE && (!self.is_node() || (a as usize) < MAX_SLICES);
        keeps.then_some(a)
    }

    /// Run `f` on process slot `slot`'s account on device `d` ([`Self::slice_account`]; in
    /// node mode over the slice's region), `None` when it has none.
    pub(super) fn with_slice_account<T>(
        &self,
        slot: usize,
        d: usize,
        f: impl FnOnce(&Account<'_>) -> T,
    ) -> Option<T> {
        let a = self.slice_account(slot, d)?;
        if !self.is_node() {
            return self.account(ProcHandle { slot }, d).map(|acc| f(&acc));
        }
        let region = self.regions()?.get(crate::region::region_key(a, d)?)?;
        let slice = self.slices().get(a as usize)?;
        let acc = Account::in_region(self.devices().get(d)?, Some(slice), &region, slot)?;
        Some(f(&acc))
    }

    /// Give back `held` bytes a record held in account `a` of device `d`.
    pub(super) fn return_held(&self, d: usize, a: u32, held: u64) {
        self.with_counter(d, a, |c| {
            let _ = c.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(held)));
        });
    }

    /// Run `f` on the counter of account `a` on device `d` (a slice's `memory_used`, or the
    /// device's best-effort pool; in node mode the account's region), `None` for anything else.
    pub(super) fn with_counter<T>(
        &self,
        d: usize,
        a: u32,
        f: impl FnOnce(&AtomicU64) -> T,
    ) -> Option<T> {
        if self.is_node() {
            let r = self.regions()?.get(crate::region::region_key(a, d)?)?;
            return Some(f(&r.header().memory_used.0));
        }
        if a == ACCOUNT_BEST_EFFORT {
            return self.devices().get(d).map(|dv| f(&dv.best_effort_used));
        }
        let s = self.slices().get(a as usize)?;
        let live = s.state.load(SeqCst) == STATE_ACTIVE && s.device.load(SeqCst) as usize == d;
        live.then(|| f(&s.memory_used.0))
    }

    /// Run `f` on process slot `slot`'s words in its account on device `d` (in node mode, in
    /// the account's region).
    pub(super) fn with_member<T>(
        &self,
        slot: usize,
        d: usize,
        f: impl FnOnce(Member<'_>) -> T,
    ) -> Option<T> {
        let p = self.procs().get(slot)?;
        let pd = p.devices.get(d)?;
        if self.is_node() {
            let key = crate::region::region_key(pd.account.load(SeqCst), d)?;
            let r = self.regions()?.get(key)?;
            let w = r.proc_(slot)?;
            return Some(f(Member {
                begun: &w.ops_begun,
                ended: &w.ops_ended,
                charged: &w.charged,
            }));
        }
        Some(f(Member {
            begun: &p.ops_begun,
            ended: &p.ops_ended,
            charged: &pd.charged,
        }))
    }

    /// Node mode: what the records charge, per ledger device and slice (for the slices still
    /// active on that device): what they hold themselves (`held`, their exporters gone) and, for
    /// those whose exporter is still registered, the exporter and the bytes it exported (its
    /// charge is in its own words in the slice's region). A monitor restarted after such a
    /// slice's last live process went recovers no region for it (regions are found through
    /// their live members), so it makes the region again with these in it: the charge stays
    /// enforced on the slice, an exporter that died meanwhile hands its part to its records
    /// when reaped, and the charge goes when they let go.
    pub fn record_charges(&self) -> Result<Vec<RecordCharge>, LedgerError> {
        if !self.is_node() {
            return Ok(vec![]);
        }
        let _g = self.lock()?;
        let mut out: Vec<RecordCharge> = vec![];
        for r in self.shared() {
            let (d, a) = (r.device.load(SeqCst) as usize, r.account.load(SeqCst));
            if r.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            // Only a slice of that device: what `with_counter` would charge once it has a region.
            let Some(s) = self.slices().get(a as usize).filter(|s| {
                s.state.load(SeqCst) == STATE_ACTIVE && s.device.load(SeqCst) as usize == d
            }) else {
                continue;
            };
            let at = match out.iter().position(|c| (c.device, c.account) == (d, a)) {
                Some(i) => i,
                None => {
                    out.push(RecordCharge {
                        device: d,
                        account: a,
                        held: 0,
                        exported: vec![],
                        limit: s.memory_limit.load(SeqCst),
                    });
                    out.len() - 1
                }
            };
            let c = &mut out[at];
            c.held = c.held.saturating_add(r.held.load(SeqCst));
            // An exporter charged in this slice's region (a live one, or one that died and
            // is not reaped yet).
            let e = r.exporter.load(SeqCst) as usize;
            let charged_here = self.procs().get(e).is_some_and(|p| {
                matches!(p.state.load(SeqCst), STATE_ACTIVE | STATE_DYING)
                    && p.devices.get(d).map(|pd| pd.account.load(SeqCst)) == Some(a)
            });
            if charged_here {
                c.exported.push((e, r.bytes.load(SeqCst)));
            }
        }
        out.retain(|c| c.held > 0 || !c.exported.is_empty());
        Ok(out)
    }
}
