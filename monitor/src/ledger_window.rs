//! The `gpuslice` binary's window on the ledger: opening it, turning the ledger's snapshot into
//! the [`NodeView`] every view renders, registering NVML's devices, reaping, and operator
//! slices. All state and all mutation live in `gpuslice-ledger`; this module only translates
//! (ledger indices to NVML's, ppm to fractions, errors to messages).

use crate::admission::RegionTable;
use crate::cli::Failure;
use crate::nvml::Gpu;
use crate::view::{DeviceView, NodeView, ProcessView, SliceView};
use gpuslice_ledger::secret::Secret;
use gpuslice_ledger::{Ledger, LedgerError, OperatorSlice, ProcInfo, Snapshot, PPM};
use gpuslice_protocol::{self as protocol, Message};
use gpuslice_quantity::Size;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

impl From<LedgerError> for Failure {
    fn from(e: LedgerError) -> Failure {
        Failure::Other(e.to_string())
    }
}

/// What `slice create` asks for, parsed but not yet resolved against a device.
#[derive(Debug, Clone)]
pub struct SliceSpec {
    pub name: String,
    pub memory: Size,
    /// Guarantee, ppm.
    pub compute_ppm: u32,
    /// Ceiling, ppm; `None` for none.
    pub cap_ppm: Option<u32>,
    /// `I` (NVML index where NVML is available, else ledger index) or a UUID.
    pub device: String,
    /// Node mode: the only uid whose processes may join it (`None`: any).
    pub owner: Option<u32>,
    /// Node mode: the slice's join secret (`None`: none).
    pub secret: Option<SecretArg>,
}

/// Where `slice create` takes a join secret from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretArg {
    /// `--secret-file PATH`: an existing file (mode 0600 or stricter).
    File(std::path::PathBuf),
    /// `--new-secret-file PATH`: a new random secret, written to PATH (mode 0600, never over an
    /// existing file).
    New(std::path::PathBuf),
}

/// Whether `dir` holds a node policy (root's directory in node mode).
pub fn is_node_dir(dir: &str) -> bool {
    gpuslice_ledger::cdi::is_node_dir(dir)
}

/// An open ledger.
pub struct LedgerWindow {
    ledger: Arc<Ledger>,
    /// Node mode, in the monitor: the slice regions it made and hands out.
    regions: Option<Arc<RegionTable>>,
}

