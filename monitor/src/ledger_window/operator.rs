//! Where an operator's change to the slices goes, decided once when the ledger is opened
//! ([`for_ledger`]), as the shim decides admission once (`shim/src/admit.rs`): into the ledger
//! itself ([`Direct`]: a personal ledger, or root on the node's policy) or to the node's
//! monitor over `monitor.sock` ([`ViaMonitor`]: an operator in the operator group, who cannot
//! write the policy; the monitor decides whether the caller is one).

use crate::cli::Failure;
use gpuslice_ledger::secret::Secret;
use gpuslice_ledger::{Ledger, OperatorSlice, SliceChange};
use gpuslice_protocol::{self as protocol, Call, Done, SliceCreate, SliceRemove, SliceSet};

/// The operator's changes to the slices of `ledger`.
pub(super) trait Operator: Send + Sync {
    /// Make `slice`, joinable only by `owner`'s processes when given, with its join `secret`.
    fn create(
        &self,
        ledger: &Ledger,
        slice: &OperatorSlice,
        owner: Option<u32>,
        secret: Option<&Secret>,
    ) -> Result<(), Failure>;
    /// Change slice `name` on every device it is on: on how many.
    fn set(&self, ledger: &Ledger, name: &str, change: &SliceChange) -> Result<usize, Failure>;
    /// Remove slice `name` on every device: how many records went at once.
    fn remove(&self, ledger: &Ledger, name: &str) -> Result<usize, Failure>;
}

/// The one decision: through the monitor when the ledger is a node's policy this process
/// cannot write (anyone but root).
pub(super) fn for_ledger(ledger: &Ledger) -> &'static dyn Operator {
    if ledger.is_node() && !ledger.writable() {
        &ViaMonitor
    } else {
        &Direct
    }
}

/// Changes made in the ledger, under its lock.
pub(super) struct Direct;

impl Operator for Direct {
    fn create(
        &self,
        ledger: &Ledger,
        slice: &OperatorSlice,
        owner: Option<u32>,
        secret: Option<&Secret>,
    ) -> Result<(), Failure> {
        ledger.create_operator_slice_with_secret(slice, secret)?;
        if let Some(u) = owner {
            ledger.set_slice_owner(&slice.name, &slice.device, u)?;
        }
        Ok(())
    }

    fn set(&self, ledger: &Ledger, name: &str, change: &SliceChange) -> Result<usize, Failure> {
        Ok(ledger.set_slice(name, change)?)
    }

    fn remove(&self, ledger: &Ledger, name: &str) -> Result<usize, Failure> {
        Ok(ledger.remove_slice(name)?)
    }
}

/// Changes asked of the node's monitor.
pub(super) struct ViaMonitor;

impl ViaMonitor {
    /// One operator request: on how many slice records it acted, or the refusal as an error.
    fn ask<C: Call<Reply = Done>>(ledger: &Ledger, req: C) -> Result<usize, Failure> {
        protocol::ask(ledger.dir().fd(), req, std::time::Duration::from_secs(10))
            .map_err(|e| Failure::Other(format!("{e} (is the node's monitor running?)")))?
            .map(|d| d.records)
            .map_err(|e| Failure::Other(e.message))
    }
}

impl Operator for ViaMonitor {
    fn create(
        &self,
        ledger: &Ledger,
        slice: &OperatorSlice,
        owner: Option<u32>,
        secret: Option<&Secret>,
    ) -> Result<(), Failure> {
        ViaMonitor::ask(
            ledger,
            SliceCreate {
                name: slice.name.clone(),
                device: slice.device.clone(),
                memory: slice.memory,
                share: slice.compute_share,
                cap: slice.compute_cap,
                owner,
                claim: slice.claim.clone(),
                secret: secret.map(|s| s.expose().to_string()),
            },
        )
        .map(drop)
    }

    fn set(&self, ledger: &Ledger, name: &str, change: &SliceChange) -> Result<usize, Failure> {
        ViaMonitor::ask(
            ledger,
            SliceSet {
                name: name.to_string(),
                memory: change.memory,
                share: change.compute_share,
                cap: change.compute_cap,
                class: change.class,
            },
        )
    }

    fn remove(&self, ledger: &Ledger, name: &str) -> Result<usize, Failure> {
        ViaMonitor::ask(
            ledger,
            SliceRemove {
                name: name.to_string(),
            },
        )
    }
}
