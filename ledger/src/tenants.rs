//! The ledger's side of the compute scheduler: the slices of one device as [`gpuslice_sched`] sees them
//! ([`LedgerTenants`]), and what the reaper does for a dead process ([`reap_proc`]). Here, not in
//! `sched`, so the scheduler does not depend on the ledger's layout.

use core::sync::atomic::{AtomicU32, Ordering::*};

use crate::layout::{Device, Proc, Slice, STATE_ACTIVE};
use gpuslice_sched::{on_process_dead, Tenant, Tenants, SYSTEM};

/// The ledger's slices on one device.
pub struct LedgerTenants<'a> {
    /// The ledger's slice array.
    pub slices: &'a [Slice],
    /// The header's `slice_hwm`: records at or past it were never active, so [`Tenants::each`]
    /// stops there (a pick would otherwise visit all 8192 records, several times a handover).
    pub hwm: &'a AtomicU32,
    /// Ledger index of the device.
    pub device: u32,
}

impl Tenants for LedgerTenants<'_> {
    fn each(&self, f: &mut dyn FnMut(Tenant<'_>)) {
        // 0: a file made before the mark existed, or no slice yet: look at every record.
        let hwm = match self.hwm.load(Acquire) as usize {
            0 => self.slices.len(),
            n => n.min(self.slices.len()),
        };
        for (i, s) in self.slices[..hwm].iter().enumerate() {
            if s.state.load(Acquire) == STATE_ACTIVE && s.device.load(Relaxed) == self.device {
                f(Tenant {
                    id: i as u32 + 1,
                    sched: &s.sched,
                    share: s.share(),
                    cap: s.cap(),
                });
            }
        }
    }

    fn get(&self, id: u32) -> Option<Tenant<'_>> {
        let s = self.slices.get(id.checked_sub(1)? as usize)?;
        (s.state.load(Acquire) == STATE_ACTIVE && s.device.load(Relaxed) == self.device).then(
            || Tenant {
                id,
                sched: &s.sched,
                share: s.share(),
                cap: s.cap(),
            },
        )
    }
}

/// What the reaper calls for each dead process record, before it clears the record's
/// per-device slices: [`on_process_dead`] on every device the process had joined.
pub fn reap_proc(devices: &[Device], slices: &[Slice], hwm: &AtomicU32, p: &Proc) {
    for (d, pd) in p.devices.iter().enumerate() {
        let si = pd.slice.load(Acquire);
        let (Some(dev), Some(slice)) = (devices.get(d), slices.get(si as usize)) else {
            continue; // ACCOUNT_NONE (not joined) is past the end of `slices`
        };
        let t = LedgerTenants {
            slices,
            hwm,
            device: d as u32,
        };
        on_process_dead(&SYSTEM, &dev.sched, d, &t, si + 1, &slice.sched, &p.sched);
    }
}
