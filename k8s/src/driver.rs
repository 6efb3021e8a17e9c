//! The plugin's state machine: preparing a claim makes an operator slice in the ledger (named
//! from the claim's UID, on the allocated GPU, with the consumed memory and compute) and a CDI
//! spec that puts containers in it; unpreparing removes both once no process uses the slice.
//!
//! Nothing lives only in memory: whether a claim is prepared is read from the ledger (the
//! slice) and the CDI directory (the spec), so a restarted plugin carries on where the last
//! one stopped, and every call is idempotent. Calls are serialized by one lock.
//!
//! Two kinds of runtime directory (docs/security.md): in a **personal** one the plugin writes
//! the ledger itself (`Ledger::create_operator_slice`); in a **node** one the policy belongs to
//! the root `gpuslice monitor`, and the plugin only reads it: slices are created and removed
//! by operator requests over `monitor.sock` (`op=slice-create`, `op=slice-rm`, authorized by
//! `SO_PEERCRED` as root), the monitor registers the GPUs and reaps dead processes, and a
//! prepare while the monitor is down fails with a retryable per-claim error.

use crate::claims::ClaimSource;
use crate::config::{Config, LedgerMode, NvidiaCdiName};
use crate::health::GpuHealth;
use crate::nvml::{Gpu, Inventory, Nvml};
use crate::quantity;
use crate::slice::{self, COMPUTE, COMPUTE_WHOLE, MEMORY};
use gpuslice_ledger::layout::STATE_ACTIVE;
use gpuslice_ledger::secret::{Secret, SECRET_VAR};
use gpuslice_ledger::{human_bytes, Ledger, LedgerError, OperatorSlice, Snapshot, PPM};
use gpuslice_protocol::{self as protocol, Message};
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Mutex;
use std::time::Duration;

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
}

impl ClaimRef {
    /// `namespace/name`, the label the slice carries.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One allocated device of a prepared claim, for the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The claim's request this device serves.
    pub request_names: Vec<String>,
    /// Pool (this node).
    pub pool_name: String,
    /// Device (`gpu-<uuid>`).
    pub device_name: String,
    /// The claim's gpuslice CDI device, then the NVIDIA device's.
    pub cdi_device_ids: Vec<String>,
}

/// The slice name of a claim: `k8s-<uid>` (every container of every pod sharing the claim
/// joins this one slice).
pub fn slice_name(uid: &str) -> String {
    format!("k8s-{uid}")
}

/// What a claim asks of one GPU.
#[derive(Debug, Clone, Default)]
struct Want {
    memory: u64,
    compute: u64,
}

/// The driver.
pub struct Driver {
    cfg: Config,
    ledger: Ledger,
    /// Node mode: the policy is the monitor's; every change goes over `monitor.sock`.
    node: bool,
    nvml: Nvml,
    claims: Box<dyn ClaimSource>,
    inventory: Mutex<Inventory>,
    serial: tokio::sync::Mutex<()>,
    /// Every GPU's health, for the kubelet's health streams (`health.rs`).
    health: tokio::sync::watch::Sender<Vec<GpuHealth>>,
    /// The device names of every GPU seen since start (one that vanishes stays, unhealthy).
    seen: Mutex<BTreeSet<String>>,
}

fn ledger_err(e: LedgerError) -> String {
    e.to_string()
}

/// How long one request to the node's monitor may take.
const MONITOR_TIMEOUT: Duration = Duration::from_secs(10);

