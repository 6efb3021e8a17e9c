//! The ledger's side of the compute scheduler, for the shim (its own client, personal mode;
//! its granted words, node mode) and the monitor (the grantor): the slices of one device as
//! [`gpuslice_sched`] sees them ([`LedgerTenants`], from `Ledger::tenants`), one process's
//! records on one device ([`ComputeBinding`], from `Ledger::compute_binding`: both built in
//! `ledger/compute.rs`, so neither the shim nor the monitor walks the records itself), and
//! what the reaper does for a dead process ([`reap_proc`]). Here, not in `sched`, so the
//! scheduler does not depend on the ledger's layout.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use crate::layout::{Device, Proc, Slice, STATE_ACTIVE};
use gpuslice_sched::{
    on_process_dead, SchedDevice, SchedProc, SchedSlice, Tenant, Tenants, SYSTEM,
};

/// The ledger's slices on one device (`Ledger::tenants`).
pub struct LedgerTenants<'a> {
    /// The ledger's slice array.
    slices: &'a [Slice],
    /// The header's `slice_hwm`: records at or past it were never active, so [`Tenants::each`]
    /// stops there (a pick would otherwise visit all 8192 records, several times a handover).
    hwm: &'a AtomicU32,
    /// Ledger index of the device.
    device: u32,
}

/// Where one process's compute state lives for one device (`Ledger::compute_binding`).
pub struct ComputeBinding<'a> {
    /// The device record's scheduler state.
    pub device: &'a SchedDevice,
    /// Ledger index of the slice the process joined there.
    pub slice: usize,
    /// That slice's scheduler state.
    pub slice_sched: &'a SchedSlice,
    /// The process record's scheduler state.
    pub proc_sched: &'a SchedProc,
    /// Node mode: the monitor's heartbeat (`monitor_beat_ns`).
    pub monitor_beat: &'a AtomicU64,
    /// Node mode: the monitor's bell (`turns_bell`).
    pub turns_bell: &'a AtomicU32,
}

impl<'a> LedgerTenants<'a> {
    /// The slices of ledger device `device` among `slices` (up to the mark `hwm`).
    pub(crate) fn new(slices: &'a [Slice], hwm: &'a AtomicU32, device: u32) -> Self {
        LedgerTenants {
            slices,
            hwm,
            device,
        }
    }
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