fn ratio(ppm: u32) -> f64 {
    ppm as f64 / PPM as f64
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
            ledger: Arc::new(ledger),
            regions: None,
        }
    }

    /// Node mode (the root monitor): open or create the policy, recover the regions live
    /// processes still hold (after a restart), and keep them.
    pub fn open_or_create_node(dir: &Path) -> Result<LedgerWindow, LedgerError> {
        let ledger = Arc::new(Ledger::open_or_create_node(dir)?);
        let regions = Arc::new(RegionTable::default());
        ledger.set_regions(regions.clone());
        regions.recover_all(&ledger);
        Ok(LedgerWindow {
            ledger,
            regions: Some(regions),
        })
    }

    /// The ledger and the regions, for the admission socket (node mode only).
    pub fn parts(&self) -> Option<(Arc<Ledger>, Arc<RegionTable>)> {
        Some((self.ledger.clone(), self.regions.clone()?))
    }

    /// Whether operator commands go through the monitor: a node policy this process cannot
    /// write (anyone but root). The monitor decides whether the caller is an operator.
    fn via_monitor(&self) -> bool {
        self.ledger.is_node() && !self.ledger.writable()
    }

    /// One operator request to the node's monitor; its `ok` value, or its refusal as an error.
    fn ask_monitor(&self, m: &Message) -> Result<String, Failure> {
        protocol::ask(
            self.ledger.dir().fd(),
            m,
            std::time::Duration::from_secs(10),
        )
        .map_err(|e| Failure::Other(format!("{e} (is the node's monitor running?)")))?
        .map_err(|e| Failure::Other(e.message))
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
        let r = match &self.regions {
            Some(regions) => {
                // The monitor's own record: the pid it saw and that pid's start time; a zombie
                // (exited, not yet waited for) is gone: it holds no memory any more.
                let alive = |p: &gpuslice_ledger::layout::Proc| {
                    use std::sync::atomic::Ordering::SeqCst;
                    gpuslice_ledger::is_running(p.host_pid.load(SeqCst), p.start_time.load(SeqCst))
                };
                let r = self.ledger.reap_node(&alive, regions.as_ref())?;
                regions.retain_live(&self.ledger);
                self.ledger.rebalance_allowances()?;
                self.ledger.mirror_usage(regions.as_ref());
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

    /// The node as every view shows it. Device indices are NVML's where NVML is available
    /// (what `nvidia-smi` shows), else the ledger's.
    pub fn snapshot(&self) -> NodeView {
        let mut s = self.ledger.snapshot();
        let node_mode = self.ledger.is_node();
        let own_ns = gpuslice_ledger::view::own_pid_identity().0;
        as_reaped(&mut s, &|p| exited(p, node_mode, own_ns));
        let nvml = crate::nvml::indices();
        let index = |uuid: &str, ledger_index: usize| {
            nvml.get(uuid).copied().unwrap_or(ledger_index as u32)
        };
        let devices = s
            .devices
            .iter()
            .map(|d| DeviceView {
                uuid: d.uuid.clone(),
                index: index(&d.uuid, d.index),
                name: d.name.clone(),
                memory_total: d.memory_total,
                memory_reserved: d.memory_reserved,
                memory_used: d.memory_used,
                compute_reserved: ratio(d.compute_reserved_ppm),
            })
            .collect();
        let slice_names: HashMap<usize, &str> = s
            .slices
            .iter()
            .map(|sl| (sl.index, sl.name.as_str()))
            .collect();
        let alive: HashMap<u32, bool> = s.processes.iter().map(|p| (p.pid, p.alive)).collect();
        // Every slice's compute figures at one moment, so a device's `compute_used` sum to at
        // most 1.
        let now = gpuslice_sched::now_ns();
        let mut compute: Vec<_> = s
            .slices
            .iter()
            .map(|sl| {
                let c = crate::compute::slice_compute(&self.ledger, sl.index, now);
                (sl.device_uuid.as_str(), c)
            })
            .collect();
        crate::compute::shares_of_busy_time(&mut compute);
        let slices = s
            .slices
            .iter()
            .zip(compute)
            .map(|(sl, (_, compute))| {
                SliceView {
                    name: sl.name.clone(),
                    device_uuid: sl.device_uuid.clone(),
                    memory_limit: sl.memory_limit,
                    memory_used: sl.memory_used,
                    compute_share: ratio(sl.compute_share_ppm),
                    compute_cap: ratio(sl.compute_cap_ppm),
                    compute_used: compute.used,
                    // Only the living: a dead process awaiting the reaper is in `processes`.
                    pids: {
                        let mut v: Vec<u32> = sl
                            .pids
                            .iter()
                            .copied()
                            .filter(|p| alive.get(p).copied().unwrap_or(false))
                            .collect();
                        v.sort_unstable();
                        v
                    },
                    operator: sl.operator_defined,
                    allocations_denied: sl.alloc_denied_total,
                    launches: compute.launches,
                    throttled_seconds: compute.throttled_seconds,
                    claim: sl.claim.clone(),
                    owner: sl.owner,
                    index: sl.index,
                    over_quota: sl.over_quota,
                    audit_observed: sl.audit_observed,
                    violations_total: sl.violations_total,
                    priority: compute.priority,
                }
            })
            .collect();
        let mut processes: Vec<ProcessView> = s
            .processes
            .iter()
            .map(|p| ProcessView {
                pid: p.pid,
                start_time: p.start_time,
                // The slice it joined (a private one is `pid-N`), else the name it asked for.
                slice: p
                    .devices
                    .first()
                    .and_then(|d| slice_names.get(&d.slice))
                    .map_or_else(|| p.slice.clone(), |n| n.to_string()),
                memory_used: p.memory_used,
                alive: p.alive,
                uid: p.uid,
                charged: p
                    .devices
                    .iter()
                    .filter_map(|d| {
                        let uuid = s.devices.iter().find(|x| x.index == d.device)?;
                        Some((uuid.uuid.clone(), d.charged))
                    })
                    .collect(),
            })
            .collect();
        processes.sort_by_key(|p| p.pid);
        NodeView {
            devices,
            slices,
            processes,
            problems: s.problems,
        }
    }

    /// Resolve `--device`: an NVML index (or, without NVML, a ledger index) or a UUID, to the
    /// device's UUID and size, registering it from NVML when the ledger does not know it yet.
    fn resolve_device(&self, key: &str) -> Result<(String, u64), Failure> {
        let is_index = !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit());
        let named = |index: usize, uuid: &str| {
            if is_index {
                index.to_string() == key
            } else {
                uuid == key
            }
        };
        let nvml = crate::nvml::Nvml::load()
            .and_then(|n| n.devices())
            .unwrap_or_default();
        if let Some(d) = nvml.iter().find(|d| named(d.index as usize, &d.uuid)) {
            self.register_device(d)?;
            return Ok((d.uuid.clone(), d.memory_total));
        }
        // Indices are NVML's where NVML answers; only without it do the ledger's own count.
        let s = self.ledger.snapshot();
        let known: Vec<String> = if nvml.is_empty() {
            if let Some(d) = s.devices.iter().find(|d| named(d.index, &d.uuid)) {
                return Ok((d.uuid.clone(), d.memory_total));
            }
            s.devices
                .iter()
                .map(|d| format!("{} ({})", d.index, d.uuid))
                .collect()
        } else {
            nvml.iter()
                .map(|d| format!("{} ({})", d.index, d.uuid))
                .collect()
        };
        Err(Failure::Other(format!(
            "--device {key}: no such device; known: {}",
            if known.is_empty() {
                "none (NVML is unavailable and no process has registered a device yet)".to_string()
            } else {
                known.join(", ")
            }
        )))
    }

    /// Create an operator slice; returns it as views show it.
    pub fn create_operator_slice(&self, req: &SliceSpec) -> Result<SliceView, Failure> {
        let (uuid, total) = self.resolve_device(&req.device)?;
        let memory = req.memory.resolve(total);
        if memory == 0 {
            return Err(Failure::Other(format!(
                "--memory: resolves to 0 bytes on {uuid} ({} total)",
                crate::table::size(total)
            )));
        }
        let (secret, written) = match &req.secret {
            None => (None, None),
            Some(_) if !self.ledger.is_node() => {
                return Err(Failure::Other(format!(
                    "--secret-file: {} is a personal runtime directory; join secrets apply to \
                     node mode only (a root monitor's directory): in a personal one every \
                     process is its one user's (docs/security.md)",
                    self.ledger.dir().path().display()
                )))
            }
            Some(SecretArg::File(p)) => (Some(Secret::read_file(p)?), None),
            Some(SecretArg::New(p)) => {
                let s = Secret::generate()?;
                s.write_new_file(p)?;
                (Some(s), Some(p.clone()))
            }
        };
        let made = self.create_with(req, &uuid, memory, secret.as_ref());
        if made.is_err() {
            if let Some(p) = written {
                let _ = std::fs::remove_file(p);
            }
        }
        made?;
        self.snapshot()
            .slices
            .into_iter()
            .find(|s| s.name == req.name && s.device_uuid == uuid)
            .ok_or_else(|| {
                Failure::Other(format!(
                    "slice {:?} vanished right after its creation",
                    req.name
                ))
            })
    }

    fn create_with(
        &self,
        req: &SliceSpec,
        uuid: &str,
        memory: u64,
        secret: Option<&Secret>,
    ) -> Result<(), Failure> {
        if self.via_monitor() {
            let mut m = Message::new("op", "slice-create");
            m.push("name", &req.name)
                .push("device", uuid)
                .push("memory", &memory.to_string())
                .push("share", &req.compute_ppm.to_string())
                .push("cap", &req.cap_ppm.unwrap_or(PPM).to_string());
            if let Some(u) = req.owner {
                m.push("owner", &u.to_string());
            }
            if let Some(s) = secret {
                m.push("secret", s.expose());
            }
            self.ask_monitor(&m)?;
        } else {
            self.ledger.create_operator_slice_with_secret(
                &OperatorSlice {
                    name: req.name.clone(),
                    device: uuid.to_string(),
                    memory,
                    compute_share_ppm: req.compute_ppm,
                    compute_cap_ppm: req.cap_ppm.unwrap_or(PPM),
                    claim: None,
                },
                secret,
            )?;
            if let Some(u) = req.owner {
                self.ledger.set_slice_owner(&req.name, uuid, u)?;
            }
        }
        Ok(())
    }

    /// Remove an operator slice on every device; how many records went away at once (one with
    /// processes attached goes with its last process).
    /// Change slice `name` live (every device it is on); returns on how many devices. In node
    /// mode a non-root operator asks the monitor (the policy is read-only to it).
    pub fn set_slice(
        &self,
        name: &str,
        change: &gpuslice_ledger::SliceChange,
    ) -> Result<usize, Failure> {
        if self.via_monitor() {
            let mut m = Message::new("op", "slice-set");
            m.push("name", name);
            if let Some(v) = change.memory {
                m.push("memory", &v.to_string());
            }
            if let Some(v) = change.compute_share_ppm {
                m.push("share", &v.to_string());
            }
            if let Some(v) = change.compute_cap_ppm {
                m.push("cap", &v.to_string());
            }
            if let Some(v) = change.class {
                m.push("class", &v.to_string());
            }
            let r = self.ask_monitor(&m)?;
            return Ok(r.parse().unwrap_or(0));
        }
        Ok(self.ledger.set_slice(name, change)?)
    }

    pub fn remove_slice(&self, name: &str) -> Result<usize, Failure> {
        if self.via_monitor() {
            let r = self.ask_monitor(&Message::new("op", "slice-rm").push("name", name).clone())?;
            return Ok(r.parse().unwrap_or(0));
        }
        Ok(self.ledger.remove_slice(name)?)
    }
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

/// Whether process `p` has exited, checked now rather than at the reaper's last tick: the
/// ledger says so (personal mode: its liveness lock is gone), or its pid no longer runs with
/// its start time. Node mode keeps a record active until the monitor reaps it; there the pid
/// to look at is the host's (the monitor runs in the host's PID namespace), so only root in
/// that namespace looks (it sees every user's processes, whatever `/proc`'s `hidepid`). In
/// personal mode it is the pid in the process's namespace, when that is ours. A pid whose
/// `/proc` entry exists but cannot be read is not taken for gone. Otherwise the process is as
/// the ledger says.
fn exited(p: &ProcInfo, node_mode: bool, own_ns: u64) -> bool {
    if !p.alive {
        return true;
    }
    let pid = if node_mode {
        (own_ns == gpuslice_ledger::view::INITIAL_PID_NS && gpuslice_ledger::dir::euid() == 0)
            .then_some(p.host_pid)
    } else {
        (p.pid_ns != 0 && p.pid_ns == own_ns).then_some(p.pid)
    };
    let Some(pid) = pid.filter(|&pid| pid != 0) else {
        return false;
    };
    match gpuslice_ledger::start_time_of(&pid.to_string()) {
        0 => !Path::new(&format!("/proc/{pid}")).exists(),
        start => start != p.start_time,
    }
}

/// The node as the reaper will leave it: processes that have `exited` are gone at once, what
/// they held is returned to their slices and devices, and a process's slice with no process
/// left goes too, with what it reserved. The views show this, so a program that exits is never
/// listed after it (`status` right after `gpuslice run` returns).
fn as_reaped(s: &mut Snapshot, exited: &dyn Fn(&ProcInfo) -> bool) {
    let (gone, kept): (Vec<ProcInfo>, Vec<ProcInfo>) =
        s.processes.drain(..).partition(|p| exited(p));
    s.processes = kept;
    for pd in gone.iter().flat_map(|p| &p.devices) {
        if let Some(sl) = s.slices.iter_mut().find(|sl| sl.index == pd.slice) {
            sl.memory_used = sl.memory_used.saturating_sub(pd.charged);
        }
        if let Some(d) = s.devices.iter_mut().find(|d| d.index == pd.device) {
            d.memory_used = d.memory_used.saturating_sub(pd.charged);
        }
    }
    // A slice is emptied when a process left it and none is left (an operator's slice stays);
    // what it reserved on its device is free again.
    let gone_pids: Vec<u32> = gone.iter().map(|p| p.pid).collect();
    let mut kept = Vec::with_capacity(s.slices.len());
    for mut sl in s.slices.drain(..) {
        let before = sl.pids.len();
        sl.pids.retain(|p| !gone_pids.contains(p));
        if sl.operator_defined || sl.pids.len() == before || !sl.pids.is_empty() {
            kept.push(sl);
            continue;
        }
        if let Some(d) = s.devices.iter_mut().find(|d| d.index == sl.device) {
            d.memory_reserved = d
                .memory_reserved
                .saturating_sub(sl.memory_limit.unwrap_or(0));
            d.memory_used = d.memory_used.saturating_sub(sl.memory_used);
            d.compute_reserved_ppm = d.compute_reserved_ppm.saturating_sub(sl.compute_share_ppm);
        }
    }
    s.slices = kept;
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_ledger::{SliceInfo, SliceRequest};

    const GI: u64 = 1 << 30;

    #[test]
    fn snapshot_translates_the_ledger_for_every_view() {
        let dir = std::env::temp_dir().join(format!("gpuslice-node-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let node = LedgerWindow::open_or_create(&dir).unwrap();
        let uuid = "GPU-11111111-2222-3333-4444-555555555555";
        node.ledger
            .ensure_device(uuid, "Test GPU", 16 * GI)
            .unwrap();
        let req = |memory: &str, compute_ppm, cap_ppm| SliceSpec {
            name: "op".into(),
            memory: gpuslice_quantity::parse_size("--memory", memory).unwrap(),
            compute_ppm,
            cap_ppm,
            device: "0".into(),
            owner: None,
            secret: None,
        };
        let made = node
            .create_operator_slice(&req("25%", 250_000, Some(500_000)))
            .unwrap();
        assert_eq!(
            (made.memory_limit, made.compute_share, made.compute_cap),
            (Some(4 * GI), 0.25, 0.5)
        );
        assert!(made.operator);

        // This test process joins the slice asking for more; it gets the operator's quota.
        let me = node.ledger.attach("op").unwrap();
        let join = SliceRequest {
            name: Some("op".into()),
            memory: Some(8 * GI),
            compute_share_ppm: 0,
            compute_cap_ppm: PPM,
            memory_setting: "GPUSLICE_MEMORY".into(),
            compute_setting: "GPUSLICE_COMPUTE".into(),
        };
        let j = node.ledger.join(me, 0, &join).unwrap();
        assert_eq!(j.memory_limit, Some(4 * GI));
        assert!(node.ledger.account(me, 0).unwrap().try_charge(GI));

        // Liveness is an OFD lock: only another open file description sees ours, as the
        // monitor (another process) does.
        let s = LedgerWindow::open(&dir).unwrap().snapshot();
        let d = &s.devices[0];
        assert_eq!(
            (d.uuid.as_str(), d.index, d.memory_total),
            (uuid, 0, 16 * GI)
        );
        assert_eq!(
            (d.memory_reserved, d.memory_used, d.compute_reserved),
            (4 * GI, GI, 0.25)
        );
        let sl = &s.slices[0];
        assert_eq!((sl.memory_limit, sl.memory_used), (Some(4 * GI), GI));
        assert_eq!(sl.pids, vec![std::process::id()]);
        let p = &s.processes[0];
        assert_eq!(
            (p.pid, p.slice.as_str(), p.memory_used, p.alive),
            (std::process::id(), "op", GI, true)
        );

        // Admission names requested and available; a second slice too big is refused.
        let big = node.create_operator_slice(&SliceSpec {
            name: "big".into(),
            ..req("13Gi", 0, None)
        });
        let Err(Failure::Other(msg)) = big else {
            panic!("{big:?}")
        };
        assert!(
            msg.contains("requested 13 GiB") && msg.contains("available 12 GiB"),
            "{msg}"
        );
        let unknown = node.create_operator_slice(&SliceSpec {
            device: "5".into(),
            ..req("1Gi", 0, None)
        });
        let Err(Failure::Other(msg)) = unknown else {
            panic!("{unknown:?}")
        };
        assert!(msg.contains("--device 5") && msg.contains(uuid), "{msg}");

        node.ledger.account(me, 0).unwrap().uncharge(GI);
        node.ledger.detach(me).unwrap();
        assert_eq!(node.remove_slice("op").unwrap(), 1);
        assert!(node.snapshot().slices.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn proc_(pid: u32, alive: bool, slice: usize, device: usize, charged: u64) -> ProcInfo {
        ProcInfo {
            slot: pid as usize,
            pid,
            start_time: 1,
            pid_ns: 0,
            host_pid: pid,
            slice: String::new(),
            uid: 1000,
            alive,
            memory_used: charged,
            devices: vec![gpuslice_ledger::ProcDeviceInfo {
                device,
                slice,
                charged,
            }],
        }
    }

    fn slice_(index: usize, name: &str, operator: bool, pids: Vec<u32>, used: u64) -> SliceInfo {
        SliceInfo {
            index,
            name: name.into(),
            device: 0,
            device_uuid: "GPU-0".into(),
            operator_defined: operator,
            private: false,
            memory_limit: Some(4 * GI),
            memory_used: used,
            compute_share_ppm: 250_000,
            compute_cap_ppm: PPM,
            attached: pids.len() as u32,
            pids,
            alloc_total: 0,
            alloc_denied_total: 0,
            claim: None,
            owner: None,
            priority: 0,
            over_quota: false,
            audit_observed: 0,
            violations_total: 0,
        }
    }

    #[test]
    fn an_exited_process_is_gone_from_the_view_with_what_it_held_and_its_emptied_slice() {
        let mut s = Snapshot::default();
        s.devices.push(gpuslice_ledger::DeviceInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "Test".into(),
            memory_total: 16 * GI,
            memory_reserved: 12 * GI,
            memory_used: 4 * GI,
            best_effort_used: 0,
            compute_reserved_ppm: 750_000,
        });
        // "done": its one process exited. "op": an operator's, one of two processes exited.
        // "busy": its process runs.
        s.slices = vec![
            slice_(0, "done", false, vec![10], GI),
            slice_(1, "op", true, vec![20, 21], 2 * GI),
            slice_(2, "busy", false, vec![30], GI),
        ];
        s.processes = vec![
            proc_(10, false, 0, 0, GI),
            proc_(20, true, 1, 0, GI),
            proc_(21, false, 1, 0, GI),
            proc_(30, true, 2, 0, GI),
        ];
        as_reaped(&mut s, &|p| !p.alive);
        let pids: Vec<u32> = s.processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [20, 30]);
        let slices: Vec<(&str, &[u32], u64)> = s
            .slices
            .iter()
            .map(|sl| (sl.name.as_str(), sl.pids.as_slice(), sl.memory_used))
            .collect();
        assert_eq!(slices, [("op", &[20][..], GI), ("busy", &[30][..], GI)]);
        let d = &s.devices[0];
        assert_eq!(
            (d.memory_used, d.memory_reserved, d.compute_reserved_ppm),
            (2 * GI, 8 * GI, 500_000)
        );
    }

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
