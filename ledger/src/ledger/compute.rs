//! The scheduler's view of the ledger, built here in one place for the shim and the monitor
//! (`crate::tenants` holds the types).

use super::procs::ProcHandle;
use super::Ledger;
use crate::tenants::{ComputeBinding, LedgerTenants};
use core::sync::atomic::Ordering::Acquire;

impl Ledger {
    /// The slices of ledger device `device`, as the scheduler sees them.
    pub fn tenants(&self, device: usize) -> LedgerTenants<'_> {
        LedgerTenants::new(&self.slices()[..], &self.header().slice_hwm, device as u32)
    }

    /// Process `me`'s compute records on ledger device `device`: `None` when it joined no
    /// slice there (or an index is out of range: the records are read as hostile).
    pub fn compute_binding(&self, me: ProcHandle, device: usize) -> Option<ComputeBinding<'_>> {
        let p = self.procs().get(me.slot)?;
        let slice = p.devices.get(device)?.slice.load(Acquire) as usize;
        let h = self.header();
        Some(ComputeBinding {
            device: &self.devices().get(device)?.sched,
            slice,
            slice_sched: &self.slices().get(slice)?.sched,
            proc_sched: &p.sched,
            monitor_beat: &h.monitor_beat_ns,
            turns_bell: &h.turns_bell,
        })
    }
}