/// Open the runtime directory's ledger as `mode` says. Node mode never creates anything: it
/// waits (logging once) until the root monitor has made its policy, so a plugin that starts
/// first cannot leave a personal ledger where the monitor's policy belongs.
fn open_ledger(dir: &Path, mode: LedgerMode) -> Result<Ledger, String> {
    let what = |e: LedgerError| format!("the gpuslice ledger in {}: {e}", dir.display());
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
            return Err(format!(
                "--mode personal, but {} is the node monitor's policy: run with --mode node \
                 (or auto), so slices are made through the monitor",
                l.path().display()
            ));
        }
        return Ok(l);
    }
    let mut said = false;
    loop {
        match Ledger::open(dir) {
            Ok(l) if l.is_node() => return Ok(l),
            Ok(l) => {
                return Err(format!(
                    "--mode node, but {} is a personal ledger, not the policy of a root \
                     `gpuslice monitor`: stop what uses it, remove it, and start the monitor \
                     as root (or run the plugin with --mode personal)",
                    l.path().display()
                ))
            }
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
    /// Open the ledger (personal mode: creating it if needed; node mode: waiting for the
    /// monitor's policy), read the GPUs, register them in a personal ledger.
    pub fn new(cfg: Config, claims: Box<dyn ClaimSource>) -> Result<Driver, String> {
        let nvml = Nvml::load()?;
        let ledger = open_ledger(&cfg.runtime_dir, cfg.mode)?;
        let node = ledger.is_node();
        eprintln!(
            "gpuslice-dra: {} in {}",
            if node {
                "node mode: slices are made by the node's monitor (monitor.sock)"
            } else {
                "personal mode: slices are written to the ledger by this plugin"
            },
            cfg.runtime_dir.display()
        );
        let inventory = nvml.inventory()?;
        let d = Driver {
            cfg,
            ledger,
            node,
            nvml,
            claims,
            inventory: Mutex::new(inventory.clone()),
            serial: tokio::sync::Mutex::new(()),
            health: tokio::sync::watch::channel(vec![]).0,
            seen: Mutex::new(BTreeSet::new()),
        };
        d.update_health(Ok(&inventory));
        d.register(&inventory)?;
        Ok(d)
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Whether the ledger is a node policy (slices go through the monitor).
    pub fn node_mode(&self) -> bool {
        self.node
    }

    /// One operator request to the node's monitor: its `ok` value, or why not, worded for the
    /// cluster operator (a monitor that does not answer is retried by the kubelet).
    fn ask_monitor(&self, m: &Message) -> Result<String, String> {
        protocol::ask(self.ledger.dir().fd(), m, MONITOR_TIMEOUT)
            .map_err(|e| {
                format!(
                    "the node's gpuslice monitor does not answer on {} ({e}): start it as root \
                     (`gpuslice monitor`, the monitor container of the gpuslice-dra DaemonSet); \
                     nothing was changed, and the kubelet retries",
                    self.ledger
                        .dir()
                        .path()
                        .join(protocol::SOCKET_FILE)
                        .display()
                )
            })?
            .map_err(|e| format!("the node's gpuslice monitor refused: {e}"))
    }

    /// Create one claim slice: over the socket in node mode (with its join secret), in the
    /// ledger otherwise.
    fn create_slice(&self, spec: &OperatorSlice, secret: Option<&Secret>) -> Result<(), String> {
        if !self.node {
            return self
                .ledger
                .create_operator_slice(spec)
                .map(|_| ())
                .map_err(ledger_err);
        }
        let mut m = Message::new("op", "slice-create");
        m.push("name", &spec.name)
            .push("device", &spec.device)
            .push("memory", &spec.memory.to_string())
            .push("share", &spec.compute_share_ppm.to_string())
            .push("cap", &spec.compute_cap_ppm.to_string())
            .push("claim", spec.claim.as_deref().unwrap_or(""));
        if let Some(s) = secret {
            m.push("secret", s.expose());
        }
        self.ask_monitor(&m).map(|_| ())
    }

    /// Remove a claim's slice on every device.
    fn remove_slice(&self, name: &str) -> Result<(), String> {
        if !self.node {
            return match self.ledger.remove_slice(name) {
                Ok(_) | Err(LedgerError::NoSuchSlice(_)) => Ok(()),
                Err(e) => Err(ledger_err(e)),
            };
        }
        match self.ask_monitor(Message::new("op", "slice-rm").push("name", name)) {
            Ok(_) => Ok(()),
            Err(e) if e.contains("no slice named") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Node mode: the live processes of the slice records `slices`, by the monitor's own
    /// record of each (its pid in the host's PID namespace and that pid's start time; the
    /// DaemonSet runs the plugin with `hostPID`). Dead ones await the monitor's reaper.
    fn live_members(&self, slices: &[usize]) -> Vec<u32> {
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

    fn register(&self, inv: &Inventory) -> Result<(), String> {
        if self.node {
            // The monitor registers the GPUs it sees (admission trusts only those).
            return Ok(());
        }
        for g in &inv.gpus {
            self.ledger
                .ensure_device(&g.uuid, &g.name, g.memory_total)
                .map_err(|e| format!("registering {} in the ledger: {e}", g.uuid))?;
        }
        Ok(())
    }

    /// The GPUs' health, kept current by [`Driver::devices`] (every resync).
    pub fn health(&self) -> tokio::sync::watch::Receiver<Vec<GpuHealth>> {
        self.health.subscribe()
    }

    /// Determine every GPU's health from NVML's answer now and (node mode) the monitor's.
    fn update_health(&self, inv: Result<&Inventory, &str>) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let here: BTreeSet<String> = match inv {
            Ok(inv) => inv
                .gpus
                .iter()
                .map(|g| slice::device_name(&g.uuid))
                .collect(),
            Err(_) => BTreeSet::new(),
        };
        seen.extend(here.iter().cloned());
        let monitor = if self.node && inv.is_ok() {
            self.ask_monitor(&Message::new("op", "ping")).err()
        } else {
            None
        };
        let now = crate::health::judge(&seen, inv.map(|_| &here), monitor.as_deref());
        self.health.send_if_modified(|h| {
            let changed = *h != now;
            if changed {
                for g in now.iter().filter(|g| !h.contains(g)) {
                    match g.healthy {
                        Some(true) => eprintln!("gpuslice-dra: {} is healthy", g.device),
                        Some(false) => {
                            eprintln!("gpuslice-dra: {} is unhealthy: {}", g.device, g.message)
                        }
                        None => {
                            eprintln!("gpuslice-dra: {} health unknown: {}", g.device, g.message)
                        }
                    }
                }
                *h = now;
            }
            changed
        });
    }

    /// Read GPUs and reservations again; the devices this node publishes now.
    pub async fn devices(&self) -> Result<slice::Devices, String> {
        let _g = self.serial.lock().await;
        let inv = self.nvml.inventory();
        self.update_health(inv.as_ref().map_err(|e| e.as_str()));
        let inv = inv?;
        self.register(&inv)?;
        *self.inventory.lock().unwrap_or_else(|p| p.into_inner()) = inv.clone();
        let snap = self.ledger.snapshot();
        Ok(slice::devices(
            &inv,
            &snap,
            self.cfg.memory_step,
            self.cfg.memory_default,
        ))
    }

    fn gpus(&self) -> Vec<Gpu> {
        self.inventory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .gpus
            .clone()
    }

    fn spec_path(&self, uid: &str) -> PathBuf {
        let kind = self.cfg.cdi_kind.replace('/', "-");
        self.cfg
            .cdi_dir
            .join(format!("{kind}_{}.json", slice_name(uid)))
    }

    fn nvidia_cdi_id(&self, g: &Gpu) -> Option<String> {
        let name = match self.cfg.nvidia_cdi_name {
            NvidiaCdiName::Uuid => g.uuid.clone(),
            NvidiaCdiName::Index => g.index.to_string(),
            NvidiaCdiName::None => return None,
        };
        Some(format!("{}={name}", self.cfg.nvidia_cdi_kind))
    }

    /// Prepare claims, one result per claim (in order).
    pub async fn prepare(&self, claims: &[ClaimRef]) -> Vec<Result<Vec<PreparedDevice>, String>> {
        let _g = self.serial.lock().await;
        // Nothing is prepared while the node's monitor is down: a container started now would
        // fail cuInit (no admission), so the pod waits with this message instead. Asked once
        // per call, so a hung monitor costs one timeout, not one per claim.
        let down = if self.node {
            self.ask_monitor(&Message::new("op", "ping")).err()
        } else {
            None
        };
        let mut out = Vec::with_capacity(claims.len());
        for c in claims {
            let r = match &down {
                Some(e) => Err(e.clone()),
                None => self.prepare_one(c).await,
            }
            .map_err(|e| format!("claim {} (uid {}): {e}", c.label(), c.uid));
            match &r {
                Ok(d) => eprintln!(
                    "gpuslice-dra: prepared claim {} as slice {} ({} device(s))",
                    c.label(),
                    slice_name(&c.uid),
                    d.len()
                ),
                Err(e) => eprintln!("gpuslice-dra: prepare failed: {e}"),
            }
            out.push(r);
        }
        out
    }

    /// Unprepare claims, one result per claim (in order).
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> Vec<Result<(), String>> {
        let _g = self.serial.lock().await;
        claims
            .iter()
            .map(|c| {
                let r = self
                    .unprepare_one(c)
                    .map_err(|e| format!("claim {} (uid {}): {e}", c.label(), c.uid));
                match &r {
                    Ok(()) => eprintln!("gpuslice-dra: unprepared claim {}", c.label()),
                    Err(e) => eprintln!("gpuslice-dra: unprepare failed: {e}"),
                }
                r
            })
            .collect()
    }

    fn consumed(
        &self,
        r: &DeviceRequestAllocationResult,
        gpu: &Gpu,
        snap: &Snapshot,
    ) -> Result<Want, String> {
        let Some(cc) = &r.consumed_capacity else {
            // No consumable capacity (a cluster without DRAConsumableCapacity allocates the
            // device whole): the claim gets all that this node offers on it.
            let (memory, compute) = slice::offered(gpu, snap);
            return Ok(Want { memory, compute });
        };
        let get = |cap: &str| {
            cc.get(cap)
                .or_else(|| cc.get(&format!("{}/{cap}", self.cfg.driver)))
                .map(|q| quantity::parse(&q.0).map_err(|e| format!("consumedCapacity {cap}: {e}")))
                .transpose()
        };
        let memory = match get(MEMORY)? {
            Some(m) => {
                u64::try_from(m).map_err(|_| "consumedCapacity memory is too large".to_string())?
            }
            None => self.cfg.memory_default,
        };
        let compute = get(COMPUTE)?.unwrap_or(0);
        if compute > COMPUTE_WHOLE as u128 {
            return Err(format!(
                "consumedCapacity compute {compute} is more than a whole GPU ({COMPUTE_WHOLE})"
            ));
        }
        Ok(Want {
            memory,
            compute: compute as u64,
        })
    }

    async fn prepare_one(&self, c: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        let rc: ResourceClaim = self.claims.get(&c.namespace, &c.name).await?;
        let uid = rc.metadata.uid.as_deref().unwrap_or("");
        if uid != c.uid {
            return Err(format!(
                "the ResourceClaim {} has UID {uid:?}, the kubelet asked for {:?}: it was deleted \
                 and re-created; the pod needs to be re-created",
                c.label(),
                c.uid
            ));
        }
        let results: Vec<DeviceRequestAllocationResult> = rc
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.driver == self.cfg.driver)
            .collect();
        if results.is_empty() {
            return Err(format!(
                "the ResourceClaim has no device of driver {} allocated (status.allocation is \
                 empty: not scheduled yet?)",
                self.cfg.driver
            ));
        }
        let gpus = self.gpus();
        let snap = self.ledger.snapshot();
        let mut per_gpu: BTreeMap<String, (Gpu, Want)> = BTreeMap::new();
        let mut devices = Vec::new();
        for r in &results {
            if r.pool != self.cfg.node_name {
                return Err(format!(
                    "device {}/{} was allocated from pool {:?}, but this is node {:?}",
                    r.pool, r.device, r.pool, self.cfg.node_name
                ));
            }
            let Some(gpu) = gpus
                .iter()
                .find(|g| slice::device_name(&g.uuid) == r.device)
            else {
                let here: Vec<String> = gpus.iter().map(|g| slice::device_name(&g.uuid)).collect();
                return Err(format!(
                    "device {} is not on this node (GPUs here: {}); a stale allocation",
                    r.device,
                    here.join(", ")
                ));
            };
            let want = self.consumed(r, gpu, &snap)?;
            let e = per_gpu
                .entry(gpu.uuid.clone())
                .or_insert_with(|| (gpu.clone(), Want::default()));
            e.1.memory = e.1.memory.saturating_add(want.memory);
            e.1.compute += want.compute;
            let mut ids = vec![format!("{}={}", self.cfg.cdi_kind, slice_name(&c.uid))];
            ids.extend(self.nvidia_cdi_id(gpu));
            devices.push(PreparedDevice {
                request_names: vec![r.request.clone()],
                pool_name: r.pool.clone(),
                device_name: r.device.clone(),
                cdi_device_ids: ids,
            });
        }
        let name = slice_name(&c.uid);
        // Check everything before creating anything: a claim is prepared whole or not at all.
        let mut to_create = Vec::new();
        for (uuid, (gpu, want)) in &per_gpu {
            let ppm = want.compute.min(COMPUTE_WHOLE) * (PPM as u64 / COMPUTE_WHOLE);
            if let Some(s) = snap
                .slices
                .iter()
                .find(|s| s.name == name && &s.device_uuid == uuid && !s.private)
            {
                if s.memory_limit == Some(want.memory) && s.compute_share_ppm as u64 == ppm {
                    continue; // prepared before (a repeated call, or before a restart)
                }
                return Err(format!(
                    "slice {name} already exists on {uuid} with memory {}, compute {}, but the \
                     claim now asks for memory {}, compute {}: remove it with `gpuslice slice rm \
                     {name}` once its processes are gone",
                    s.memory_limit
                        .map(human_bytes)
                        .unwrap_or_else(|| "none".into()),
                    s.compute_share_ppm / 1000,
                    human_bytes(want.memory),
                    want.compute
                ));
            }
            let dev = snap
                .devices
                .iter()
                .find(|d| &d.uuid == uuid)
                .ok_or_else(|| {
                    if self.node {
                        format!(
                            "{uuid} is not registered in the node's policy: the gpuslice \
                             monitor registers the GPUs NVML shows it (is its container given \
                             the GPUs, NVIDIA_VISIBLE_DEVICES=all?); retried"
                        )
                    } else {
                        format!("{uuid} is not in the gpuslice ledger")
                    }
                })?;
            let avail = dev
                .memory_total
                .saturating_sub(dev.memory_reserved)
                .saturating_sub(dev.best_effort_used);
            if want.memory > avail {
                return Err(format!(
                    "memory {} requested on {} ({uuid}), {} available: the allocation is stale \
                     (memory was reserved on this GPU outside Kubernetes, or the ResourceSlice \
                     was out of date); nothing was created, delete and re-create the pod to \
                     schedule it again",
                    human_bytes(want.memory),
                    slice::device_name(uuid),
                    human_bytes(avail)
                ));
            }
            let avail_ppm = (PPM as u64).saturating_sub(dev.compute_reserved_ppm as u64);
            if ppm > avail_ppm {
                return Err(format!(
                    "compute {} requested on {} ({uuid}), {} available: the allocation is stale; \
                     nothing was created",
                    want.compute,
                    slice::device_name(uuid),
                    avail_ppm / 1000
                ));
            }
            to_create.push(OperatorSlice {
                name: name.clone(),
                device: gpu.uuid.clone(),
                memory: want.memory,
                compute_share_ppm: ppm as u32,
                compute_cap_ppm: PPM,
                claim: Some(c.label()),
            });
        }
        let secret = self.claim_secret(&name, &snap)?;
        let created_any = !to_create.is_empty();
        for spec in &to_create {
            if let Err(e) = self.create_slice(spec, secret.as_ref()) {
                let _ = self.remove_slice(&name);
                return Err(format!(
                    "creating slice {name} on {}: {e}; nothing was kept",
                    spec.device
                ));
            }
        }
        if let Err(e) = self.write_spec(&c.uid, secret.as_ref()) {
            if created_any {
                let _ = self.remove_slice(&name);
            }
            return Err(e);
        }
        Ok(devices)
    }

    /// Node mode: the join secret of claim slice `name` (docs/security.md). A claim prepared
    /// before (a repeated call, a plugin restart) keeps the secret its slice was made with,
    /// read from the monitor's root-only file; a new claim gets a new random one. Personal
    /// mode: none (one user; nothing to keep out).
    fn claim_secret(&self, name: &str, snap: &Snapshot) -> Result<Option<Secret>, String> {
        if !self.node {
            return Ok(None);
        }
        // Only the plugin (an operator) makes operator slices: a process slice of the name (a
        // squatter, on another GPU) must not make the claim's slice go without a secret.
        let exists = snap
            .slices
            .iter()
            .any(|s| s.name == name && s.operator_defined);
        if !exists {
            return Secret::generate().map(Some).map_err(|e| e.to_string());
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
            Err(e) => Err(format!(
                "reading slice {name}'s join secret: {e} (the plugin runs as root to read it)"
            )),
        }
    }

    fn write_spec(&self, uid: &str, secret: Option<&Secret>) -> Result<(), String> {
        let name = slice_name(uid);
        let mut env = vec![("GPUSLICE_SLICE".to_string(), name.clone())];
        if let Some(s) = secret {
            env.push((SECRET_VAR.to_string(), s.expose().to_string()));
        }
        let spec = gpuslice_ledger::cdi::spec(
            &self.cfg.cdi_kind,
            &name,
            &env,
            &self.cfg.library.to_string_lossy(),
            &self.cfg.runtime_dir.to_string_lossy(),
        );
        let text = serde_json::to_string_pretty(&spec).expect("a JSON value serializes") + "\n";
        let path = self.spec_path(uid);
        if std::fs::read(&path).is_ok_and(|b| b == text.as_bytes()) {
            return Ok(());
        }
        // A spec with a secret is root's alone (the container runtime reads it as root).
        let write = if secret.is_some() {
            gpuslice_ledger::cdi::write_private_atomically
        } else {
            gpuslice_ledger::cdi::write_atomically
        };
        std::fs::create_dir_all(&self.cfg.cdi_dir)
            .and_then(|()| write(&path, text.as_bytes()))
            .map_err(|e| format!("writing the CDI spec {}: {e}", path.display()))
    }

    fn unprepare_one(&self, c: &ClaimRef) -> Result<(), String> {
        let name = slice_name(&c.uid);
        // Processes that died are returned first, so a finished pod's slice is free to go
        // (personal mode; in node mode the monitor reaps, and its record says who lives).
        let _ = self.ledger.reap_dead();
        let snap = self.ledger.snapshot();
        let mine: Vec<_> = snap
            .slices
            .iter()
            .filter(|s| s.name == name && !s.private)
            .collect();
        let (live, mut pids) = if self.node {
            let indices: Vec<usize> = mine.iter().map(|s| s.index).collect();
            let pids = self.live_members(&indices);
            (pids.len() as u32, pids)
        } else {
            let live: u32 = mine.iter().map(|s| s.attached).sum();
            (
                live,
                mine.iter().flat_map(|s| s.pids.iter().copied()).collect(),
            )
        };
        if live > 0 {
            pids.sort_unstable();
            pids.dedup();
            return Err(format!(
                "slice {name} still has {live} live process(es) (pids {pids:?}): kept with its CDI \
                 spec, and retried when the kubelet calls again; if these are not the pod's own \
                 processes, end them"
            ));
        }
        let path = self.spec_path(&c.uid);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("removing the CDI spec {}: {e}", path.display())),
        }
        if mine.is_empty() {
            return Ok(());
        }
        // Node mode: a dead process the monitor has not reaped yet keeps the record until its
        // next tick; the monitor removes the slice then (it never yanks a live one).
        self.remove_slice(&name)
            .map_err(|e| format!("removing slice {name}: {e}"))
    }
}
