//! The `gpuslice` binary's window on the ledger: opening it, turning the ledger's snapshot into
//! the [`NodeView`](crate::view::NodeView) every view renders, registering NVML's devices, reaping, and operator
//! slices. All state and all mutation live in `gpuslice-ledger`; this module only translates
//! (ledger indices to NVML's, ppm to fractions, errors to messages).
//!
//! One job a file: `mod.rs` opening the ledger (or the node's monitor), registering, reaping;
//! `snapshot.rs` the ledger's snapshot as the node every view shows; `slices.rs` operator
//! slices (`slice create|set|rm`); `operator.rs` where their changes go (the ledger, or the
//! node's monitor), decided once.

mod operator;
pub mod slices;
mod snapshot;

use crate::cli::Failure;
use crate::nvml::Gpu;
use crate::regions::RegionTable;
use gpuslice_ledger::node::Policy;
use gpuslice_ledger::{Ledger, LedgerError};
use std::path::Path;
use std::sync::Arc;

impl From<LedgerError> for Failure {
    fn from(e: LedgerError) -> Failure {
        Failure::Other(e.to_string())
    }
}

/// Whether `dir` holds a node policy (root's directory in node mode).
pub fn is_node_dir(dir: &str) -> bool {
    gpuslice_cdi::is_node_dir(dir)
}

/// An open ledger.
pub struct LedgerWindow {
    ledger: Arc<Ledger>,
    /// Node mode, in the monitor: the policy (the same ledger, as only its monitor may hold
    /// it) and the slice regions it made and hands out.
    node: Option<(Policy, Arc<RegionTable>)>,
    /// Where `slice create|set|rm` go (decided once, here).
    operator: &'static dyn operator::Operator,
}

impl LedgerWindow {
    /// Open the existing ledger in `dir`.
    pub fn open(dir: &Path) -> Result<LedgerWindow, LedgerError> {
        Ok(LedgerWindow::new(Ledger::open(dir)?))
    }

    /// Open the ledger in `dir`, creating it when there is none.
    pub fn open_or_create(dir: &Path) -> Result<LedgerWindow, LedgerError> {
        Ok(LedgerWindow::new(Ledger::open_or_create(dir)?))
    }

    fn new(ledger: Ledger) -> LedgerWindow {
        LedgerWindow {
            operator: operator::for_ledger(&ledger),
            ledger: Arc::new(ledger),
            node: None,
        }
    }

    /// Node mode (the root monitor): open or create the policy, recover the regions live
    /// processes still hold (after a restart) and make again those of slices only exported
    /// memory still charges, and keep them; with the log lines of what was made again.
    pub fn open_or_create_node(dir: &Path) -> Result<(LedgerWindow, Vec<String>), LedgerError> {
        let policy = Ledger::open_or_create_node(dir)?;
        let ledger = policy.ledger().clone();
        let regions = Arc::new(RegionTable::default());
        ledger.set_regions(regions.clone());
        regions.recover_all(&ledger);
        let lines = match regions.restore_held(&ledger) {
            Ok(restored) => restored
                .iter()
                .map(|&(key, bytes)| {
                    let name = ledger.slices().get(key as usize).map(|s| s.name.get());
                    format!(
                        "slice {:?} keeps {} of exported memory its exporters left (held by \
                         importers or descriptors): charged to it again",
                        name.unwrap_or_default(),
                        crate::table::size(bytes)
                    )
                })
                .collect(),
            // The records stay; their slices' charge is lost from the counters until they go.
            Err(e) => vec![format!(
                "cannot restore the charge of exported memory whose exporters left: {e}"
            )],
        };
        let window = LedgerWindow {
            operator: operator::for_ledger(&ledger),
            ledger,
            node: Some((policy, regions)),
        };
        Ok((window, lines))
    }

    /// The policy and the regions, for the admission socket (node mode only).
    pub fn parts(&self) -> Option<(Policy, Arc<RegionTable>)> {
        self.node.clone()
    }

    /// Whether the file this maps is still the ledger in its directory (an operator may have
    /// removed a broken one, and a process created a new one since).
    pub fn is_current(&self) -> bool {
        let (mapped, now) = self.ledger.identities();
        mapped.is_some() && mapped == now
    }

