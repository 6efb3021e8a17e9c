//! Slices once they exist: operator slices (`gpuslice slice create`, with a claim label and a
//! join secret), the changes made to one later (owner, priority, the monitor's audit), and how
//! a slice goes (removed by the operator, or with its last process). Apart from admission,
//! which only decides whether a new slice fits.

use super::join::{NewSlice, Origin};
use super::Ledger;
use crate::error::LedgerError;
use crate::layout::*;
use crate::snapshot::RemovedSlice;
use core::sync::atomic::Ordering::SeqCst;

/// An operator-defined slice (`gpuslice slice create`).
#[derive(Debug, Clone)]
pub struct OperatorSlice {
    /// Name.
    pub name: String,
    /// Ledger device index (digits) or UUID.
    pub device: String,
    /// Quota in bytes.
    pub memory: u64,
    /// Guarantee.
    pub compute_share: Share,
    /// Cap.
    pub compute_cap: Cap,
    /// A label to find the slice by (Kubernetes `namespace/name`), shown by `status`.
    pub claim: Option<String>,
}

impl Ledger {
    /// Create an operator-defined slice (persists when empty; processes naming it get its
    /// values). Errors: unknown device, bad name, already exists, admission.
    pub fn create_operator_slice(&self, spec: &OperatorSlice) -> Result<usize, LedgerError> {
        self.create_operator_slice_with_secret(spec, None)
    }

    /// [`Ledger::create_operator_slice`] with a join secret (node mode only; `secret.rs`): the
    /// secret is stored, root-only, before the slice exists, and is required of every non-root
    /// process that names the slice from then on.
    pub fn create_operator_slice_with_secret(
        &self,
        spec: &OperatorSlice,
        secret: Option<&crate::secret::Secret>,
    ) -> Result<usize, LedgerError> {
        if !gpuslice_quantity::valid_slice_name(&spec.name) {
            return Err(LedgerError::BadName(spec.name.clone()));
        }
        let _g = self.lock()?;
        let undo = self.set_secret_for_new_slice_locked(&spec.name, secret)?;
        let r = self.create_operator_slice_locked(spec);
        if r.is_err() {
            if let Some(old) = undo {
                let _ = old.save(self.dir());
            }
        }
        r
    }

    fn create_operator_slice_locked(&self, spec: &OperatorSlice) -> Result<usize, LedgerError> {
        let dev = self
            .find_device(&spec.device)
            .ok_or_else(|| LedgerError::NoSuchDevice(spec.device.clone()))?;
        // Node mode: tenants' slices are theirs (namespaced by owner), so only another operator
        // slice can hold the name. A personal ledger has one user and one namespace.
        let taken = if self.is_node() {
            self.operator_slice(&spec.name, dev)
        } else {
            self.slice_for(&spec.name, dev, ANY_UID)?
        };
        if taken.is_some() {
            return Err(LedgerError::Exists(spec.name.clone()));
        }
        let claim = spec.claim.as_deref().unwrap_or("");
        if claim.len() >= CLAIM_LEN || claim.bytes().any(|b| b.is_ascii_control()) {
            return Err(LedgerError::BadName(claim.into()));
        }
        let si = self.create_slice_locked(&NewSlice {
            name: &spec.name,
            device: dev,
            memory: Some(spec.memory),
            share: spec.compute_share,
            cap: spec.compute_cap,
            origin: Origin::Operator,
            memory_setting: "--memory",
            compute_setting: "--compute",
        })?;
        // SAFETY: under the lock; the record was just created and no process joined it yet.
        unsafe { self.slices()[si].claim.set(claim) };
        Ok(si)
    }

    /// The monitor's audit of slice `si`: what NVML reports for its processes and whether that
    /// is over its quota (counted in `violations_total` when it goes over).
    pub fn record_audit(&self, si: usize, observed: u64, over: bool) {
        if !self.writable() {
            return;
        }
        let Some(s) = self.slices().get(si) else {
            return;
        };
        s.audit_observed.store(observed, SeqCst);
        if s.over_quota.swap(over as u32, SeqCst) == 0 && over {
            s.violations_total.fetch_add(1, SeqCst);
        }
    }

    /// Node mode: the bytes of slice `si`'s unused reservation the monitor's balloons hold now
    /// (its processes are told they are free).
    pub fn record_balloon(&self, si: usize, held: u64) {
        if !self.writable() {
            return;
        }
        if let Some(s) = self.slices().get(si) {
            s.balloon_held.store(held, SeqCst);
        }
    }

    /// Node mode: what one CUDA context is charged to its slice on device `uuid` (0: contexts
    /// are not charged). Whether it was set.
    pub fn record_context_bytes(&self, uuid: &str, bytes: u64) -> bool {
        if !self.writable() {
            return false;
        }
        let Some(d) = self.find_device(uuid) else {
            return false;
        };
        self.devices()[d].context_bytes.store(bytes, SeqCst);
        true
    }

