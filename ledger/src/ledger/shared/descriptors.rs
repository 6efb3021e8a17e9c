//! Node mode's records that only descriptors may hold (their exporter and importers gone, a
//! descriptor perhaps still open somewhere): what the monitor's scan of `/proc/*/fd` looks for,
//! and the release of those it found nobody holding. Personal mode orphans such a record at
//! once (one user, nobody to scan), so these find none there.

use super::ShareKey;
use crate::error::LedgerError;
use crate::layout::*;
use crate::ledger::Ledger;
use crate::snapshot::RemovedSlice;
use core::sync::atomic::Ordering::SeqCst;

impl Ledger {
    /// Node mode: the records only descriptors may hold now (active, their exporter and
    /// importers gone; each still charged to its last exporter's slice): what the monitor looks
    /// for in `/proc/*/fd`.
    pub fn descriptor_held(&self) -> Vec<(usize, ShareKey)> {
        if !self.is_node() {
            return vec![];
        }
        (self.shared().iter().enumerate())
            .filter(|(_, r)| self.descriptors_only(r))
            .map(|(i, r)| (i, Self::key_of(r)))
            .collect()
    }

    /// The uid and PID namespace (0: unknown) of record `rec`'s exporter (the monitor's scan:
    /// whose processes may hold its descriptor unseen).
    pub fn share_owner(&self, rec: usize) -> Option<(u32, u64)> {
        self.shared()
            .get(rec)
            .map(|r| (r.uid.load(SeqCst), r.pid_ns.load(SeqCst)))
    }

    /// Node mode: no process holds a descriptor of record `rec` (identity `key`) any more, as
    /// the monitor's scan found: its charge goes back (and the slice it alone kept), and it
    /// becomes an orphan. Nothing changes if it is no longer that record, or someone took it
    /// meanwhile (an import adopted it, an importer counted on it).
    pub fn share_release_unheld(
        &self,
        rec: usize,
        key: ShareKey,
    ) -> Result<Vec<RemovedSlice>, LedgerError> {
        let g = self.lock()?;
        let Some(r) = self.shared().get(rec) else {
            return Ok(vec![]);
        };
        if Self::key_of(r) != key || !self.descriptors_only(r) {
            return Ok(vec![]);
        }
        Ok(self.orphan_locked(&g, r))
    }

    /// Node mode: whether record `r` is active with nobody but descriptors holding it.
    pub(super) fn descriptors_only(&self, r: &Shared) -> bool {
        self.is_node()
            && r.state.load(SeqCst) == STATE_ACTIVE
            && r.exporter.load(SeqCst) == NO_SLOT
            && !self.any_importer(r)
    }
}
