//! Where a claim's slices are made: in a personal ledger by the plugin itself, in a node one
//! by the root monitor over `monitor.sock` (the plugin only reads the policy there).

use super::Driver;
use crate::config::LedgerMode;
use crate::error::{Error, MonitorError};
use crate::nvml::Inventory;
use gpuslice_ledger::layout::STATE_ACTIVE;
use gpuslice_ledger::secret::Secret;
use gpuslice_ledger::{Ledger, LedgerError, OperatorSlice, Snapshot};
use gpuslice_protocol::{self as protocol, Call, SliceCreate, SliceRemove};
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

impl Driver {
    /// One request to the node's monitor: its reply, or why not, worded for the cluster
    /// operator (a monitor that does not answer is retried by the kubelet).
    pub(super) fn ask_monitor<C: Call>(&self, req: C) -> Result<C::Reply, MonitorError> {
        protocol::ask(self.ledger.dir().fd(), req, MONITOR_TIMEOUT)
            .map_err(|source| MonitorError::Down {
                socket: self.ledger.dir().path().join(protocol::SOCKET_FILE),
                source,
            })?
            .map_err(MonitorError::Refused)
    }

    /// Create one claim slice: over the socket in node mode (with its join secret), in the
    /// ledger otherwise.
    pub(super) fn create_slice(
        &self,
        spec: &OperatorSlice,
        secret: Option<&Secret>,
    ) -> Result<(), Error> {
        if !self.node_mode {
            return self
                .ledger
                .create_operator_slice(spec)
                .map(|_| ())
                .map_err(Error::Slice);
        }
        self.ask_monitor(SliceCreate {
            name: spec.name.clone(),
            device: spec.device.clone(),
            memory: spec.memory,
            share: spec.compute_share,
            cap: spec.compute_cap,
            owner: None,
            claim: spec.claim.clone(),
            secret: secret.map(|s| s.expose().to_string()),
        })
        .map(drop)
        .map_err(Error::Monitor)
    }

    /// Remove a claim's slice on every device.
    pub(super) fn remove_slice(&self, name: &str) -> Result<(), Error> {
        let r = if self.node_mode {
            self.ask_monitor(SliceRemove {
                name: name.to_string(),
            })
            .map(drop)
            .map_err(Error::Monitor)
        } else {
            self.ledger
                .remove_slice(name)
                .map(drop)
                .map_err(Error::Slice)
        };
        match r {
            Err(e) if e.is_no_such_slice() => Ok(()),
            r => r,
        }
    }

    /// Node mode: the live processes of the slice records `slices`, by the monitor's own
    /// record of each (its pid in the host's PID namespace and that pid's start time; the
    /// DaemonSet runs the plugin with `hostPID`). Dead ones await the monitor's reaper.
    pub(super) fn live_members(&self, slices: &[usize]) -> Vec<u32> {
        let mut pids = vec![];
        for p in self.ledger.procs() {
            if p.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            let member = p
                .devices
                .iter()
                .any(|d| slices.contains(&(d.slice.load(SeqCst) as usize)));
            let (pid, start) = (p.host_pid.load(SeqCst), p.start_time.load(SeqCst));
            if member && gpuslice_ledger::is_running(pid, start) {
                pids.push(pid);
            }
        }
        pids
    }

    pub(super) fn register(&self, inv: &Inventory) -> Result<(), Error> {
        if self.node_mode {
            // The monitor registers the GPUs it sees (admission trusts only those).
            return Ok(());
        }
        for g in &inv.gpus {
            self.ledger
                .ensure_device(&g.uuid, &g.name, g.memory_total)
                .map_err(|source| Error::Register {
                    uuid: g.uuid.clone(),
                    source: Box::new(source),
                })?;
        }
        Ok(())
    }

    /// Node mode: the join secret of claim slice `name` (docs/security.md). A claim prepared
    /// before (a repeated call, a plugin restart) keeps the secret its slice was made with,
    /// read from the monitor's root-only file; a new claim gets a new random one. Personal
    /// mode: none (one user; nothing to keep out).
    pub(super) fn claim_secret(
        &self,
        name: &str,
        snap: &Snapshot,
    ) -> Result<Option<Secret>, Error> {
        if !self.node_mode {
            return Ok(None);
        }
        // Only the plugin (an operator) makes operator slices: a process slice of the name (a
        // squatter, on another GPU) must not make the claim's slice go without a secret.
        let exists = snap
            .slices
            .iter()
            .any(|s| s.name == name && s.operator_defined);
        if !exists {
            return Secret::generate().map(Some).map_err(Error::Secret);
        }
        match self.ledger.slice_secret(name) {
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
}