    /// Node mode: let only `uid`'s processes join the slice `name` on `device` (index or UUID);
    /// an operator slice is open to every uid until this is set.
    pub fn set_slice_owner(
        &self,
        name: &str,
        device: &str,
        uid: u32,
    ) -> Result<usize, LedgerError> {
        let _g = self.lock()?;
        let dev = self
            .find_device(device)
            .ok_or_else(|| LedgerError::NoSuchDevice(device.into()))?;
        let si = self
            .operator_slice(name, dev)
            .ok_or_else(|| LedgerError::NoSuchSlice(name.into()))?;
        self.slices()[si].owner_uid.store(uid, SeqCst);
        Ok(1)
    }

    /// Set the scheduling priority (0 normal, 1 latency) of the slices called `name` (the
    /// operator's, else every tenant's of that name: `Ledger::operator_targets`); returns how
    /// many.
    pub fn set_slice_priority(&self, name: &str, priority: u32) -> Result<usize, LedgerError> {
        let _g = self.lock()?;
        let targets = self.operator_targets(name);
        for &si in &targets {
            self.slices()[si]
                .sched
                .class
                .store(priority.min(gpuslice_sched::CLASS_LATENCY), SeqCst);
        }
        if targets.is_empty() {
            return Err(LedgerError::NoSuchSlice(name.into()));
        }
        Ok(targets.len())
    }

    /// Set the priority class a process asked for (`GPUSLICE_PRIORITY`) on slice record
    /// `slice`, unless an operator made that slice (it keeps the class the operator gave it).
    pub fn set_requested_class(&self, slice: usize, class: u32) {
        if let Some(s) = self.slices().get(slice) {
            if s.operator_defined.load(SeqCst) == 0 {
                s.sched
                    .class
                    .store(class.min(gpuslice_sched::CLASS_LATENCY), SeqCst);
            }
        }
    }

    /// Remove the operator slices called `name` (on every device; where there is none, every
    /// tenant's slice of that name). One with processes still
    /// attached stops being operator-defined and goes away with its last process. Returns how
    /// many were removed at once (one an importer's hold on an exported allocation keeps goes
    /// with the allocation's last holder).
    pub fn remove_slice(&self, name: &str) -> Result<usize, LedgerError> {
        let _g = self.lock()?;
        let targets = self.operator_targets(name);
        let found = targets.len();
        let mut removed = 0;
        for si in targets {
            let s = &self.slices()[si];
            s.operator_defined.store(0, SeqCst);
            // Kept while a process, or an exported allocation an importer holds, charges it.
            if self.remove_if_unused_locked(si, s).is_some() {
                removed += 1;
            }
        }
        if found == 0 {
            return Err(LedgerError::NoSuchSlice(name.into()));
        }
        self.prune_secrets_locked();
        Ok(removed)
    }

    /// A reaped process leaves slice `si` (record `sl`), under the lock: one fewer attached, and
    /// a slice no operator made is freed when its last process goes (its name is returned).
    pub(crate) fn leave_slice_locked(&self, si: usize, sl: &Slice) -> Option<RemovedSlice> {
        let left = sl
            .attached
            .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(1)))
            .unwrap_or(0)
            .saturating_sub(1);
        if left != 0 {
            return None;
        }
        self.remove_if_unused_locked(si, sl)
    }

    /// Remove slice `si` if nothing keeps it: no process, not an operator's, and no exported
    /// allocation charged to it that an importer still holds (`shared/`).
    pub(crate) fn remove_if_unused_locked(&self, si: usize, sl: &Slice) -> Option<RemovedSlice> {
        let free = sl.attached.load(SeqCst) == 0
            && sl.operator_defined.load(SeqCst) == 0
            && sl.state.load(SeqCst) == STATE_ACTIVE
            && !self.slice_has_shared(si);
        if !free {
            return None;
        }
        let removed = RemovedSlice {
            name: sl.name.get(),
            device_uuid: self
                .devices()
                .get(sl.device.load(SeqCst) as usize)
                .map(|d| d.uuid.get())
                .unwrap_or_default(),
        };
        self.free_slice_locked(si);
        Some(removed)
    }

    fn free_slice_locked(&self, si: usize) {
        let Some(s) = self.slices().get(si) else {
            return;
        };
        s.state.store(STATE_FREE, SeqCst);
        s.memory_used.0.store(0, SeqCst);
        // Records charging it go with its counter (never onto the record's next slice).
        self.drop_shared_of_slice_locked(si);
        // A scribbled device index: nothing to give back to (rebuild_derived recomputes sums).
        let Some(d) = self.devices().get(s.device.load(SeqCst) as usize) else {
            return;
        };
        let l = s.memory_limit.load(SeqCst);
        if l != NO_LIMIT {
            let _ = d
                .memory_reserved
                .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(l)));
        }
        let c = s.compute_share_ppm.load(SeqCst) as u64;
        let _ = d
            .compute_reserved
            .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(c)));
        s.memory_used.0.store(0, SeqCst);
    }

    /// The error for a full slice table, naming who holds it (by owner uid).
    pub(crate) fn slices_full(&self) -> LedgerError {
        let uids = self
            .slices()
            .iter()
            .filter(|s| s.state.load(SeqCst) == STATE_ACTIVE)
            .map(|s| s.owner_uid.load(SeqCst));
        Ledger::table_full("slice", MAX_SLICES, uids, |u, n| {
            if u == ANY_UID {
                format!("operator or personal slices: {n}")
            } else {
                format!("uid {u} holds {n}")
            }
        })
    }
}
