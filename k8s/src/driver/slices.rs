//! Where a claim's slices are made, decided once when the ledger is opened ([`mode_of`]), as
//! the shim decides admission once (`shim/src/admit.rs`) and the CLI where an operator's
//! change goes (`monitor/src/ledger_window/operator.rs`): in a personal ledger by the plugin
//! itself ([`Personal`]), in a node one by the root monitor over `monitor.sock` ([`Node`]: the
//! plugin only reads the policy there).

use crate::config::LedgerMode;
use crate::error::{Error, MonitorError};
use crate::nvml::Inventory;
use gpuslice_ledger::secret::Secret;
use gpuslice_ledger::{Ledger, LedgerError, OperatorSlice, SliceInfo, Snapshot};
use gpuslice_protocol::{self as protocol, Call, Ping, SliceCreate, SliceRemove};
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

/// How long one request to the node's monitor may take.
const MONITOR_TIMEOUT: Duration = Duration::from_secs(10);

/// Open the runtime directory's ledger as `mode` says. Node mode never creates anything: it
/// waits (logging once) until the root monitor has made its policy, so a plugin that starts
/// first cannot leave a personal ledger where the monitor's policy belongs.
pub(super) fn open_ledger(dir: &Path, mode: LedgerMode) -> Result<Ledger, Error> {
    let what = |source: LedgerError| Error::Ledger {
        dir: dir.to_path_buf(),
        source: Box::new(source),
    };
    let node = match mode {
        LedgerMode::Node => true,
        LedgerMode::Personal => false,
        LedgerMode::Auto => match Ledger::open(dir) {
            Ok(l) => return Ok(l),
            Err(LedgerError::NotFound(_)) => {
                // The root monitor's own rule: node mode for root on the node's directory.
                gpuslice_ledger::dir::euid() == 0
                    && dir == Path::new(gpuslice_ledger::DEFAULT_RUNTIME_DIR)
            }
            Err(e) => return Err(what(e)),
        },
    };
    if !node {
        let l = Ledger::open_or_create(dir).map_err(what)?;
        if l.is_node() {
            return Err(Error::NodePolicyInPersonalMode(l.path().to_path_buf()));
        }
        return Ok(l);
    }
    let mut said = false;
    loop {
        match Ledger::open(dir) {
            Ok(l) if l.is_node() => return Ok(l),
            Ok(l) => return Err(Error::PersonalLedgerInNodeMode(l.path().to_path_buf())),
            Err(LedgerError::NotFound(_)) => {
                if !said {
                    eprintln!(
                        "gpuslice-dra: waiting for the node's gpuslice monitor (root) to create \
                         its policy in {}",
                        dir.display()
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(what(e)),
        }
    }
}

/// What differs between a personal ledger and a node's policy, for the driver.
pub(super) trait Mode: Send + Sync {
    /// Node mode (a GPU missing from the policy is then the monitor's to register).
    fn is_node(&self) -> bool;
    /// Where slices go, as the plugin says at start-up.
    fn describe(&self) -> &'static str;
    /// Register the GPUs of `inv` in the ledger.
    fn register(&self, ledger: &Ledger, inv: &Inventory) -> Result<(), Error>;
    /// Whether whoever makes the slices answers now (a personal ledger always does).
    fn ready(&self, ledger: &Ledger) -> Result<(), MonitorError>;
    /// The join secret of claim slice `name` (`snap`: the ledger now).
    fn claim_secret(
        &self,
        ledger: &Ledger,
        name: &str,
        snap: &Snapshot,
    ) -> Result<Option<Secret>, Error>;
    /// Create one claim slice, with its join secret.
    fn create(
        &self,
        ledger: &Ledger,
        spec: &OperatorSlice,
        secret: Option<&Secret>,
    ) -> Result<(), Error>;
    /// Remove slice `name` on every device (an error when there is none).
    fn remove(&self, ledger: &Ledger, name: &str) -> Result<(), Error>;
    /// The live processes of a claim's slice records `mine`: how many, and their pids.
    fn live(&self, ledger: &Ledger, mine: &[&SliceInfo]) -> (u32, Vec<u32>);
}

/// The one decision: the monitor makes the slices of a node's policy.
pub(super) fn mode_of(ledger: &Ledger) -> &'static dyn Mode {
    if ledger.is_node() {
        &Node
    } else {
        &Personal
    }
}

/// A personal ledger: the plugin writes it itself.
pub(super) struct Personal;

impl Mode for Personal {
    fn is_node(&self) -> bool {
        false
    }

    fn describe(&self) -> &'static str {
        "personal mode: slices are written to the ledger by this plugin"
    }

    fn register(&self, ledger: &Ledger, inv: &Inventory) -> Result<(), Error> {
        for g in &inv.gpus {
            ledger
                .ensure_device(&g.uuid, &g.name, g.memory_total)
                .map_err(|source| Error::Register {
                    uuid: g.uuid.clone(),
                    source: Box::new(source),
                })?;
        }
        Ok(())
    }

    fn ready(&self, _: &Ledger) -> Result<(), MonitorError> {
        Ok(())
    }

    /// None: one user, nothing to keep out.
    fn claim_secret(&self, _: &Ledger, _: &str, _: &Snapshot) -> Result<Option<Secret>, Error> {
        Ok(None)
    }

    fn create(
        &self,
        ledger: &Ledger,
        spec: &OperatorSlice,
        _: Option<&Secret>,
    ) -> Result<(), Error> {
        ledger
            .create_operator_slice(spec)
            .map(drop)
            .map_err(Error::Slice)
    }

    fn remove(&self, ledger: &Ledger, name: &str) -> Result<(), Error> {
        ledger.remove_slice(name).map(drop).map_err(Error::Slice)
    }

    /// The ledger's own count of attached processes (the caller reaped the dead first).
    fn live(&self, _: &Ledger, mine: &[&SliceInfo]) -> (u32, Vec<u32>) {
        let live = mine.iter().map(|s| s.attached).sum();
        (
            live,
            mine.iter().flat_map(|s| s.pids.iter().copied()).collect(),
        )
    }
}

/// A node's policy: the root monitor makes the slices, registers the GPUs and reaps.
pub(super) struct Node;

/// One request to the node's monitor: its reply, or why not, worded for the cluster operator
/// (a monitor that does not answer is retried by the kubelet).
fn ask<C: Call>(ledger: &Ledger, req: C) -> Result<C::Reply, MonitorError> {
    protocol::ask(ledger.dir().fd(), req, MONITOR_TIMEOUT)
        .map_err(|source| MonitorError::Down {
            socket: ledger.dir().path().join(protocol::SOCKET_FILE),
            source,
        })?
        .map_err(MonitorError::Refused)
}

impl Mode for Node {
    fn is_node(&self) -> bool {
        true
    }

    fn describe(&self) -> &'static str {
        "node mode: slices are made by the node's monitor (monitor.sock)"
    }

    /// Nothing: the monitor registers the GPUs it sees (admission trusts only those).
    fn register(&self, _: &Ledger, _: &Inventory) -> Result<(), Error> {
        Ok(())
    }

    fn ready(&self, ledger: &Ledger) -> Result<(), MonitorError> {
        ask(ledger, Ping).map(drop)
    }

    /// A claim prepared before (a repeated call, a plugin restart) keeps the secret its slice
    /// was made with, read from the monitor's root-only file; a new claim gets a new random
    /// one (docs/security.md).
    fn claim_secret(
        &self,
        ledger: &Ledger,
        name: &str,
        snap: &Snapshot,
    ) -> Result<Option<Secret>, Error> {
        // Only the plugin (an operator) makes operator slices: a process slice of the name (a
        // squatter, on another GPU) must not make the claim's slice go without a secret.
        let exists = snap
            .slices
            .iter()
            .any(|s| s.name == name && s.operator_defined);
        if !exists {
            return Secret::generate().map(Some).map_err(Error::Secret);
        }
        match ledger.slice_secret(name) {
            Ok(Some(s)) => Ok(Some(s)),
            Ok(None) => {
                eprintln!(
                    "gpuslice-dra: slice {name} was made without a join secret (by an older \
                     gpuslice-dra): any process that names it may join it until the claim is \
                     prepared anew"
                );
                Ok(None)
            }
            Err(source) => Err(Error::ReadSecret {
                name: name.to_string(),
                source: Box::new(source),
            }),
        }
    }

    fn create(
        &self,
        ledger: &Ledger,
        spec: &OperatorSlice,
        secret: Option<&Secret>,
    ) -> Result<(), Error> {
        let req = SliceCreate {
            name: spec.name.clone(),
            device: spec.device.clone(),
            memory: spec.memory,
            share: spec.compute_share,
            cap: spec.compute_cap,
            owner: None,
            claim: spec.claim.clone(),
            secret: secret.map(|s| s.expose().to_string()),
        };
        ask(ledger, req).map(drop).map_err(Error::Monitor)
    }

    fn remove(&self, ledger: &Ledger, name: &str) -> Result<(), Error> {
        let req = SliceRemove {
            name: name.to_string(),
        };
        ask(ledger, req).map(drop).map_err(Error::Monitor)
    }

    /// By the monitor's own record of each process (its pid in the host's PID namespace and
    /// that pid's start time; the DaemonSet runs the plugin with `hostPID`). Dead ones await
    /// the monitor's reaper.
    fn live(&self, ledger: &Ledger, mine: &[&SliceInfo]) -> (u32, Vec<u32>) {
        let slices: Vec<usize> = mine.iter().map(|s| s.index).collect();
        let mut pids = vec![];
        // Memberships come grouped by process: count each process once.
        let mut seen = None;
        for m in ledger.members() {
            if !m.slice.is_some_and(|s| slices.contains(&s)) || seen == Some(m.slot) {
                continue;
            }
            seen = Some(m.slot);
            let (pid, start) = (
                m.proc_.host_pid.load(SeqCst),
                m.proc_.start_time.load(SeqCst),
            );
            if gpuslice_ledger::is_running(pid, start) {
                pids.push(pid);
            }
        }
        (pids.len() as u32, pids)
    }
}