    /// Whether `e` only says that no ledger exists yet.
    pub fn is_missing(e: &LedgerError) -> bool {
        matches!(e, LedgerError::NotFound(_))
    }

    /// Record the audit's rows in the ledger (for `status` and `metrics`).
    pub fn record_audit(&self, rows: &[crate::prom::AuditRow]) {
        for r in rows {
            self.ledger
                .record_audit(r.index, r.observed, r.over_quota());
        }
    }

    /// Register (or refresh) a device NVML reports.
    pub fn register_device(&self, d: &Gpu) -> Result<(), LedgerError> {
        self.ledger
            .ensure_device(&d.uuid, &d.name, d.memory_total)
            .map(|_| ())
    }

    /// Reap processes that are gone: how many, and log lines saying what came back.
    pub fn reap(&self) -> Result<(u64, Vec<String>), LedgerError> {
        let r = match &self.node {
            Some((policy, regions)) => {
                // The monitor's own record: the pid it saw and that pid's start time; a zombie
                // (exited, not yet waited for) is gone: it holds no memory any more.
                let alive = |p: &gpuslice_ledger::layout::Proc| {
                    use std::sync::atomic::Ordering::SeqCst;
                    gpuslice_ledger::is_running(p.host_pid.load(SeqCst), p.start_time.load(SeqCst))
                };
                let r = policy.reap_node(&alive, regions.as_ref())?;
                regions.retain_live(policy);
                policy.rebalance_allowances()?;
                policy.mirror_usage(regions.as_ref());
                r
            }
            None => self.ledger.reap_dead()?,
        };
        let mut lines: Vec<String> = r
            .processes
            .iter()
            .map(|p| {
                format!(
                    "reaped pid {}: returned {} to its slice",
                    p.pid,
                    crate::table::size(p.bytes)
                )
            })
            .collect();
        for p in &r.problems {
            lines.push(format!("skipped a bad ledger record: {p}"));
        }
        lines.extend(removed_lines(&r.slices_removed));
        Ok((r.processes.len() as u64, lines))
    }
}

/// Node mode: let go of the exported allocations no descriptor can hold any more
/// ([`crate::descriptor_scan::release_unheld`]); the log lines of the slices that went with them, and
/// what the scan found otherwise ([`crate::descriptor_scan::Unheld`]).
pub fn release_unheld(ledger: &Ledger) -> (Vec<String>, crate::descriptor_scan::Unheld) {
    let mut u = crate::descriptor_scan::release_unheld(ledger);
    let mut lines = std::mem::take(&mut u.problems);
    lines.extend(removed_lines(&u.removed));
    (lines, u)
}

/// One log line per emptied slice, naming it once with its devices (a slice is a record per
/// device: a process's slice on 8 GPUs is 8 records): `removed emptied slice "pid-7" (GPU 0,
/// 1)`. Devices by NVML's index where NVML knows them, else by UUID.
fn removed_lines(removed: &[gpuslice_ledger::RemovedSlice]) -> Vec<String> {
    let nvml = crate::nvml::indices();
    let mut names: Vec<(&str, Vec<String>)> = Vec::new();
    for r in removed {
        let device = nvml
            .get(r.device_uuid.as_str())
            .map_or_else(|| r.device_uuid.clone(), u32::to_string);
        match names.iter_mut().find(|(n, _)| *n == r.name) {
            Some((_, devices)) => devices.push(device),
            None => names.push((&r.name, vec![device])),
        }
    }
    names
        .into_iter()
        .map(|(name, devices)| {
            format!(
                "removed emptied slice {name:?} (GPU {})",
                devices.join(", ")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_names_each_emptied_slice_once_with_its_devices() {
        let r = |name: &str, dev: &str| gpuslice_ledger::RemovedSlice {
            name: name.into(),
            device_uuid: dev.into(),
        };
        let lines = removed_lines(&[
            r("pid-7", "GPU-a"),
            r("pid-7", "GPU-b"),
            r("run-1", "GPU-a"),
        ]);
        assert_eq!(
            lines,
            [
                "removed emptied slice \"pid-7\" (GPU GPU-a, GPU-b)",
                "removed emptied slice \"run-1\" (GPU GPU-a)"
            ]
        );
    }
}
